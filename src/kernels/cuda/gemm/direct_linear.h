// y = x W^T on the CUDA cores for a weight in any stored format (f32, bf16, FP8 128x128-block, NVFP4),
// dequantised on the fly tile by tile with the CPU reference's exact arithmetic, f32 activations and f32
// accumulation in k order per output. Any m, n, k the format allows (NVFP4: k % 16 == 0). The path for few
// rows (decode) and for shapes the tensor-core paths do not take; the weight is read once per 16 rows of x.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/weight.h"

namespace ms::cuda {

struct DirectLinearParams {
  const float* __restrict__ x = nullptr;  // [m, k] rows x_stride apart (k = w.cols)
  int64_t x_stride = 0;
  DeviceWeight w;                   // [w.rows, k]; rows [row0, row0 + n) are used
  int64_t row0 = 0, n = 0;          // output features computed
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0;
};
void direct_linear(const DirectLinearParams& p, cudaStream_t stream);

}  // namespace ms::cuda
