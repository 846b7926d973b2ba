// DeepSeek's native FP8 checkpoints: `weight` F8_E4M3 [out, in] with `weight_scale_inv` F32
// [ceil(out/128), ceil(in/128)], one scale per 128x128 block: w = float(fp8) *
// weight_scale_inv[r/128][c/128]. Quantizer: weight_scale_inv = block_amax / 448, code = e4m3(w /
// weight_scale_inv), saturating.
#pragma once

#include <cstdint>
#include <vector>

namespace ms::quant {

constexpr int kFp8Block = 128;

struct Fp8BlockWeight {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;     // [rows, cols] fp8 e4m3
  std::vector<float> scale_inv;  // [ceil(rows/128), ceil(cols/128)]
  int64_t scale_cols() const { return (cols + kFp8Block - 1) / kFp8Block; }
};

Fp8BlockWeight fp8_block_quantize(const float* w, int64_t rows, int64_t cols, int block = kFp8Block);
// Dequantizes row r: data_row [cols], scale_row = scale_inv + (r / block) * scale_cols.
void fp8_block_dequantize_row(const uint8_t* data_row, const float* scale_row, int64_t cols, float* out,
                              int block = kFp8Block);

}  // namespace ms::quant
