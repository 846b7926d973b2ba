// `moeserve bench-one-batch`: the engine without HTTP, one static batch at a time: the whole batch's prompts
// prefilled together, then decode steps until every sequence has its output; prefill latency, median decode
// step latency and tokens/s per batch size, and the decode step against its roofline floor: the ops of the
// first decode step (run op by op with a cost-only sink, left out of the medians) over the ceilings measured
// at start.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/engine_flags.h"
#include "cli/rank_processes.h"
#include "cli/synthetic_prompt.h"
#include "core/error.h"
#include "model/load_model.h"
#include "profiler/ceilings.h"
#include "profiler/floor.h"
#include "runtime/cuda/device_ceilings.h"
#include "runtime/engine.h"

namespace ms::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct OneBatchOptions {
  EngineFlags eng;
  std::string batch_sizes = "1,8,64";
  int input_len = 128, output_len = 32;
  bool json = false;
  bool no_roofline = false;
  std::string ceilings;  // MEM_GBPS,GFLOPS; empty: measured at start
};

struct OneBatchResult {
  int batch = 0, input_len = 0, output_len = 0, prefill_steps = 0, decode_steps = 0;
  double prefill_s = 0, decode_step_median_s = 0, total_s = 0;
  // Host side of a decode step (runtime::StepTimes), medians over the decode steps: waiting on the executor
  // (forward + logits back), sampling, the rest of Engine::step (scheduling, batch building, commit).
  double decode_executor_median_s = 0, decode_sample_median_s = 0, decode_other_median_s = 0;
  int64_t rows_summary = 0, rows_full = 0, rows_refetched = 0;  // over the decode steps
  // The first decode step's floor (0: not measured) and whether that step is out of the medians (it ran op by
  // op; it stays in when it is the only decode step).
  double decode_floor_s = 0;
  bool floor_step_excluded = false;
  double step_over_floor() const { return decode_floor_s > 0 ? decode_step_median_s / decode_floor_s : 0; }
  double prefill_tokens_per_s() const { return prefill_s > 0 ? batch * input_len / prefill_s : 0; }
  // Tokens of the whole batch per second at the median decode step.
  double decode_tokens_per_s() const { return decode_step_median_s > 0 ? batch / decode_step_median_s : 0; }
  double total_tokens_per_s() const {
    return total_s > 0 ? static_cast<double>(batch) * (input_len + output_len) / total_s : 0;
  }
};

std::vector<int> parse_batch_sizes(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int v = 0;
    try {
      size_t used = 0;
      v = std::stoi(item, &used);
      if (used != item.size()) v = 0;
    } catch (const std::exception&) {
      v = 0;
    }
    MS_CHECK(v >= 1, "--batch-size: '{}' is not a positive integer (expected a list such as 1,8,64)", item);
    out.push_back(v);
  }
  MS_CHECK(!out.empty(), "--batch-size: no batch size given");
  return out;
}

