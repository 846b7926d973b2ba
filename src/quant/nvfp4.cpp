#include "quant/nvfp4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "quant/float_formats.h"

namespace ms::quant {

uint8_t f32_to_e2m1(float f) {
  if (std::isnan(f)) return 0;
  uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  // Midpoints between consecutive magnitudes; at a tie take the even code.
  static constexpr float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 7;
  for (uint8_t c = 0; c < 7; ++c) {
    if (a < mid[c] || (a == mid[c] && (c % 2 == 0))) {
      code = c;
      break;
    }
  }
  return sign | code;
}

Nvfp4Weight nvfp4_quantize(const float* w, int64_t rows, int64_t cols) {
  float amax = 0.0f;
  for (int64_t i = 0; i < rows * cols; ++i) amax = std::max(amax, std::fabs(w[i]));
  return nvfp4_quantize_with_scale2(w, rows, cols, amax / (6.0f * kFp8E4M3Max));
}

Nvfp4Weight nvfp4_quantize_with_scale2(const float* w, int64_t rows, int64_t cols, float scale2) {
  MS_CHECK(cols % kNvfp4Block == 0, "nvfp4: {} columns is not a multiple of {}", cols, kNvfp4Block);
  Nvfp4Weight q;
  q.rows = rows;
  q.cols = cols;
  q.scale2 = scale2;
  q.packed.assign(static_cast<size_t>(rows * cols / 2), 0);
  q.scales.assign(static_cast<size_t>(rows * cols / kNvfp4Block), 0);
  const int64_t nb = cols / kNvfp4Block;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = w + r * cols + b * kNvfp4Block;
      float bmax = 0.0f;
      for (int i = 0; i < kNvfp4Block; ++i) bmax = std::max(bmax, std::fabs(x[i]));
      uint8_t s = scale2 > 0 ? f32_to_fp8_e4m3(bmax / (6.0f * scale2), true) : 0;
      q.scales[static_cast<size_t>(r * nb + b)] = s;
      float denom = fp8_e4m3_to_f32(s) * scale2;
      float inv = denom > 0 ? 1.0f / denom : 0.0f;
      uint8_t* dst = q.packed.data() + r * cols / 2 + b * kNvfp4Block / 2;
      for (int i = 0; i < kNvfp4Block; i += 2) {
        uint8_t lo = f32_to_e2m1(x[i] * inv), hi = f32_to_e2m1(x[i + 1] * inv);
        dst[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
  return q;
}

void nvfp4_dequantize_row(const uint8_t* packed, const uint8_t* scales, float scale2, int64_t cols,
                          float* out) {
  const float* fp8 = fp8_e4m3_table();
  for (int64_t b = 0; b < cols / kNvfp4Block; ++b) {
    float s = fp8[scales[b]] * scale2;
    for (int i = 0; i < kNvfp4Block / 2; ++i) {
      uint8_t byte = packed[b * kNvfp4Block / 2 + i];
      out[b * kNvfp4Block + 2 * i] = e2m1_to_f32(byte & 0xf) * s;
      out[b * kNvfp4Block + 2 * i + 1] = e2m1_to_f32(byte >> 4) * s;
    }
  }
}

}  // namespace ms::quant
