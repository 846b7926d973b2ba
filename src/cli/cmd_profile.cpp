// `moeserve profile`: fills a batch of sequences to a context length, then times decode steps op by op
// against the roofline of this machine (and, on request, one prefill step), through the same
// ProfileController the server uses for live traffic.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/engine_flags.h"
#include "cli/synthetic_prompt.h"
#include "core/error.h"
#include "model/load_model.h"
#include "profiler/profile_controller.h"
#include "profiler/report.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/device_ceilings.h"
#include "runtime/engine.h"

namespace ms::cli {

namespace {

struct ProfileCliOptions {
  EngineFlags eng;
  std::string trace, ceilings;
  int batch = 1, context = 128, steps = 10, warmup = 2, prefill_tokens = 0;
  bool per_layer = false, json = false;
};

int64_t round_up(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

// "trace.json" -> "trace.prefill.json"
std::string prefill_trace_path(const std::string& path) {
  std::filesystem::path p(path);
  std::string ext = p.extension().string();
  p.replace_extension();
  return p.string() + ".prefill" + (ext.empty() ? ".json" : ext);
}

int run_profile(const ProfileCliOptions& o) {
  MS_CHECK(o.batch >= 1, "--batch must be at least 1, got {}", o.batch);
  MS_CHECK(o.context >= 1, "--context must be at least 1, got {}", o.context);
  MS_CHECK(o.steps >= 1, "--steps must be at least 1, got {}", o.steps);
  MS_CHECK(o.warmup >= 0, "--warmup must be >= 0, got {}", o.warmup);
  MS_CHECK(o.prefill_tokens >= 0, "--prefill-tokens must be >= 0, got {}", o.prefill_tokens);
  MS_CHECK(o.eng.page_size >= 1, "--page-size must be at least 1, got {}", o.eng.page_size);
  MS_CHECK(o.eng.kv_cache_tokens >= 0, "--kv-cache-tokens must be >= 0, got {}", o.eng.kv_cache_tokens);

  model::LoadedModel lm = load_engine_model(o.eng);
  const io::ModelConfig& cfg = lm.model->config();
  // Each sequence: `context` prompt tokens, its first token from the prefill, then warm-up + timed decodes.
  const int max_tokens = 1 + o.warmup + o.steps;
  const int64_t seq_tokens = static_cast<int64_t>(o.context) + max_tokens;
  MS_CHECK(seq_tokens <= cfg.max_position_embeddings && o.prefill_tokens < cfg.max_position_embeddings,
           "--context {} + {} decode steps (or --prefill-tokens {}) is past the model's context of {}",
           o.context, max_tokens, o.prefill_tokens, cfg.max_position_embeddings);

  const bool gpu = resolve_device(o.eng.dev) == "cuda";
  profiler::Ceilings ceilings;
  if (!o.ceilings.empty()) {
    ceilings = profiler::parse_ceilings(o.ceilings);
  } else if (gpu) {
    std::fprintf(stderr, "measuring the ceilings of this GPU (copy bandwidth, bf16 matrix rate)...\n");
    ceilings = runtime::cuda::measure_device_ceilings();
  } else {
    std::fprintf(stderr, "measuring the ceilings of this machine...\n");
    ceilings = profiler::measure_ceilings();
  }

  runtime::EngineConfig ec;
  ec.page_size = o.eng.page_size;
  ec.kv_cache_dtype = resolve_kv_dtype(o.eng, lm);
  const int64_t needed =
      o.batch * round_up(seq_tokens, o.eng.page_size) + round_up(o.prefill_tokens + 1, o.eng.page_size);
  // A pool the size a server would have (EngineConfig's default) unless asked otherwise: ops that touch the
  // whole pool instead of the batch's pages show up as they would in serving.
  ec.kv_cache_tokens =
      std::max(o.eng.kv_cache_tokens > 0 ? o.eng.kv_cache_tokens : ec.kv_cache_tokens, needed);
  ec.max_running = o.batch;
  // The whole batch prefilled in one step when it fits, so every sequence starts decoding together.
  constexpr int64_t kMaxPrefillStep = 65536;
  const int64_t fill = std::min<int64_t>(static_cast<int64_t>(o.batch) * o.context, kMaxPrefillStep);
  ec.max_prefill_tokens = static_cast<int32_t>(std::max<int64_t>({fill, o.prefill_tokens, o.batch}));
  ec.max_context = cfg.max_position_embeddings;
  apply_expert_recording(o.eng.eplb, ec);
  auto engine_ptr = make_engine(lm, ec, o.eng.dev);
  runtime::Engine& engine = *engine_ptr;

  profiler::ProfileControllerOptions pco{ceilings, {}, {}};
  // On the GPU, ops are timed with CUDA events on the executor's stream (profiled steps run without graphs).
  if (engine.executor().make_timer()) {
    const runtime::Executor* ex = &engine.executor();
    pco.make_timer = [ex] { return ex->make_timer(); };
  }
  profiler::ProfileController ctl(pco);
  engine.set_step_hook(&ctl);

  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  std::fprintf(stderr, "filling %d sequences to %d tokens (KV cache %s, %lld tokens)...\n", o.batch,
               o.context, std::string(kv::kv_cache_dtype_name(engine.kv_capacity().dtype)).c_str(),
               static_cast<long long>(ec.kv_cache_tokens));
  for (int s = 0; s < o.batch; ++s) {
    runtime::Request r;
    r.prompt_ids = synthetic_prompt(s, o.context, cfg.vocab_size);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.submit(std::move(r));
  }
  const auto t0 = std::chrono::steady_clock::now();
  int started = 0, fill_steps = 0;
  while (started < o.batch && engine.has_work()) {
    for (const auto& out : engine.step()) {
      if (out.finish == runtime::FinishReason::Error) MS_THROW("prefill failed: {}", out.error);
      if (out.completion_tokens == 1 && !out.tokens.empty()) ++started;
    }
    ++fill_steps;
  }
  const double fill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "filled in %d steps, %.3f s (untimed)\n", fill_steps, fill_s);

  const auto group = o.per_layer ? profiler::GroupBy::Name : profiler::GroupBy::Kind;
  ctl.start({o.steps, o.warmup, o.trace, group, {}});
  while (!ctl.done() && engine.has_work())
    for (const auto& out : engine.step())
      if (out.finish == runtime::FinishReason::Error) MS_THROW("decode step failed: {}", out.error);
  profiler::ProfileResult decode = ctl.stop();
  if (decode.summary.steps < o.steps)
    std::fprintf(stderr, "warning: only %d of %d decode steps were recorded\n", decode.summary.steps,
                 o.steps);
  if (!decode.step_error.empty()) std::fprintf(stderr, "warning: %s\n", decode.step_error.c_str());

  std::optional<profiler::ProfileResult> prefill;
  if (o.prefill_tokens > 0) {
    while (engine.has_work()) engine.step();  // the decode sequences end with their last timed step
    runtime::Request r;
    r.prompt_ids = synthetic_prompt(o.batch, o.prefill_tokens, cfg.vocab_size);
    r.max_tokens = 1;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.submit(std::move(r));
    ctl.start({1, 0, o.trace.empty() ? std::string() : prefill_trace_path(o.trace), group, {}});
    while (!ctl.done() && engine.has_work())
      for (const auto& out : engine.step())
        if (out.finish == runtime::FinishReason::Error) MS_THROW("prefill step failed: {}", out.error);
    prefill = ctl.stop();
  }

  const std::string workload = fmt::format(
      "batch {}, context {}, {} timed decode steps after {} warm-up, KV cache {} ({} tokens)", o.batch,
      o.context, o.steps, o.warmup, kv::kv_cache_dtype_name(engine.kv_capacity().dtype), ec.kv_cache_tokens);
  if (o.json) {
    nlohmann::json j = {{"model", lm.description}, {"workload", workload}, {"decode", decode.summary_json}};
    if (prefill) j["prefill"] = prefill->summary_json;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model: %s\n%s\n\n== decode ==\n%s", lm.description.c_str(), workload.c_str(),
                decode.table.c_str());
    if (prefill)
      std::printf("\n== prefill: one step of %d tokens ==\n%s", o.prefill_tokens, prefill->table.c_str());
  }
  if (!decode.trace_path.empty()) std::fprintf(stderr, "trace: %s\n", decode.trace_path.c_str());
  if (prefill && !prefill->trace_path.empty())
    std::fprintf(stderr, "trace: %s\n", prefill->trace_path.c_str());
  save_expert_distribution(o.eng.eplb, engine);
  return 0;
}

Registration reg(
    "profile", "Time decode steps op by op against this machine's roofline (built-in model without --model)",
    [](CLI::App& app) {
      auto o = std::make_shared<ProfileCliOptions>();
      add_engine_flags(app, o->eng,
                       engine_flag::kCommon | engine_flag::kKvCacheTokens | engine_flag::kLoadFormat);
      app.add_option("--batch", o->batch, "Sequences decoding together")->capture_default_str();
      app.add_option("--context", o->context, "Tokens in each sequence before the timed steps")
          ->capture_default_str();
      app.add_option("--steps", o->steps, "Decode steps timed")->capture_default_str();
      app.add_option("--warmup", o->warmup, "Decode steps run before timing")->capture_default_str();
      app.add_option("--prefill-tokens", o->prefill_tokens,
                     "Also time one prefill step of this many tokens (0: none)")
          ->capture_default_str();
      app.add_option("--trace", o->trace,
                     "Write a Chrome/Perfetto trace here (the prefill step goes to NAME.prefill.json)");
      app.add_flag("--per-layer", o->per_layer, "One row per op per layer instead of per op kind");
      app.add_flag("--json", o->json, "Print the summary as JSON instead of the table");
      app.add_option("--ceilings", o->ceilings,
                     "Use these ceilings instead of measuring them: MEM_GBPS,GFLOPS (e.g. 20,100)");
      return [o] { return run_profile(*o); };
    });

}  // namespace

}  // namespace ms::cli
