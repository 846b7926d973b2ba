// Writes a quantized copy of a BF16 (or F16/F32) Hugging Face checkpoint: ModelOpt NVFP4 (weight U8 packed
// E2M1, weight_scale F8_E4M3 per 16 inputs, weight_scale_2 F32) or DeepSeek FP8-block (weight F8_E4M3,
// weight_scale_inv F32 per 128x128 block), with config.json's quantization_config (and hf_quant_config.json
// for NVFP4) naming the excluded modules. Only 2-D `*.weight` tensors of modules the exclusions leave are
// quantized; every other tensor is copied as it is, and so are the tokenizer and other small files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/quant_config.h"

namespace ms::io {

struct QuantizeOptions {
  WeightFormat to = WeightFormat::NVFP4;  // NVFP4 or FP8Block
  // Module wildcards kept in their stored dtype (QuantConfig::is_quantized semantics, a parent module
  // excludes its children). Empty: default_quantize_excludes().
  std::vector<std::string> exclude;
  int64_t shard_bytes = int64_t{2} << 30;  // output files of at most about this size
};

// Attention (with the DSA indexer), the router gate, the embedding and lm_head, the MTP head: what ModelOpt's
// and DeepSeek's published checkpoints keep in BF16.
std::vector<std::string> default_quantize_excludes();

struct QuantizeReport {
  int64_t tensors_quantized = 0, tensors_copied = 0;
  int64_t bytes_in = 0, bytes_out = 0;
  std::vector<std::string> skipped;  // quantizable by name but not by shape (e.g. NVFP4 with in % 16 != 0)
};

QuantizeReport quantize_checkpoint(const std::filesystem::path& in_dir, const std::filesystem::path& out_dir,
                                   const QuantizeOptions& o);

}  // namespace ms::io
