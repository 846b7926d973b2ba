#include "loadgen/load_generator.h"

#include <httplib.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/progress.h"

namespace ms::loadgen {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::unique_ptr<httplib::Client> make_client(const BenchConfig& c) {
  auto cli = std::make_unique<httplib::Client>(c.base_url);
  MS_CHECK(cli->is_valid(), "--base-url: cannot use '{}' (expected http://host:port)", c.base_url);
  const auto t = static_cast<time_t>(c.request_timeout_s);
  cli->set_read_timeout(t, 0);
  cli->set_write_timeout(t, 0);
  cli->set_connection_timeout(10, 0);
  cli->set_keep_alive(true);
  cli->set_tcp_nodelay(true);
  if (!c.api_key.empty()) cli->set_bearer_token_auth(c.api_key);
  return cli;
}

struct ServerInfo {
  std::string model;
  int64_t vocab_size = 256;
};

// GET /metrics, parsed for the engine's loop counters (a server without them: ok = false).
EngineLoopCounters scrape_engine_counters(const BenchConfig& c) {
  auto cli = make_client(c);
  auto r = cli->Get("/metrics");
  if (!r || r->status != 200) return {};
  return parse_engine_counters(r->body);
}

ServerInfo query_server(const BenchConfig& c) {
  auto cli = make_client(c);
  auto r = cli->Get("/v1/models");
  if (!r) MS_THROW("--base-url: cannot reach {}: {}", c.base_url, httplib::to_string(r.error()));
  if (r->status != 200) MS_THROW("--base-url: GET /v1/models answered {}: {}", r->status, r->body);
  ServerInfo info;
  try {
    auto j = json::parse(r->body);
    const auto& m = j.at("data").at(0);
    info.model = m.at("id").get<std::string>();
    if (m.contains("vocab_size") && m["vocab_size"].is_number_integer()) info.vocab_size = m["vocab_size"];
  } catch (const std::exception& e) {
    MS_THROW("--base-url: unexpected /v1/models answer ({}): {}", e.what(), r->body.substr(0, 200));
  }
  if (!c.model.empty()) info.model = c.model;
  return info;
}

struct Job {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
};

std::vector<Job> make_jobs(const BenchConfig& c, int64_t vocab) {
  MS_CHECK(c.num_prompts > 0, "--num-prompts must be > 0, got {}", c.num_prompts);
  MS_CHECK(c.input_len > 0 && c.output_len > 0, "--input-len and --output-len must be > 0");
  MS_CHECK(c.range_ratio > 0 && c.range_ratio <= 1, "--range-ratio must be in (0, 1], got {}", c.range_ratio);
  std::mt19937_64 rng(c.seed);
  auto length = [&](int len) {
    const int lo = std::max(1, static_cast<int>(std::floor(len * c.range_ratio)));
    return std::uniform_int_distribution<int>(lo, len)(rng);
  };
  // Token ids away from the start of the vocabulary (where special and control tokens tend to sit).
  const int64_t first = vocab > 1024 ? 1000 : 0;
  std::uniform_int_distribution<int64_t> token(first, vocab - 1);
  std::vector<Job> jobs(static_cast<size_t>(c.num_prompts));
  for (auto& j : jobs) {
    j.prompt.resize(static_cast<size_t>(length(c.input_len)));
    for (auto& t : j.prompt) t = static_cast<int32_t>(token(rng));
    j.max_tokens = length(c.output_len);
  }
  return jobs;
}

RequestResult send_one(httplib::Client& cli, const BenchConfig& c, const std::string& model, const Job& job,
                       const std::function<std::string(const std::vector<int32_t>&)>& as_text) {
  RequestResult res;
  res.prompt_tokens = static_cast<int>(job.prompt.size());
  json body = {{"model", model},   {"max_tokens", job.max_tokens},
               {"temperature", 0}, {"ignore_eos", true},
               {"stream", true},   {"stream_options", {{"include_usage", true}}}};
  if (c.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", as_text(job.prompt)}}});
  } else {
    body["prompt"] = job.prompt;
  }
  httplib::Request req;
  req.method = "POST";
  req.path = c.chat ? "/v1/chat/completions" : "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!c.api_key.empty()) req.set_header("Authorization", "Bearer " + c.api_key);
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  int chunks_with_text = 0, usage_tokens = -1;
  std::string buf, error_body;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      ev.erase(0, 6);
      if (ev == "[DONE]") continue;
      json j = json::parse(ev, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        error_body = ev;
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object())
        usage_tokens = j["usage"].value("completion_tokens", -1);
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const auto& ch = j["choices"][0];
      const bool has_text = c.chat
                                ? (ch.contains("delta") &&
                                   ((ch["delta"].contains("content") && ch["delta"]["content"].is_string() &&
                                     !ch["delta"]["content"].get_ref<const std::string&>().empty()) ||
                                    ch["delta"].contains("reasoning_content")))
                                : (ch.contains("text") && !ch["text"].get_ref<const std::string&>().empty());
      const bool any = has_text || (ch.contains("logprobs") && !ch["logprobs"].is_null());
      // A token that decodes to no text yet still arrives as a chunk; count chunks, not characters.
      if (!has_text && !any) continue;
      const auto now = Clock::now();
      if (first) {
        res.ttft_s = std::chrono::duration<double>(now - start).count();
        first = false;
      } else {
        res.itl_s.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      ++chunks_with_text;
    }
    return true;
  };
  std::string resp_body;
  auto r = cli.send(req);
  res.e2e_s = seconds_since(start);
  if (!r) {
    res.error = "connection: " + httplib::to_string(r.error());
    return res;
  }
  if (r->status != 200) {
    res.error = fmt::format("HTTP {}: {}", r->status, buf.substr(0, 300));
    return res;
  }
  if (!error_body.empty()) {
    res.error = "stream error: " + error_body.substr(0, 300);
    return res;
  }
  res.output_tokens = usage_tokens >= 0 ? usage_tokens : chunks_with_text;
  res.ok = !first;
  if (!res.ok) res.error = "no tokens in the stream";
  return res;
}

}  // namespace

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