double median(std::vector<double>& v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// One engine serves the warm-up and every batch size, one batch after the other (so that rank processes,
// which follow one engine's steps, run them all): sized for the largest batch, whose prompts all fit one
// prefill step; no prefix cache, so every step computes what it is timed for.
runtime::EngineConfig engine_config(const model::LoadedModel& lm, const OneBatchOptions& o, int max_batch) {
  runtime::EngineConfig ec;
  ec.page_size = o.eng.page_size;
  ec.kv_cache_dtype = resolve_kv_dtype(o.eng, lm);
  const int64_t seq_pages = (o.input_len + o.output_len + o.eng.page_size - 1) / o.eng.page_size;
  ec.kv_cache_tokens = max_batch * seq_pages * o.eng.page_size;
  ec.max_running = max_batch;
  // The whole batch's prompts in one step: the prefill figure is one forward pass over all of them.
  ec.max_prefill_tokens = static_cast<int32_t>(int64_t{max_batch} * o.input_len);
  ec.enable_prefix_cache = false;
  ec.max_context = lm.model->config().max_position_embeddings;
  return ec;
}

// ceilings: where given, the first decode step runs with a FloorSink over them (its floor in the result).
OneBatchResult run_batch(runtime::Engine& engine, const model::LoadedModel& lm, const OneBatchOptions& o,
                         int batch, const profiler::Ceilings* ceilings = nullptr) {
  const io::ModelConfig& cfg = lm.model->config();
  MS_CHECK(!engine.has_work(), "bench-one-batch: the engine still has work before batch {}", batch);
  for (int s = 0; s < batch; ++s) {
    runtime::Request r;
    r.prompt_ids = synthetic_prompt(s, o.input_len, cfg.vocab_size);
    r.max_tokens = o.output_len;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.submit(std::move(r));
  }
  OneBatchResult res;
  res.batch = batch;
  res.input_len = o.input_len;
  res.output_len = o.output_len;
  std::vector<double> decode_steps, decode_exec, decode_sample, decode_other;
  int started = 0;
  std::optional<profiler::FloorSink> floor;
  const auto t0 = Clock::now();
  while (engine.has_work()) {
    // Every sequence has its first token: the next step decodes.
    const bool floor_step = ceilings != nullptr && !floor && started == batch;
    if (floor_step) {
      floor.emplace(*ceilings);
      engine.set_op_sink(&*floor);
    }
    const auto ts = Clock::now();
    std::vector<runtime::RequestOutput> outs;
    try {
      outs = engine.step();
    } catch (...) {
      engine.set_op_sink(nullptr);
      throw;
    }
    const double dt = std::chrono::duration<double>(Clock::now() - ts).count();
    if (floor_step) {
      engine.set_op_sink(nullptr);
      res.decode_floor_s = floor->floor_us() * 1e-6;
    }
    bool prefill_step = false;
    for (const auto& out : outs) {
      if (out.finish == runtime::FinishReason::Error)
        MS_THROW("batch {}: the engine failed: {}", batch, out.error);
      if (out.completion_tokens == 1 && !out.tokens.empty()) {
        ++started;
        prefill_step = true;
      }
    }
    if (started < batch || prefill_step) {
      ++res.prefill_steps;
      if (started == batch) res.prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    } else if (floor_step && o.output_len > 2) {
      // It ran op by op: out of the medians unless it is the only decode step.
      res.floor_step_excluded = true;
      ++res.decode_steps;
    } else {
      decode_steps.push_back(dt);
      const runtime::StepTimes& st = engine.last_step_times();
      decode_exec.push_back(st.executor_s);
      decode_sample.push_back(st.sample_s);
      decode_other.push_back(st.other_s());
      res.rows_summary += st.rows_summary;
      res.rows_full += st.rows_full;
      res.rows_refetched += st.rows_refetched;
    }
  }
  res.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  res.decode_steps += static_cast<int>(decode_steps.size());
  res.decode_step_median_s = median(decode_steps);
  res.decode_executor_median_s = median(decode_exec);
  res.decode_sample_median_s = median(decode_sample);
  res.decode_other_median_s = median(decode_other);
  return res;
}

int run_bench_one_batch(const OneBatchOptions& o) {
  MS_CHECK(o.input_len >= 1, "--input-len must be at least 1, got {}", o.input_len);
  MS_CHECK(o.output_len >= 1, "--output-len must be at least 1, got {}", o.output_len);
  MS_CHECK(o.eng.page_size >= 1, "--page-size must be at least 1, got {}", o.eng.page_size);
  const std::vector<int> batches = parse_batch_sizes(o.batch_sizes);
  model::LoadedModel lm = load_engine_model(o.eng);
  const int64_t ctx = lm.model->config().max_position_embeddings;
  MS_CHECK(o.input_len + o.output_len <= ctx,
           "--input-len {} + --output-len {} is past the model's context of {}", o.input_len, o.output_len,
           ctx);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  // Warm-up: first touches of the weights and the thread pool, not timed.
  OneBatchOptions warm = o;
  warm.batch_sizes = "1";
  warm.input_len = std::min(o.input_len, 16);
  warm.output_len = 2;
  warm.json = false;
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  // The ceilings of the roofline, before the engine takes its memory.
  std::optional<profiler::Ceilings> ceilings;
  if (!o.no_roofline) {
    if (!o.ceilings.empty()) {
      ceilings = profiler::parse_ceilings(o.ceilings);
    } else if (resolve_device(o.eng.dev) == "cuda") {
      std::fprintf(stderr, "measuring the ceilings of this GPU (copy bandwidth, bf16 matrix rate)...\n");
      ceilings = runtime::cuda::measure_device_ceilings();
    } else {
      std::fprintf(stderr, "measuring the ceilings of this machine...\n");
      ceilings = profiler::measure_ceilings();
    }
  }
  runtime::EngineConfig ec = engine_config(lm, o, max_batch);
  apply_expert_recording(o.eng.eplb, ec);  // the warm-up's steps are counted too
  auto engine = make_engine(lm, ec, o.eng.dev);
  run_batch(*engine, lm, warm, 1);
  std::vector<OneBatchResult> results;
  for (int b : batches) {
    results.push_back(run_batch(*engine, lm, o, b, ceilings ? &*ceilings : nullptr));
    const auto& r = results.back();
    if (!o.json) std::fprintf(stderr, "batch %d done in %.2f s\n", b, r.total_s);
  }
  save_expert_distribution(o.eng.eplb, *engine);
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : results)
      j.push_back({{"batch_size", r.batch},
                   {"input_len", r.input_len},
                   {"output_len", r.output_len},
                   {"prefill_latency_s", r.prefill_s},
                   {"prefill_steps", r.prefill_steps},
                   {"prefill_tokens_per_s", r.prefill_tokens_per_s()},
                   {"decode_steps", r.decode_steps},
                   {"median_decode_step_s", r.decode_step_median_s},
                   {"decode_tokens_per_s", r.decode_tokens_per_s()},
                   {"total_latency_s", r.total_s},
                   {"total_tokens_per_s", r.total_tokens_per_s()},
                   {"median_decode_executor_s", r.decode_executor_median_s},
                   {"median_decode_sample_s", r.decode_sample_median_s},
                   {"median_decode_other_s", r.decode_other_median_s},
                   {"decode_rows_summary", r.rows_summary},
                   {"decode_rows_full", r.rows_full},
                   {"decode_rows_refetched", r.rows_refetched},
                   {"decode_floor_s", r.decode_floor_s},
                   {"decode_step_over_floor", r.step_over_floor()},
                   {"floor_step_excluded", r.floor_step_excluded}});
    nlohmann::json top = {{"model", lm.description}, {"results", j}};
    if (ceilings)
      top["ceilings"] = {{"mem_gbps", ceilings->mem_gbps},
                         {"matrix_gflops", ceilings->matrix_gflops},
                         {"source", ceilings->source}};
    std::printf("%s\n", top.dump(2).c_str());
    return 0;
  }
  if (ceilings)
    std::printf(
        "ceilings (%s): memory %.1f GB/s, matrix %.1f GFLOP/s; floor: the ops of the first decode step "
        "at these ceilings (that step runs op by op and is left out of the medians)\n\n",
        ceilings->source.c_str(), ceilings->mem_gbps, ceilings->matrix_gflops);
  std::printf("%6s %6s %6s  %12s %14s  %16s %13s  %10s  %10s %8s\n", "batch", "input", "output",
              "prefill (ms)", "prefill tok/s", "decode step (ms)", "decode tok/s", "total (s)", "floor (ms)",
              "x floor");
  for (const auto& r : results) {
    const std::string floor_ms = r.decode_floor_s > 0 ? fmt::format("{:.3f}", r.decode_floor_s * 1e3) : "-";
    const std::string over = r.step_over_floor() > 0 ? fmt::format("{:.2f}x", r.step_over_floor()) : "-";
    std::printf("%6d %6d %6d  %12.2f %14.1f  %16.3f %13.1f  %10.3f  %10s %8s\n", r.batch, r.input_len,
                r.output_len, r.prefill_s * 1e3, r.prefill_tokens_per_s(), r.decode_step_median_s * 1e3,
                r.decode_tokens_per_s(), r.total_s, floor_ms.c_str(), over.c_str());
  }
  std::printf(
      "\nhost side of a decode step (medians, ms): waiting on the executor / sampling / rest of the step\n");
  for (const auto& r : results)
    std::printf("%6d  %8.3f / %8.3f / %8.3f   rows: %lld from summaries, %lld full, %lld refetched\n",
                r.batch, r.decode_executor_median_s * 1e3, r.decode_sample_median_s * 1e3,
                r.decode_other_median_s * 1e3, static_cast<long long>(r.rows_summary),
                static_cast<long long>(r.rows_full), static_cast<long long>(r.rows_refetched));
  return 0;
}

