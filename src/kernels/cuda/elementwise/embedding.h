// Embedding gather on the device: out[i, :] = table[ids[i], :] as f32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/weight.h"

namespace ms::cuda {

struct EmbeddingParams {
  const int32_t* __restrict__ ids = nullptr;  // [m] token ids on the device
  DeviceWeight table;                         // F32 or BF16 [vocab, hidden]
  float* __restrict__ out = nullptr;          // [m, hidden] rows out_stride apart
  int64_t out_stride = 0;
  int64_t m = 0;
};

// An id outside [0, vocab) reads nothing and fills its output row with NaN, so a bad id can neither fault
// nor pass unnoticed (the host checks ids before they reach the device; this only keeps the kernel safe).
void embedding(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace ms::cuda
