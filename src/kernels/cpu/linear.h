// y = x W^T for a weight in any stored format: the reference CPU GEMM/GEMV. Weight rows are dequantised a
// tile at a time into a per-thread f32 buffer and reused across all m input rows.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_view.h"

namespace ms::kernels::cpu {

struct LinearParams {
  const float* __restrict__ x = nullptr;  // [m, k] rows x_stride apart (k = w.cols)
  int64_t x_stride = 0;
  WeightView w;                     // [w.rows, k]; rows [row0, row0 + n) are used
  int64_t row0 = 0, n = 0;          // output features computed
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0;
};

void linear(const LinearParams& p);

}  // namespace ms::kernels::cpu