Registration reg(
    "bench-one-batch",
    "Time the engine without HTTP: prefill latency, median decode step and tokens/s per batch size",
    [](CLI::App& sub) {
      auto o = std::make_shared<OneBatchOptions>();
      add_engine_flags(sub, o->eng, engine_flag::kCommon | engine_flag::kLoadFormat);
      sub.add_option("--batch-size", o->batch_sizes, "Batch sizes, comma-separated")->capture_default_str();
      sub.add_option("--input-len", o->input_len, "Prompt tokens per sequence")->capture_default_str();
      sub.add_option("--output-len", o->output_len, "Generated tokens per sequence")->capture_default_str();
      sub.add_flag("--json", o->json, "Print the results as JSON on stdout");
      sub.add_option("--ceilings", o->ceilings,
                     "Ceilings of the step floor, MEM_GBPS,GFLOPS (e.g. 4245,790000), instead of measuring "
                     "them at start");
      sub.add_flag("--no-roofline", o->no_roofline,
                   "No step floor: no ceilings measured, every decode step timed as it runs (by default the "
                   "first decode step of each batch runs op by op to sum its ops' floors, and is left out of "
                   "the medians; the total time includes it)");
      return [o]() { return run_bench_one_batch(*o); };
    });

}  // namespace

}  // namespace ms::cli
