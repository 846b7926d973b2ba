// `moeserve serve`: the OpenAI-compatible server over the Engine on a checkpoint (or the built-in model and
// tokenizer when no --model is given).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/http_serve.h"
#include "cli/text_model.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/device_ceilings.h"
#include "runtime/kv_budget.h"
#include "server/engine_backend.h"
#include "server/signals.h"

namespace ms::cli {

namespace {

struct ServeOptions {
  HttpServeOptions http;
  DeviceOptions dev;
  bool expert_stats = false;
  std::string model_dir, chat_template, kv_dtype = "auto";
  int max_running = 64, max_prefill_tokens = 4096, page_size = 64, oea_k0 = 0, oea_kmax = 0;
  bool disable_prefix_cache = false;
  int64_t kv_cache_tokens = 0, context_length = 0;
  double mem_fraction = 0;  // 0: the device's default
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
  const bool builtin_model = o.model_dir.empty();
  o.model_dir = resolve_model_dir(o.model_dir);
  MS_CHECK(o.max_running >= 1, "--max-running-requests must be at least 1, got {}", o.max_running);
  MS_CHECK(o.max_prefill_tokens >= 1, "--max-prefill-tokens must be at least 1, got {}",
           o.max_prefill_tokens);
  MS_CHECK(o.kv_cache_tokens >= 0, "--kv-cache-tokens must be >= 0, got {}", o.kv_cache_tokens);
  MS_CHECK(o.context_length >= 0, "--context-length must be >= 0, got {}", o.context_length);
  server::block_shutdown_signals();  // before any thread (OpenMP's included) starts

  server::EngineBackendParts parts;
  parts.tokenizer = load_text_tokenizer(o.model_dir);
  MS_CHECK(parts.tokenizer != nullptr, "{} has no tokenizer.json: the server needs one to read prompts",
           o.model_dir);
  try {
    parts.chat_template = load_chat_template(o.model_dir, o.chat_template);
  } catch (const ms::Error& e) {
    if (!o.chat_template.empty()) throw;
    MS_LOG_WARN("no chat template ({}); /v1/chat/completions will answer 400", e.message());
  }
  model::LoadedModel lm = model::load_model(o.model_dir);
  const io::ModelConfig& cfg = lm.model->config();
  MS_LOG_INFO("model: {}", lm.description);

  runtime::EngineConfig ec;
  ec.page_size = o.page_size;
  ec.kv_cache_dtype = kv::parse_kv_cache_dtype(o.kv_dtype);
  if (ec.kv_cache_dtype == kv::KvCacheDType::Auto) ec.kv_cache_dtype = lm.kv_auto;
  ec.max_running = o.max_running;
  ec.max_prefill_tokens = o.max_prefill_tokens;
  ec.enable_prefix_cache = !o.disable_prefix_cache;
  MS_CHECK(o.oea_kmax == 0 || o.oea_k0 > 0, "--oea-kmax needs --oea-k0");
  if (o.oea_k0 > 0) ec.oea = moe::OeaConfig{true, o.oea_k0, o.oea_kmax};
  const bool gpu = resolve_device(o.dev) == "cuda";
  // The distinct-experts histograms of /metrics read each layer's routing back to the host: on the CPU that
  // costs nothing; on the GPU it syncs every layer and keeps decode steps out of CUDA graphs, so it is asked
  // for there (--expert-stats).
  ec.expert_stats = !gpu || o.expert_stats;
  ec.max_context = o.context_length > 0 ? std::min(o.context_length, cfg.max_position_embeddings)
                                        : cfg.max_position_embeddings;
  if (o.kv_cache_tokens > 0) {
    ec.kv_cache_tokens = o.kv_cache_tokens;
  } else if (gpu) {
    ec.kv_cache_tokens = 0;  // the CUDA executor sizes the pages from the GPU's memory
  } else {
    // Measured after the weights are in memory, so the fraction is of what is left for the cache.
    const runtime::KvBudget kb = runtime::kv_budget_from_memory(
        runtime::available_memory_bytes(), o.mem_fraction > 0 ? o.mem_fraction : 0.5,
        runtime::kv_bytes_per_token(*lm.model, ec.kv_cache_dtype, o.page_size), o.page_size,
        static_cast<int64_t>(o.max_running) * ec.max_context);
    ec.kv_cache_tokens = kb.tokens;
    MS_LOG_INFO("KV cache: {} tokens x {} bytes = {} MiB ({} of {} MiB available{})", kb.tokens,
                kb.bytes_per_token, (static_cast<size_t>(kb.tokens) * kb.bytes_per_token) >> 20,
                o.mem_fraction > 0 ? o.mem_fraction : 0.5, kb.available_bytes >> 20,
                kb.capped ? "; capped at max running requests x context" : "");
  }
  parts.engine = make_engine(lm.model, ec, o.dev, o.mem_fraction > 0 ? o.mem_fraction : 0.85);
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
  parts.model_name = builtin_model ? std::string("builtin") : o.model_dir;
  server::EngineBackend backend(std::move(parts));
  const std::string name =
      o.http.server.served_model_name.empty() ? backend.model_name() : o.http.server.served_model_name;
  MS_LOG_INFO("serving '{}': context {} tokens, KV pool {} pages of {} ({}), up to {} running requests", name,
              backend.max_context(), backend.stats().kv_pages_total, o.page_size,
              kv::kv_cache_dtype_name(ec.kv_cache_dtype), o.max_running);
  return serve_until_signal(backend, o.http, "moeserve serve",
                            [&](int port) { return curl_example(o.http.server, port, name); });
}

Registration reg("serve", "OpenAI-compatible HTTP server on a model (the built-in one without --model)",
                 [](CLI::App& sub) {
                   auto o = std::make_shared<ServeOptions>();
                   add_http_serve_options(sub, o->http);
                   add_device_options(sub, o->dev);
                   sub.add_flag("--expert-stats", o->expert_stats,
                                "On the GPU, record distinct experts per MoE layer for /metrics (syncs every "
                                "layer and runs decode without CUDA graphs; always on for the CPU)");
                   sub.add_option("--model", o->model_dir,
                                  "Hugging Face checkpoint directory (default: the built-in model)");
                   sub.add_option("--chat-template", o->chat_template,
                                  "Jinja chat template file (default: the model's)");
                   sub.add_option("--max-running-requests", o->max_running)->capture_default_str();
                   sub.add_option("--max-prefill-tokens", o->max_prefill_tokens,
                                  "Prompt tokens per step (longer prompts are prefilled in chunks)")
                       ->capture_default_str();
                   sub.add_option("--kv-cache-dtype", o->kv_dtype, "auto, f32 (exact), bf16 or fp8_e4m3")
                       ->capture_default_str();
                   sub.add_option("--page-size", o->page_size, "Tokens per KV page")->capture_default_str();
                   sub.add_option("--mem-fraction-static", o->mem_fraction,
                                  "CPU: the KV cache's share of the memory available after the weights are "
                                  "loaded (default 0.5); GPU: the share of the GPU's memory for weights, "
                                  "workspace and KV cache together (default 0.85). Capped at max running "
                                  "requests x context")
                       ->capture_default_str();
                   sub.add_option("--kv-cache-tokens", o->kv_cache_tokens,
                                  "KV cache size in tokens (overrides --mem-fraction-static)");
                   sub.add_option("--context-length", o->context_length,
                                  "Tokens per request, prompt and completion (default: the model's)");
                   return [o]() { return run_serve(*o); };
                 });

}  // namespace

}  // namespace ms::cli
