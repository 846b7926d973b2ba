// Decode-time linear layer on NVFP4 weights as ModelOpt checkpoints store them: y = x @ W^T for a handful of
// rows of x. Memory-bound: the floor is the packed weights plus their block scales over HBM bandwidth.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ms::cuda {

struct Nvfp4GemvParams {
  const uint8_t* __restrict__ w;        // [n, k/2]  E2M1 codes, element 2i in the low nibble; 16-byte aligned
  const uint8_t* __restrict__ w_scale;  // [n, k/16] fp8 e4m3 block scales
  float w_scale2;                       // weight_scale_2 (per tensor)
  const __nv_bfloat16* __restrict__ x;  // [m, k]    activations, row stride k; 16-byte aligned (or null)
  float* __restrict__ y;                // [m, n]    output, rows y_stride apart
  int m, n, k;
  // [splits, m, n] f32 partial sums of the k-slices, reduced in a second pass; at least
  // nvfp4_gemv_workspace_bytes(m, n, k) bytes. May be null when that size is 0.
  float* __restrict__ workspace = nullptr;
  // f32 activations instead of x: [m, k] rows x_f32_stride apart (0: k), 16-byte aligned, stride a multiple
  // of 4; rounded to bf16 (nearest even) in registers as they are loaded, so no cast pass runs before.
  const float* __restrict__ x_f32 = nullptr;
  int64_t x_f32_stride = 0;
  int64_t y_stride = 0;  // 0: n
  // When set (nvfp4_gemv_counter_bytes, zero before the first launch, left zero by every launch), the
  // k-slices are added by the last block of each row block instead of a second kernel; same bits either way.
  // One launch at a time may use a counter buffer.
  uint32_t* __restrict__ counters = nullptr;
};

// Most rows of x one launch handles (decode batches); larger m belongs to a GEMM.
constexpr int kNvfp4GemvMaxM = 8;

// Bytes of workspace nvfp4_gemv needs for this shape on any device (0 when k fits one slice).
size_t nvfp4_gemv_workspace_bytes(int m, int n, int k);
// Bytes of counters (one per row block) any device's configuration for n rows uses.
size_t nvfp4_gemv_counter_bytes(int n);

// Checks the shapes (k % 32 == 0, 1 <= m <= kNvfp4GemvMaxM, alignment, workspace; exactly one of x and
// x_f32 set) and the device's shared memory, then launches on `stream`: one split-K pass over the weights,
// plus a reduction pass when the chosen split has more than one k-slice and no counters are given.
// Deterministic: the same inputs give the same bits.
void nvfp4_gemv(const Nvfp4GemvParams& p, cudaStream_t stream);

}  // namespace ms::cuda
