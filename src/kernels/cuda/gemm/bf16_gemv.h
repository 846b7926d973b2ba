// Decode-time linear layer on BF16 (and FP8-block) weights: y [m, n] f32 = x [m, k] f32 . W^T for a handful
// of rows of x, in one launch. Memory-bound: the floor is the weight bytes over HBM bandwidth. x is read as
// f32 and rounded to bf16 (nearest even) in registers, as a bf16 GEMM on a cast copy of x would see it;
// products and sums in f32 on the tensor cores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gemm/bf16_gemv_config.h"

namespace ms::cuda {

struct Bf16GemvParams {
  const float* __restrict__ x = nullptr;  // [m, k] rows x_stride apart (any alignment; 16 bytes is faster)
  int64_t x_stride = 0;
  // [n, k] rows w_stride apart (a row slice of a larger weight: point at its first row); 16-byte aligned,
  // w_stride a multiple of 8.
  const __nv_bfloat16* __restrict__ w = nullptr;
  int64_t w_stride = 0;
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int m = 0, n = 0, k = 0;  // k a multiple of 8
  // When the launch splits k across blocks: [splits, m, n] f32 partial sums, and one counter per row block
  // that must be zero before the first launch (every launch leaves them zero again). Sizes from
  // bf16_gemv_scratch_bytes; may be null when those are 0. One launch at a time may use a counter buffer.
  float* __restrict__ partial = nullptr;
  uint32_t* __restrict__ counters = nullptr;
};

// Most rows of x one launch handles (decode batches); larger m belongs to a GEMM.
constexpr int kBf16GemvMaxM = 8;

struct Bf16GemvScratch {
  size_t partial_bytes = 0, counter_bytes = 0;
};
// Scratch bf16_gemv needs for this shape on any device (0 when k fits one slice of a block).
Bf16GemvScratch bf16_gemv_scratch_bytes(int m, int n, int k);

// Checks the shapes, alignment, scratch and the device's shared memory, then launches on `stream`.
// Deterministic: the same inputs on the same device give the same bits (partial sums are added in a fixed
// order by whichever block finishes last).
void bf16_gemv(const Bf16GemvParams& p, cudaStream_t stream);

// The same kernel on FP8 e4m3 weights with an f32 scale per 128 x 128 block (weight_scale_inv, as
// FP8-block checkpoints store it): the fp8 values are widened exactly to bf16 in registers, each 128-wide
// block's products are summed in f32 and multiplied by the row's block scale.
struct Fp8BlockGemvParams {
  const float* __restrict__ x = nullptr;  // [m, k] rows x_stride apart
  int64_t x_stride = 0;
  const uint8_t* __restrict__ w =
      nullptr;  // [rows, k] e4m3 of the whole weight (row stride k), 16-byte aligned
  const float* __restrict__ w_scale = nullptr;  // [ceil(rows / 128), ceil(k / 128)]
  int64_t row0 = 0;                             // rows [row0, row0 + n) are used
  float* __restrict__ y = nullptr;              // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int m = 0, n = 0, k = 0;                    // k a multiple of 16
  float* __restrict__ partial = nullptr;      // as Bf16GemvParams, sized by fp8_block_gemv_scratch_bytes
  uint32_t* __restrict__ counters = nullptr;  // as Bf16GemvParams
};
Bf16GemvScratch fp8_block_gemv_scratch_bytes(int m, int n, int k);
void fp8_block_gemv(const Fp8BlockGemvParams& p, cudaStream_t stream);

// The same with a given configuration instead of the chooser's (tests cover every split and tiling with
// it); throws when `c` does not cover the shape (bf16_gemv_config::why_invalid) or fit the device. Scratch:
// [c.splits, m, n] partial sums and c.row_blocks counters when c.splits > 1.
void bf16_gemv_with(const Bf16GemvParams& p, const bf16_gemv_config::Config& c, cudaStream_t stream);
void fp8_block_gemv_with(const Fp8BlockGemvParams& p, const bf16_gemv_config::Config& c, cudaStream_t stream);

}  // namespace ms::cuda
