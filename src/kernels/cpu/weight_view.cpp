#include "kernels/cpu/weight_view.h"

// GCC 12 reports the intrinsics' own placeholders as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "quant/float_formats.h"
#include "quant/nvfp4.h"

namespace ms::kernels::cpu {

namespace {

// out[0, n) = e4m3 src[0, n) * s, 8 at a time: a byte sign-extended to 16 bits, shifted left by 7 and bit 14
// cleared is the f16 of its value times 2^-8 (bias 15 against 7, subnormals included), widened exactly by
// the hardware; times s * 2^8 it is the table value times s, the same product, so the same f32.
__attribute__((target("avx2,f16c"))) int64_t fp8_row_f16c(const uint8_t* src, float s, int64_t n,
                                                          float* out) {
  const __m256 sv = _mm256_set1_ps(s * 0x1p8f);
  const __m128i mask = _mm_set1_epi16(static_cast<short>(0xbf80));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
    const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), mask);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(h), sv));
  }
  return i;
}

const bool kHasF16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");

}  // namespace

void dequantize_row(const WeightView& w, int64_t r, float* out) {
  const int64_t n = w.cols;
  switch (w.format) {
    case WeightFormat::F32: {
      const float* src = static_cast<const float*>(w.data) + r * n;
      for (int64_t i = 0; i < n; ++i) out[i] = src[i];
      return;
    }
    case WeightFormat::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = quant::bf16_to_f32(src[i]);
      return;
    }
    case WeightFormat::FP8Block: {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * n;
      const int64_t scale_cols = (n + w.block - 1) / w.block;
      const float* srow = static_cast<const float*>(w.scale) + (r / w.block) * scale_cols;
      const float* table = quant::fp8_e4m3_table();
      for (int64_t b = 0; b < scale_cols; ++b) {
        const float s = srow[b];
        const int64_t end = (b + 1) * w.block < n ? (b + 1) * w.block : n;
        int64_t i = b * w.block;
        if (kHasF16c) i += fp8_row_f16c(src + i, s, end - i, out + i);
        for (; i < end; ++i) out[i] = table[src[i]] * s;
      }
      return;
    }
    case WeightFormat::NVFP4: {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * (n / 2);
      const uint8_t* scales = static_cast<const uint8_t*>(w.scale) + r * (n / quant::kNvfp4Block);
      const float* table = quant::fp8_e4m3_table();
      // Signed E2M1 values of all 16 codes.
      static constexpr float kCode[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
      for (int64_t b = 0; b < n / quant::kNvfp4Block; ++b) {
        const float s = table[scales[b]] * w.scale2;
        const uint8_t* p = src + b * (quant::kNvfp4Block / 2);
        float* o = out + b * quant::kNvfp4Block;
        for (int i = 0; i < quant::kNvfp4Block / 2; ++i) {
          o[2 * i] = kCode[p[i] & 15] * s;
          o[2 * i + 1] = kCode[p[i] >> 4] * s;
        }
      }
      return;
    }
  }
}

double weight_bytes(const WeightView& w) {
  const double n = static_cast<double>(w.rows) * static_cast<double>(w.cols);
  switch (w.format) {
    case WeightFormat::F32:
      return n * 4;
    case WeightFormat::BF16:
      return n * 2;
    case WeightFormat::FP8Block: {
      const double sb = static_cast<double>((w.rows + w.block - 1) / w.block) *
                        static_cast<double>((w.cols + w.block - 1) / w.block);
      return n + sb * 4;
    }
    case WeightFormat::NVFP4:
      return n / 2 + n / quant::kNvfp4Block;
  }
  return n;
}

}  // namespace ms::kernels::cpu
