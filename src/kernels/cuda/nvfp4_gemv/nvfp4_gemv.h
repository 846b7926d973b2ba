// Decode-time linear layer on NVFP4 weights as ModelOpt checkpoints store them: y = x @ W^T for a handful of
// rows of x. Memory-bound: the floor is the packed weights plus their block scales over HBM bandwidth.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda {

struct Nvfp4GemvParams {
  const uint8_t* __restrict__ w;        // [n, k/2]  E2M1 codes, element 2i in the low nibble
  const uint8_t* __restrict__ w_scale;  // [n, k/16] fp8 e4m3 block scales
  float w_scale2;                       // weight_scale_2 (per tensor)
  const __nv_bfloat16* __restrict__ x;  // [m, k]    activations, row stride k
  float* __restrict__ y;                // [m, n]    output, row stride n
  int m, n, k;
};

// Most rows of x one launch handles (decode batches); larger m belongs to a GEMM.
constexpr int kNvfp4GemvMaxM = 8;

// Checks the shapes (k % 32 == 0, 1 <= m <= kNvfp4GemvMaxM, 16-byte aligned rows) and launches on `stream`.
void nvfp4_gemv(const Nvfp4GemvParams& p, cudaStream_t stream);

}  // namespace ms::cuda
