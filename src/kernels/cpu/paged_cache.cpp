#include "kernels/cpu/paged_cache.h"

#include <algorithm>
#include <cmath>

#include "quant/float_formats.h"

namespace ms::kernels::cpu {

void cache_read_row(const PagedCacheView& c, int64_t slot, float* out) {
  const int64_t w = c.width;
  switch (c.format) {
    case CacheFormat::F32: {
      const float* src = static_cast<const float*>(c.data) + slot * w;
      for (int64_t i = 0; i < w; ++i) out[i] = src[i];
      return;
    }
    case CacheFormat::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(c.data) + slot * w;
#pragma omp simd
      for (int64_t i = 0; i < w; ++i) out[i] = quant::bf16_to_f32(src[i]);
      return;
    }
    case CacheFormat::FP8E4M3: {
      const uint8_t* src = static_cast<const uint8_t*>(c.data) + slot * w;
      const float* table = quant::fp8_e4m3_table();
      const float s = c.scale;
      for (int64_t i = 0; i < w; ++i) out[i] = table[src[i]] * s;
      return;
    }
  }
}

void fp8_tile128_round_row(const float* x, int64_t width, int64_t rope, float* out) {
  const int64_t nope = width - rope;
  for (int64_t t0 = 0; t0 < nope; t0 += 128) {
    const int64_t t1 = std::min(nope, t0 + 128);
    float amax = 0.0f;
    for (int64_t i = t0; i < t1; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (amax == 0.0f) {
      for (int64_t i = t0; i < t1; ++i) out[i] = 0.0f;
      continue;
    }
    const float s = amax / 448.0f;
    for (int64_t i = t0; i < t1; ++i)
      out[i] = quant::fp8_e4m3_to_f32(quant::f32_to_fp8_e4m3(x[i] / s, true)) * s;
  }
  for (int64_t i = nope; i < width; ++i) out[i] = quant::bf16_to_f32(quant::f32_to_bf16(x[i]));
}

void cache_write(const CacheWriteParams& p) {
  const int64_t w = p.cache.width;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.m; ++r) {
    const float* x = p.x + r * p.x_stride;
    const int64_t slot = p.slots[r];
    switch (p.cache.format) {
      case CacheFormat::F32: {
        float* dst = static_cast<float*>(p.cache.data) + slot * w;
        if (p.cache.fp8_tile_sim_rope >= 0) {
          fp8_tile128_round_row(x, w, p.cache.fp8_tile_sim_rope, dst);
          break;
        }
        for (int64_t i = 0; i < w; ++i) dst[i] = x[i];
        break;
      }
      case CacheFormat::BF16: {
        uint16_t* dst = static_cast<uint16_t*>(p.cache.data) + slot * w;
        for (int64_t i = 0; i < w; ++i) dst[i] = quant::f32_to_bf16(x[i]);
        break;
      }
      case CacheFormat::FP8E4M3: {
        uint8_t* dst = static_cast<uint8_t*>(p.cache.data) + slot * w;
        const float inv = 1.0f / p.cache.scale;
        for (int64_t i = 0; i < w; ++i) dst[i] = quant::f32_to_fp8_e4m3(x[i] * inv, true);
        break;
      }
    }
  }
}

}  // namespace ms::kernels::cpu
