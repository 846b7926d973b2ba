// Rotary position embedding in place on the device, exactly the CPU reference's rotation
// (kernels/cpu/elementwise.h): pairs (2i, 2i+1) when interleaved, else (i, i + dim/2), angle pos *
// inv_freq[i] in f32, cos and sin times attention_scaling (YaRN).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda {

struct RopeParams {
  float* __restrict__ x = nullptr;  // [m, heads, head_dim]: row r head h at x + r*row_stride + h*head_stride
  int64_t row_stride = 0, head_stride = 0;
  int64_t offset = 0;  // first rotated channel of each head; channels [offset, offset + dim) rotate
  int64_t m = 0, heads = 0, dim = 0;                // dim even
  const int32_t* __restrict__ positions = nullptr;  // [m] on the device
  const float* __restrict__ inv_freq = nullptr;     // [dim / 2] on the device
  float attention_scaling = 1.0f;
  bool interleaved = false;
};
void rope(const RopeParams& p, cudaStream_t stream);

}  // namespace ms::cuda
