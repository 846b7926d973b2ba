#include "kv/kv_pool.h"

#include "core/error.h"

namespace ms::kv {

KvCacheDType parse_kv_cache_dtype(std::string_view s) {
  if (s == "auto") return KvCacheDType::Auto;
  if (s == "bf16" || s == "bfloat16") return KvCacheDType::BF16;
  if (s == "fp8_e4m3" || s == "fp8") return KvCacheDType::FP8E4M3;
  if (s == "f32" || s == "float32") return KvCacheDType::F32;
  if (s == "fp8_e4m3_tile128_sim") return KvCacheDType::FP8E4M3Tile128Sim;
  MS_THROW(
      "--kv-cache-dtype: unknown value '{}' (expected auto, f32, bf16, fp8_e4m3 or, to measure a finer "
      "fp8 format's quality on the cpu, fp8_e4m3_tile128_sim)",
      s);
}

std::string_view kv_cache_dtype_name(KvCacheDType d) {
  switch (d) {
    case KvCacheDType::Auto:
      return "auto";
    case KvCacheDType::F32:
      return "f32";
    case KvCacheDType::BF16:
      return "bf16";
    case KvCacheDType::FP8E4M3:
      return "fp8_e4m3";
    case KvCacheDType::FP8E4M3Tile128Sim:
      return "fp8_e4m3_tile128_sim";
  }
  return "?";
}

KvPool::KvPool(const KvPoolConfig& cfg)
    : KvPool(cfg, [](const Shape& shape, DType dt) { return Tensor::zeros(shape, dt); }) {}

KvPool::KvPool(const KvPoolConfig& cfg, const TensorAlloc& alloc) : cfg_(cfg) {
  MS_CHECK(cfg.dtype != KvCacheDType::Auto, "KV cache dtype must be resolved before the pool is built");
  MS_CHECK(cfg.page_size > 0 && cfg.num_pages > 0 && cfg.width > 0 && cfg.num_layers > 0,
           "KV pool needs positive pages ({}), page size ({}), width ({}) and layers ({})", cfg.num_pages,
           cfg.page_size, cfg.width, cfg.num_layers);
  MS_CHECK(cfg.scales.empty() || static_cast<int>(cfg.scales.size()) == cfg.num_layers,
           "KV pool: {} scales for {} layers", cfg.scales.size(), cfg.num_layers);
  const DType dt = cfg.dtype == KvCacheDType::F32 || cfg.dtype == KvCacheDType::FP8E4M3Tile128Sim ? DType::F32
                   : cfg.dtype == KvCacheDType::BF16 ? DType::BF16
                                                     : DType::F8_E4M3;
  MS_CHECK(
      cfg.dtype != KvCacheDType::FP8E4M3Tile128Sim || (cfg.rope_width >= 0 && cfg.rope_width < cfg.width),
      "KV pool: rope width {} of a row of {}", cfg.rope_width, cfg.width);
  const DType idt = cfg.dtype == KvCacheDType::F32 ? DType::F32 : DType::BF16;
  for (int l = 0; l < cfg.num_layers; ++l) {
    latent_.push_back(alloc({cfg.num_pages, cfg.page_size, cfg.width}, dt));
    if (cfg.index_width > 0)
      index_.push_back(alloc({cfg.num_pages, cfg.page_size, cfg.index_width}, idt));
    else
      index_.emplace_back();
    const float s = cfg.scales.empty() ? 1.0f : cfg.scales[static_cast<size_t>(l)];
    MS_CHECK(s > 0, "KV cache scale of layer {} must be positive, got {}", l, s);
    scales_.push_back(s);
  }
}

size_t KvPool::bytes_for(const KvPoolConfig& c) {
  const size_t slots = static_cast<size_t>(c.num_pages) * static_cast<size_t>(c.page_size);
  const size_t e = c.dtype == KvCacheDType::F32 || c.dtype == KvCacheDType::FP8E4M3Tile128Sim ? 4
                   : c.dtype == KvCacheDType::BF16                                            ? 2
                                                                                              : 1;
  const size_t ie = c.dtype == KvCacheDType::F32 ? 4 : 2;
  return static_cast<size_t>(c.num_layers) * slots *
         (static_cast<size_t>(c.width) * e + static_cast<size_t>(c.index_width) * ie);
}

size_t KvPool::bytes() const {
  size_t b = 0;
  for (const auto& t : latent_) b += t.nbytes();
  for (const auto& t : index_)
    if (t.numel() > 0) b += t.nbytes();
  return b;
}

}  // namespace ms::kv
