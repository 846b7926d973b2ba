// A weight matrix [rows = out features, cols = in features] as a kernel sees it: raw pointers in the format
// it is stored in. Kernels dequantise one row (or one tile of rows) at a time into a small f32 buffer;
// nothing ever expands a whole matrix.
#pragma once

#include <cstdint>

namespace ms::kernels::cpu {

enum class WeightFormat : uint8_t { F32, BF16, FP8Block, NVFP4 };

struct WeightView {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0, cols = 0;
  // F32: f32 [rows, cols]; BF16: u16 [rows, cols]; FP8Block: e4m3 [rows, cols]; NVFP4: u8 [rows, cols/2]
  // (element 2i in the low nibble).
  const void* data = nullptr;
  // FP8Block: f32 [ceil(rows/block), ceil(cols/block)] (weight_scale_inv); NVFP4: e4m3 [rows, cols/16].
  const void* scale = nullptr;
  float scale2 = 1.0f;  // NVFP4 weight_scale_2
  int block = 128;      // FP8Block block edge
};

// out[0..cols) = row r of w, as f32.
void dequantize_row(const WeightView& w, int64_t r, float* out);

// Bytes the stored matrix occupies (data and scales), for cost models.
double weight_bytes(const WeightView& w);

}  // namespace ms::kernels::cpu
