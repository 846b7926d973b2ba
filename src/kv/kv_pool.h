// The paged KV pool's memory: per layer, the MLA cache of kv_cache_width (576 for GLM-5 / DeepSeek-V3) values
// per token (normalised latent, then rotated k_pe) and, for DSA models, the indexer's key cache, in pages of
// page_size tokens. An Executor owns it on its device; the page ids that address it come from the Engine's
// PageAllocator. The pool is allocated once and never converted: FP8 pages are read in place with the
// layer's scale.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace ms::kv {

// FP8E4M3Tile128Sim measures a finer FP8 format's quality, not its bytes: the latent stored as e4m3 with one
// f32 scale per token and 128-value tile (amax / 448) and the rope part as bf16 (the layout DeepSeek-V3.2's
// kernels use, 656 bytes a row of 512 + 64), but held decoded in f32 pages. CPU only; for perplexity runs.
enum class KvCacheDType : uint8_t { Auto, F32, BF16, FP8E4M3, FP8E4M3Tile128Sim };
// "auto", "bf16" (also "bfloat16"), "fp8_e4m3" (also "fp8"), "f32" (the exact reference, for tests).
KvCacheDType parse_kv_cache_dtype(std::string_view s);
std::string_view kv_cache_dtype_name(KvCacheDType d);

struct KvPoolConfig {
  int num_layers = 0;
  int64_t width = 0;        // kv_lora_rank + qk_rope_head_dim
  int64_t index_width = 0;  // indexer head dim (0: no indexer cache)
  int32_t num_pages = 0;
  int32_t page_size = 64;
  KvCacheDType dtype = KvCacheDType::BF16;  // Auto must be resolved before
  std::vector<float> scales;                // [num_layers] fp8 scale per layer (empty: 1.0)
  int64_t rope_width = 0;  // the row's trailing rope values (FP8E4M3Tile128Sim keeps them bf16)
};

class KvPool {
 public:
  // Pages zero-filled in CPU memory.
  explicit KvPool(const KvPoolConfig& cfg);
  // Pages from `alloc` (e.g. device memory; contents left as the allocator gives them: every slot is written
  // before attention reads it).
  KvPool(const KvPoolConfig& cfg, const TensorAlloc& alloc);

  const KvPoolConfig& config() const { return cfg_; }
  int32_t page_size() const { return cfg_.page_size; }

  const Tensor& latent(int layer) const {
    return latent_[static_cast<size_t>(layer)];
  }  // [pages, page_size, width]
  float scale(int layer) const { return scales_[static_cast<size_t>(layer)]; }
  // FP8E4M3Tile128Sim: the rope width the writes keep in bf16; -1 for every other dtype.
  int64_t fp8_tile_sim_rope() const {
    return cfg_.dtype == KvCacheDType::FP8E4M3Tile128Sim ? cfg_.rope_width : -1;
  }
  // [pages, page_size, index_width]: f32 when the pool is f32, bf16 otherwise; undefined without an indexer.
  const Tensor& index_keys(int layer) const { return index_[static_cast<size_t>(layer)]; }
  size_t bytes() const;
  // Bytes a pool of this config holds (every layer, latent and index keys), before allocating it.
  static size_t bytes_for(const KvPoolConfig& cfg);
  // Pages needed to hold `tokens` tokens.
  int32_t pages_for(int64_t tokens) const {
    return static_cast<int32_t>((tokens + cfg_.page_size - 1) / cfg_.page_size);
  }

 private:
  KvPoolConfig cfg_;
  std::vector<Tensor> latent_, index_;
  std::vector<float> scales_;
};

}  // namespace ms::kv
