// The engine flags of the commands that run a model (serve, generate, chat, bench-one-batch, profile, logits,
// perplexity, moe-eval), registered in one place so that every command spells, defaults and documents them
// the same way. A command picks the groups it takes; a default other than the one below (logits and moe-eval
// default to an f32 KV cache) is set in the struct before add_engine_flags, which shows it in --help.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "cli/device_options.h"
#include "cli/expert_placement_flags.h"
#include "kv/kv_pool.h"
#include "model/load_model.h"
#include "moe/router.h"

namespace ms::cli {

struct EngineFlags {
  DeviceOptions dev;      // kDevice
  std::string model_dir;  // kModel; "": the built-in model
  std::string load_format =
      "auto";  // kLoadFormat; auto (the checkpoint) or dummy (random weights, config only)
  std::string quantization = "bf16";  // kLoadFormat; with --load-format dummy: nvfp4, fp8 or bf16
  std::string kv_dtype = "auto";      // kKvCacheDtype
  int page_size = 64;                 // kPageSize
  int oea_k0 = 0, oea_kmax = 0;       // kOea
  int64_t kv_cache_tokens = 0;        // kKvCacheTokens
  int max_running = 64;               // kServing
  int max_prefill_tokens = 4096;      // kServing
  int64_t context_length = 0;         // kServing; 0: the model's
  double mem_fraction = 0;            // kServing; 0: the device's default
  ExpertPlacementFlags eplb;          // kLoadFormat
};

// Groups of flags, or'ed together.
namespace engine_flag {
inline constexpr unsigned kModel = 1u << 0;          // --model
inline constexpr unsigned kDevice = 1u << 1;         // --device and the other DeviceOptions
inline constexpr unsigned kKvCacheDtype = 1u << 2;   // --kv-cache-dtype
inline constexpr unsigned kPageSize = 1u << 3;       // --page-size
inline constexpr unsigned kOea = 1u << 4;            // --oea-k0, --oea-kmax
inline constexpr unsigned kKvCacheTokens = 1u << 5;  // --kv-cache-tokens
// --max-running-requests, --max-prefill-tokens, --context-length, --mem-fraction-static
inline constexpr unsigned kServing = 1u << 6;
// --load-format, --quantization (serve, generate, bench-one-batch, profile: the commands that time a model)
inline constexpr unsigned kLoadFormat = 1u << 7;
inline constexpr unsigned kCommon = kModel | kDevice | kKvCacheDtype | kPageSize;
}  // namespace engine_flag

void add_engine_flags(CLI::App& sub, EngineFlags& f, unsigned groups);

// The model --model, --load-format and --quantization name: the checkpoint (or the built-in model), or with
// --load-format dummy random weights from --model's config.json in --quantization (seed 0), described in
// LoadedModel::description (one line). Throws naming the flag for a bad value.
model::LoadedModel load_engine_model(const EngineFlags& f);

// --kv-cache-dtype parsed; auto resolves to what the checkpoint asks for.
kv::KvCacheDType resolve_kv_dtype(const EngineFlags& f, const model::LoadedModel& lm);

// --oea-k0/--oea-kmax as an OEA configuration, none when --oea-k0 is 0; --oea-kmax without --oea-k0 throws.
std::optional<moe::OeaConfig> oea_config(const EngineFlags& f);

}  // namespace ms::cli
