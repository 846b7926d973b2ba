#include "kernels/cpu/weight_view.h"

#include "quant/float_formats.h"
#include "quant/nvfp4.h"

namespace ms::kernels::cpu {

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
        for (int64_t i = b * w.block; i < end; ++i) out[i] = table[src[i]] * s;
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
