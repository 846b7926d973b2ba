// `moeserve bench --base-url URL`: load generator against an OpenAI-compatible server, with a concurrency
// sweep and results as a table, JSON, CSV and a plot.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "loadgen/load_generator.h"
#include "loadgen/plot.h"

namespace {

std::vector<int> parse_sweep(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return {0};
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int v = std::stoi(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      MS_THROW("--max-concurrency: '{}' is not a positive integer (expected e.g. 1,2,4,8)", item);
    }
  }
  return out;
}

ms::cli::Registration reg(
    "bench", "Benchmark an OpenAI-compatible server: TTFT, ITL, TPOT, E2E, throughput", [](CLI::App& sub) {
      auto cfg = std::make_shared<ms::loadgen::BenchConfig>();
      auto sweep = std::make_shared<std::string>();
      auto endpoint = std::make_shared<std::string>("completions");
      auto out_json = std::make_shared<std::string>();
      auto out_csv = std::make_shared<std::string>();
      auto plot = std::make_shared<std::string>();
      auto no_progress = std::make_shared<bool>(false);
      sub.add_option("--base-url", cfg->base_url, "Server to load, e.g. http://127.0.0.1:30000")->required();
      sub.add_option("--endpoint", *endpoint, "completions (token-id prompts) or chat")
          ->check(CLI::IsMember({"completions", "chat"}))
          ->capture_default_str();
      sub.add_option("--model", cfg->model, "Model name to send (default: the server's first model)");
      sub.add_option("--api-key", cfg->api_key, "Bearer token for the server");
      sub.add_option("--num-prompts", cfg->num_prompts, "Requests per setting")->capture_default_str();
      sub.add_option("--input-len", cfg->input_len, "Prompt tokens (maximum with --range-ratio)")
          ->capture_default_str();
      sub.add_option("--output-len", cfg->output_len, "Output tokens (maximum with --range-ratio)")
          ->capture_default_str();
      sub.add_option("--range-ratio", cfg->range_ratio, "Lengths are uniform in [len * ratio, len]")
          ->capture_default_str();
      sub.add_option("--request-rate", cfg->request_rate,
                     "Requests per second, Poisson arrivals (default inf: all at once)");
      sub.add_option("--max-concurrency", *sweep, "Requests in flight at most; a list (1,2,4,...) sweeps");
      sub.add_option("--seed", cfg->seed, "Random seed of prompts and arrivals")->capture_default_str();
      sub.add_option("--request-timeout", cfg->request_timeout_s, "Seconds per request")
          ->capture_default_str();
      sub.add_option("--duration", cfg->duration_s,
                     "Seconds: stop sending new requests after this long (0: off)")
          ->capture_default_str();
      sub.add_option("--output-json", *out_json, "Write every setting's results as JSON");
      sub.add_option("--output-csv", *out_csv, "Write every setting's results as CSV");
      sub.add_option("--plot", *plot,
                     "Draw output throughput against per-user tokens/s over the sweep (PNG, gnuplot)");
      sub.add_flag("--disable-progress", *no_progress, "No progress bar");
      return [=]() -> int {
        cfg->chat = *endpoint == "chat";
        cfg->progress = !*no_progress;
        std::vector<ms::loadgen::BenchSummary> all;
        for (int c : parse_sweep(*sweep)) {
          auto run = *cfg;
          run.max_concurrency = c;
          all.push_back(ms::loadgen::run_bench(run));
          std::fputs(ms::loadgen::format_summary(all.back()).c_str(), stdout);
          std::fflush(stdout);
        }
        if (!out_json->empty()) {
          nlohmann::json j = {{"base_url", cfg->base_url},         {"endpoint", *endpoint},
                              {"num_prompts", cfg->num_prompts},   {"input_len", cfg->input_len},
                              {"output_len", cfg->output_len},     {"range_ratio", cfg->range_ratio},
                              {"results", nlohmann::json::array()}};
          for (const auto& s : all) j["results"].push_back(ms::loadgen::summary_json(s));
          std::ofstream f(*out_json);
          MS_CHECK(f.good(), "--output-json: cannot write {}", *out_json);
          f << j.dump(2) << "\n";
        }
        if (!out_csv->empty()) {
          std::ofstream f(*out_csv);
          MS_CHECK(f.good(), "--output-csv: cannot write {}", *out_csv);
          f << ms::loadgen::csv_header();
          for (const auto& s : all) f << ms::loadgen::csv_row(s);
        }
        if (!plot->empty()) ms::loadgen::plot_sweep(all, *plot);
        int failed = 0;
        for (const auto& s : all) failed += s.failed;
        return failed ? 2 : 0;
      };
    });

}  // namespace
