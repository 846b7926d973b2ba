// How a checkpoint's weights are quantized: NVFP4 (NVIDIA ModelOpt, hf_quant_config.json or
// config.json "quantization_config"), DeepSeek FP8 128x128 block (quant_method "fp8"), or none (bf16).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ms::io {

enum class WeightFormat { BF16, FP8Block, NVFP4 };

struct QuantConfig {
  WeightFormat format = WeightFormat::BF16;
  int group_size = 16;                                   // NVFP4 block of input elements
  int weight_block_rows = 128, weight_block_cols = 128;  // FP8 block
  bool kv_cache_fp8 = false;                             // kv_cache_quant_algo "FP8"
  std::vector<std::string> exclude_modules;              // wildcards: "*self_attn*", "lm_head", ...

  // True when the linear module `name` (e.g. "model.layers.3.mlp.experts.7.down_proj") is stored quantized.
  bool is_quantized(const std::string& module_name) const;
};

QuantConfig parse_quant_config(const nlohmann::json& config_json, const nlohmann::json* hf_quant_config,
                               const std::string& source);
// Reads config.json and, when present, hf_quant_config.json from the model directory.
QuantConfig load_quant_config(const std::filesystem::path& model_dir);

// Shell-style wildcard match ('*' and '?') as ModelOpt's exclude_modules use.
bool wildcard_match(const std::string& pattern, const std::string& text);

}  // namespace ms::io
