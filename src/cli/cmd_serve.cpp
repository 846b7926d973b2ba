// `moeserve serve`: the OpenAI-compatible server over the Engine on a checkpoint (or the built-in model and
// tokenizer when no --model is given).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/engine_flags.h"
#include "cli/http_serve.h"
#include "cli/text_model.h"
#include "core/error.h"
#include "core/log.h"
#include "io/generation_config.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/device_ceilings.h"
#include "runtime/kv_budget.h"
#include "server/engine_backend.h"
#include "server/signals.h"

namespace ms::cli {

namespace {

struct ServeOptions {
  HttpServeOptions http;
  EngineFlags eng;
  bool expert_stats = false;
  std::string chat_template;
  bool disable_prefix_cache = false;
  std::string generation_config = "auto";
};

std::string curl_example(const server::ServerConfig& sc, int port, const std::string& model) {
  const std::string auth =
      sc.api_key.empty() ? std::string() : fmt::format(" -H 'Authorization: Bearer {}'", sc.api_key);
  return fmt::format(
      "try:\n  curl http://{}:{}/v1/chat/completions -H 'Content-Type: application/json'{} \\\n"
      "    -d '{{\"model\": \"{}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], "
      "\"max_tokens\": 32}}'\n",
      sc.host, port, auth, model);
}

int run_serve(ServeOptions o) {
  const bool builtin_model = o.eng.model_dir.empty();
  o.eng.model_dir = resolve_model_dir(o.eng.model_dir);
  MS_CHECK(o.eng.max_running >= 1, "--max-running-requests must be at least 1, got {}", o.eng.max_running);
  MS_CHECK(o.eng.max_prefill_tokens >= 1, "--max-prefill-tokens must be at least 1, got {}",
           o.eng.max_prefill_tokens);
  MS_CHECK(o.eng.kv_cache_tokens >= 0, "--kv-cache-tokens must be >= 0, got {}", o.eng.kv_cache_tokens);
  MS_CHECK(o.eng.context_length >= 0, "--context-length must be >= 0, got {}", o.eng.context_length);
  server::block_shutdown_signals();  // before any thread (OpenMP's included) starts

  server::EngineBackendParts parts;
  parts.tokenizer = load_text_tokenizer(o.eng.model_dir);
  MS_CHECK(parts.tokenizer != nullptr, "{} has no tokenizer.json: the server needs one to read prompts",
           o.eng.model_dir);
  try {
    parts.chat_template = load_chat_template(o.eng.model_dir, o.chat_template);
  } catch (const ms::Error& e) {
    if (!o.chat_template.empty()) throw;
    MS_LOG_WARN("no chat template ({}); /v1/chat/completions will answer 400", e.message());
  }
  if (o.generation_config == "auto" && !o.eng.model_dir.empty()) {
    if (auto g = io::load_generation_config(o.eng.model_dir)) {
      o.http.server.limits.sampling_defaults = *g;
      MS_LOG_INFO("sampling defaults from {}/generation_config.json: {}", o.eng.model_dir, g->describe());
    }
  }
  model::LoadedModel lm = load_engine_model(o.eng);
  const io::ModelConfig& cfg = lm.model->config();
  MS_LOG_INFO("model: {}", lm.description);

  runtime::EngineConfig ec;
  ec.page_size = o.eng.page_size;
  ec.kv_cache_dtype = resolve_kv_dtype(o.eng, lm);
  ec.max_running = o.eng.max_running;
  ec.max_prefill_tokens = o.eng.max_prefill_tokens;
  ec.enable_prefix_cache = !o.disable_prefix_cache;
  if (const auto oea = oea_config(o.eng)) ec.oea = *oea;
  const bool gpu = resolve_device(o.eng.dev) == "cuda";
  // The distinct-experts histograms of /metrics read each layer's routing back to the host: on the CPU that
  // costs nothing; on the GPU it syncs every layer and keeps decode steps out of CUDA graphs, so it is asked
  // for there (--expert-stats).
  ec.expert_stats = !gpu || o.expert_stats;
  apply_expert_recording(o.eng.eplb, ec);  // written when the server stops
  ec.max_context = o.eng.context_length > 0 ? std::min(o.eng.context_length, cfg.max_position_embeddings)
                                            : cfg.max_position_embeddings;
  if (o.eng.kv_cache_tokens > 0) {
    ec.kv_cache_tokens = o.eng.kv_cache_tokens;
  } else if (gpu) {
    ec.kv_cache_tokens = 0;  // the CUDA executor sizes the pages from the GPU's memory
  } else {
    // Measured after the weights are in memory, so the fraction is of what is left for the cache.
    const runtime::KvBudget kb = runtime::kv_budget_from_memory(
        runtime::available_memory_bytes(), o.eng.mem_fraction > 0 ? o.eng.mem_fraction : 0.5,
        runtime::kv_bytes_per_token(*lm.model, ec.kv_cache_dtype, o.eng.page_size), o.eng.page_size,
        static_cast<int64_t>(o.eng.max_running) * ec.max_context);
    ec.kv_cache_tokens = kb.tokens;
    MS_LOG_INFO("KV cache: {} tokens x {} bytes = {} MiB ({} of {} MiB available{})", kb.tokens,
                kb.bytes_per_token, (static_cast<size_t>(kb.tokens) * kb.bytes_per_token) >> 20,
                o.eng.mem_fraction > 0 ? o.eng.mem_fraction : 0.5, kb.available_bytes >> 20,
                kb.capped ? "; capped at max running requests x context" : "");
  }
  parts.engine = make_engine(lm, ec, o.eng.dev, o.eng.mem_fraction > 0 ? o.eng.mem_fraction : 0.85);
  if (parts.engine->executor().device() == Device::CUDA) {
    const runtime::Executor* ce = &parts.engine->executor();
    // /start_profile on the GPU: CUDA-event timers and the GPU's own ceilings (measured at the first
    // profile).
    parts.profiler.make_timer = [ce] { return ce->make_timer(); };
    try {
      parts.profiler.ceilings = runtime::cuda::measure_device_ceilings();
    } catch (const ms::Error& e) {
      MS_LOG_WARN("GPU ceilings not measured ({}); /start_profile will report no roofline", e.message());
      parts.profiler.ceilings = profiler::parse_ceilings("1,1");
    }
  }
  const runtime::Engine& engine = *parts.engine;
  parts.model_name = builtin_model ? std::string("builtin") : o.eng.model_dir;
  server::EngineBackend backend(std::move(parts));
  const std::string name =
      o.http.server.served_model_name.empty() ? backend.model_name() : o.http.server.served_model_name;
  MS_LOG_INFO("serving '{}': context {} tokens, KV pool {} pages of {} ({}), up to {} running requests", name,
              backend.max_context(), backend.stats().kv_pages_total, o.eng.page_size,
              kv::kv_cache_dtype_name(ec.kv_cache_dtype), o.eng.max_running);
  const int rc = serve_until_signal(backend, o.http, "moeserve serve",
                                    [&](int port) { return curl_example(o.http.server, port, name); });
  save_expert_distribution(o.eng.eplb, engine);
  return rc;
}

Registration reg("serve", "OpenAI-compatible HTTP server on a model (the built-in one without --model)",
                 [](CLI::App& sub) {
                   auto o = std::make_shared<ServeOptions>();
                   add_http_serve_options(sub, o->http);
                   add_engine_flags(sub, o->eng,
                                    engine_flag::kCommon | engine_flag::kOea | engine_flag::kServing |
                                        engine_flag::kKvCacheTokens | engine_flag::kLoadFormat);
                   sub.add_flag("--expert-stats", o->expert_stats,
                                "On the GPU, record distinct experts per MoE layer for /metrics (syncs every "
                                "layer and runs decode without CUDA graphs; always on for the CPU)");
                   sub.add_option("--chat-template", o->chat_template,
                                  "Jinja chat template file (default: the model's)");
                   sub.add_option("--generation-config", o->generation_config,
                                  "auto: the model's generation_config.json sets the sampling defaults "
                                  "(temperature, top_p, top_k, min_p, repetition_penalty) of requests that "
                                  "leave them out; none: the OpenAI API's defaults")
                       ->check(CLI::IsMember({"auto", "none"}))
                       ->capture_default_str();
                   return [o]() { return run_serve(*o); };
                 });

}  // namespace

}  // namespace ms::cli