Percentiles summarize_ms(const std::vector<double>& seconds) {
  Percentiles p;
  if (seconds.empty()) return p;
  std::vector<double> ms(seconds.size());
  std::transform(seconds.begin(), seconds.end(), ms.begin(), [](double s) { return s * 1e3; });
  p.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  p.median = percentile(ms, 0.5);
  p.p99 = percentile(ms, 0.99);
  return p;
}

BenchSummary summarize(const std::vector<RequestResult>& results, double duration_s, int max_concurrency,
                       double request_rate) {
  BenchSummary s;
  s.max_concurrency = max_concurrency;
  s.request_rate = request_rate;
  s.duration_s = duration_s;
  std::vector<double> ttft, itl, tpot, e2e;
  double per_user = 0;
  int per_user_n = 0;
  for (const auto& r : results) {
    if (!r.ok) {
      ++s.failed;
      if (s.errors.size() < 5) s.errors.push_back(r.error);
      continue;
    }
    ++s.completed;
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    if (r.output_tokens > 1 && r.e2e_s > r.ttft_s) {
      const double t = (r.e2e_s - r.ttft_s) / (r.output_tokens - 1);
      tpot.push_back(t);
      per_user += 1.0 / t;
      ++per_user_n;
    }
  }
  if (duration_s > 0) {
    s.request_throughput = s.completed / duration_s;
    s.output_throughput = static_cast<double>(s.output_tokens) / duration_s;
    s.total_token_throughput = static_cast<double>(s.input_tokens + s.output_tokens) / duration_s;
  }
  s.per_user_output_tokens_per_s = per_user_n ? per_user / per_user_n : 0;
  s.ttft_ms = summarize_ms(ttft);
  s.itl_ms = summarize_ms(itl);
  s.tpot_ms = summarize_ms(tpot);
  s.e2e_ms = summarize_ms(e2e);
  return s;
}

