// A weight matrix on the device in the format its checkpoint stores it (never expanded as a whole): what the
// GEMM, dequantisation and embedding kernels read. Mirrors kernels/cpu/weight_view.h with device pointers.
#pragma once

#include <cstdint>

namespace ms::cuda {

enum class WeightFormat : uint8_t { F32, BF16, FP8Block, NVFP4 };
const char* weight_format_name(WeightFormat f);

struct DeviceWeight {
  WeightFormat format = WeightFormat::BF16;
  int64_t rows = 0, cols = 0;  // [out features, in features]
  // F32: f32 [rows, cols]; BF16: bf16 [rows, cols]; FP8Block: e4m3 [rows, cols]; NVFP4: u8 [rows, cols/2]
  // (element 2i in the low nibble). Rows are packed (no row padding), as checkpoints store them.
  const void* __restrict__ data = nullptr;
  // FP8Block: f32 [ceil(rows/block), ceil(cols/block)] (weight_scale_inv); NVFP4: e4m3 [rows, cols/16].
  const void* __restrict__ scale = nullptr;
  float scale2 = 1.0f;  // NVFP4 weight_scale_2
  int block = 128;      // FP8Block block edge
};

// Throws ms::Error naming `kernel` and the field when `w` is not a well-formed weight: positive shape, data
// (and the scales its format needs) set, NVFP4 cols a multiple of 16, FP8Block block > 0.
void check_weight(const DeviceWeight& w, const char* kernel);

}  // namespace ms::cuda
