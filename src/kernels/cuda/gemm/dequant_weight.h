// Expands rows [row0, row0 + n) of a stored weight into a dense scratch matrix, for the large-m path (then a
// cuBLASLt GEMM). Values are the CPU reference's dequantised f32 bit for bit; the bf16 output is those values
// rounded to nearest even (quant::f32_to_bf16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/weight.h"

namespace ms::cuda {

struct DequantWeightParams {
  DeviceWeight w;  // [w.rows, w.cols], any format
  int64_t row0 = 0, n = 0;
  // Exactly one of the two outputs is set: [n, w.cols] rows out_stride apart.
  __nv_bfloat16* __restrict__ out_bf16 = nullptr;
  float* __restrict__ out_f32 = nullptr;
  int64_t out_stride = 0;
};
void dequant_weight(const DequantWeightParams& p, cudaStream_t stream);

}  // namespace ms::cuda