BenchSummary run_bench(const BenchConfig& c) {
  const ServerInfo info = query_server(c);
  const auto jobs = make_jobs(c, info.vocab_size);
  MS_CHECK(c.request_rate > 0, "--request-rate must be > 0, got {}", c.request_rate);
  MS_CHECK(c.max_concurrency >= 0, "--max-concurrency must be >= 0, got {}", c.max_concurrency);
  // Chat prompts are text: ids become words the server's tokenizer turns into roughly one token each.
  auto as_text = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += fmt::format(" w{}", id % 1000);
    return s;
  };

  const int limit = c.max_concurrency > 0 ? c.max_concurrency : c.num_prompts;
  const EngineLoopCounters before = scrape_engine_counters(c);
  std::vector<RequestResult> results(jobs.size());
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  ProgressBar bar(
      fmt::format("bench c={}", c.max_concurrency > 0 ? std::to_string(c.max_concurrency) : "inf"),
      static_cast<int64_t>(jobs.size()), "req");
  std::mt19937_64 rng(c.seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(std::isinf(c.request_rate) ? 1.0 : c.request_rate);

  // One client (keep-alive connection) per concurrent slot, reused by the requests that take the slot.
  std::vector<std::unique_ptr<httplib::Client>> clients;
  std::vector<int> free_clients;
  for (int i = 0; i < std::min<int>(limit, static_cast<int>(jobs.size())); ++i) {
    clients.push_back(make_client(c));
    free_clients.push_back(i);
  }
  std::vector<std::thread> threads;
  threads.reserve(jobs.size());
  const auto start = Clock::now();
  auto next_arrival = start;
  size_t launched = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (c.duration_s > 0 && seconds_since(start) >= c.duration_s) break;
    if (!std::isinf(c.request_rate)) {
      next_arrival += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
      std::this_thread::sleep_until(next_arrival);
    }
    int slot;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return in_flight < limit && !free_clients.empty(); });
      ++in_flight;
      slot = free_clients.back();
      free_clients.pop_back();
    }
    ++launched;
    threads.emplace_back([&, i, slot] {
      RequestResult r;
      try {
        r = send_one(*clients[static_cast<size_t>(slot)], c, info.model, jobs[i], as_text);
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      std::lock_guard lock(mu);
      results[i] = std::move(r);
      --in_flight;
      free_clients.push_back(slot);
      bar.advance();
      cv.notify_all();
    });
  }
  for (auto& t : threads) t.join();
  bar.finish();
  results.resize(launched);
  BenchSummary s = summarize(results, seconds_since(start), c.max_concurrency, c.request_rate);
  const EngineLoopCounters after = before.ok ? scrape_engine_counters(c) : EngineLoopCounters{};
  if (after.ok && after.steps >= before.steps) {
    s.engine_steps = static_cast<int64_t>(after.steps - before.steps);
    const double loop = (after.step_s - before.step_s) + (after.gap_s - before.gap_s);
    s.engine_host_share = loop > 0 ? 1.0 - (after.executor_s - before.executor_s) / loop : 0.0;
  }
  return s;
}

EngineLoopCounters parse_engine_counters(const std::string& text) {
  EngineLoopCounters e;
  int found = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const std::string name = line.substr(0, sp);
    double* dst = name == "moeserve_engine_steps_total"              ? &e.steps
                  : name == "moeserve_engine_step_seconds_total"     ? &e.step_s
                  : name == "moeserve_engine_executor_seconds_total" ? &e.executor_s
                  : name == "moeserve_engine_gap_seconds_total"      ? &e.gap_s
                                                                     : nullptr;
    if (!dst) continue;
    try {
      *dst = std::stod(line.substr(sp + 1));
      ++found;
    } catch (const std::exception&) {
      return {};
    }
  }
  e.ok = found == 4;
  return e;
}

