// NVFP4 as NVIDIA ModelOpt checkpoints store it:
//   weight        U8 [out, in/2]   element 2i in the low nibble, 2i+1 in the high one; E2M1 code, bit 3 =
//   sign weight_scale  F8_E4M3 [out, in/16]  one scale per block of 16 consecutive input elements
//   weight_scale_2 F32 scalar
//   w = e2m1[code] * float(weight_scale) * weight_scale_2
// Quantizer: weight_scale_2 = amax / (6 * 448); block scale = block_amax / (6 * weight_scale_2) rounded to
// E4M3; code = E2M1 round-to-nearest-even of w / (block_scale * weight_scale_2).
#pragma once

#include <cstdint>
#include <vector>

namespace ms::quant {

constexpr int kNvfp4Block = 16;
// E2M1 magnitudes of codes 0..7.
inline constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline float e2m1_to_f32(uint8_t code) {
  float v = kE2M1Values[code & 7];
  return (code & 8) ? -v : v;
}
// Round to nearest E2M1 value, ties to the even code; saturates at +-6. NaN becomes 0.
uint8_t f32_to_e2m1(float f);

struct Nvfp4Weight {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> packed;  // [rows, cols/2]
  std::vector<uint8_t> scales;  // [rows, cols/16] fp8 e4m3
  float scale2 = 0.0f;          // weight_scale_2
};

// Quantizes a row-major f32 matrix [rows, cols]; cols must be a multiple of 16.
Nvfp4Weight nvfp4_quantize(const float* w, int64_t rows, int64_t cols);
// Same with a given weight_scale_2 (e.g. to share one global scale between fused matrices).
Nvfp4Weight nvfp4_quantize_with_scale2(const float* w, int64_t rows, int64_t cols, float scale2);

// Dequantizes one row of `cols` elements: packed [cols/2], scales [cols/16].
void nvfp4_dequantize_row(const uint8_t* packed, const uint8_t* scales, float scale2, int64_t cols,
                          float* out);

}  // namespace ms::quant