std::string format_summary(const BenchSummary& s) {
  std::string out;
  auto line = [&](const std::string& k, const std::string& v) { out += fmt::format("{:<40}{:>14}\n", k, v); };
  out += fmt::format("{:=^54}\n", " Serving Benchmark Result ");
  line("Max concurrency:", s.max_concurrency ? std::to_string(s.max_concurrency) : "inf");
  line("Request rate (req/s):", std::isinf(s.request_rate) ? "inf" : fmt::format("{:.2f}", s.request_rate));
  line("Successful requests:", std::to_string(s.completed));
  line("Failed requests:", std::to_string(s.failed));
  line("Benchmark duration (s):", fmt::format("{:.2f}", s.duration_s));
  line("Total input tokens:", std::to_string(s.input_tokens));
  line("Total generated tokens:", std::to_string(s.output_tokens));
  line("Request throughput (req/s):", fmt::format("{:.2f}", s.request_throughput));
  line("Output token throughput (tok/s):", fmt::format("{:.2f}", s.output_throughput));
  line("Total token throughput (tok/s):", fmt::format("{:.2f}", s.total_token_throughput));
  line("Per-user output speed (tok/s):", fmt::format("{:.2f}", s.per_user_output_tokens_per_s));
  auto block = [&](const char* title, const char* key, const Percentiles& p) {
    out += fmt::format("{:-^54}\n", fmt::format(" {} ", title));
    line(fmt::format("Mean {} (ms):", key), fmt::format("{:.2f}", p.mean));
    line(fmt::format("Median {} (ms):", key), fmt::format("{:.2f}", p.median));
    line(fmt::format("P99 {} (ms):", key), fmt::format("{:.2f}", p.p99));
  };
  block("Time to First Token", "TTFT", s.ttft_ms);
  block("Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms);
  block("Inter-token Latency", "ITL", s.itl_ms);
  block("End-to-end Latency", "E2E", s.e2e_ms);
  if (s.engine_steps >= 0) {
    out += fmt::format("{:-^54}\n", " Engine loop (server's /metrics) ");
    line("Engine steps:", std::to_string(s.engine_steps));
    line("Host share of the busy loop (%):", fmt::format("{:.2f}", 100.0 * s.engine_host_share));
  }
  out += std::string(54, '=') + "\n";
  for (const auto& e : s.errors) out += "error: " + e + "\n";
  return out;
}

nlohmann::json summary_json(const BenchSummary& s) {
  auto p = [](const Percentiles& x) { return json{{"mean", x.mean}, {"median", x.median}, {"p99", x.p99}}; };
  return {{"max_concurrency", s.max_concurrency},
          {"request_rate", std::isinf(s.request_rate) ? json("inf") : json(s.request_rate)},
          {"completed", s.completed},
          {"failed", s.failed},
          {"duration_s", s.duration_s},
          {"input_tokens", s.input_tokens},
          {"output_tokens", s.output_tokens},
          {"request_throughput", s.request_throughput},
          {"output_throughput", s.output_throughput},
          {"total_token_throughput", s.total_token_throughput},
          {"per_user_output_tokens_per_s", s.per_user_output_tokens_per_s},
          {"ttft_ms", p(s.ttft_ms)},
          {"tpot_ms", p(s.tpot_ms)},
          {"itl_ms", p(s.itl_ms)},
          {"e2e_ms", p(s.e2e_ms)},
          {"engine_steps", s.engine_steps},
          {"engine_host_share", s.engine_steps >= 0 ? json(s.engine_host_share) : json(nullptr)},
          {"errors", s.errors}};
}

std::string csv_header() {
  return "max_concurrency,request_rate,completed,failed,duration_s,input_tokens,output_tokens,request_"
         "throughput,"
         "output_throughput,total_token_throughput,per_user_output_tokens_per_s,ttft_mean_ms,ttft_median_ms,"
         "ttft_p99_ms,tpot_mean_ms,tpot_median_ms,tpot_p99_ms,itl_mean_ms,itl_median_ms,itl_p99_ms,e2e_mean_"
         "ms,"
         "e2e_median_ms,e2e_p99_ms,engine_steps,engine_host_share\n";
}

std::string csv_row(const BenchSummary& s) {
  auto p = [](const Percentiles& x) { return fmt::format("{:.3f},{:.3f},{:.3f}", x.mean, x.median, x.p99); };
  // The engine columns are empty where the server does not export moeserve's engine counters.
  const std::string engine =
      s.engine_steps >= 0 ? fmt::format("{},{:.4f}", s.engine_steps, s.engine_host_share) : std::string(",");
  return fmt::format(
      "{},{},{},{},{:.3f},{},{},{:.4f},{:.3f},{:.3f},{:.3f},{},{},{},{},{}\n", s.max_concurrency,
      std::isinf(s.request_rate) ? std::string("inf") : fmt::format("{}", s.request_rate), s.completed,
      s.failed, s.duration_s, s.input_tokens, s.output_tokens, s.request_throughput, s.output_throughput,
      s.total_token_throughput, s.per_user_output_tokens_per_s, p(s.ttft_ms), p(s.tpot_ms), p(s.itl_ms),
      p(s.e2e_ms), engine);
}

}  // namespace ms::loadgen
