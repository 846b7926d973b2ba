// A linear layer on the device, y [m, n] = x [m, k] W^T for a weight in any stored format: which path runs
// (linear_plan, a pure function of format and shape, kept apart from the launch), the scratch each path
// needs, and one launcher that runs a given path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common/weight.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/blaslt.h"

namespace ms::cuda {

enum class LinearPath : uint8_t {
  Direct,         // direct_linear: CUDA cores, weight dequantised on the fly, f32 activations
  BlasLtF32,      // f32 weights: cuBLASLt f32 GEMM
  BlasLtBf16,     // bf16 weights: x cast to bf16 scratch, cuBLASLt bf16 GEMM
  DequantBlasLt,  // FP8-block / NVFP4: weight rows dequantised to bf16 scratch, x cast, cuBLASLt bf16 GEMM
  GemvBf16,       // bf16 weights, decode rows: bf16_gemv (f32 x rounded in registers, one launch)
  GemvFp8Block,   // FP8-block weights (128 x 128 scales), decode rows: fp8_block_gemv, likewise
};
const char* linear_path_name(LinearPath p);

// Every row count goes to cuBLASLt when k keeps every bf16 row 16-byte aligned (f32: k % 4 == 0): in a decode
// step of a glm5-slice checkpoint on an H200 (2026-11-30) the direct kernel streamed bf16 weights at only
// 86-535 GB/s at one row, where cuBLASLt's products run near the copy bandwidth. BF16 weights at decode row
// counts (m <= kBf16GemvMaxM) go to bf16_gemv instead: cuBLASLt needs x cast to bf16 first and picks split-K
// with a separate reduction kernel there, three launches where the GEMV takes one; FP8-block weights at those
// counts (k % 16 == 0; the 128-wide blocks the checkpoints use) to fp8_block_gemv, which reads the fp8 bytes
// instead of expanding the weight. Otherwise FP8-block and NVFP4 weights are expanded to bf16 first (the ops
// layer sends NVFP4 decode batches to nvfp4_gemv instead). The direct kernel stays for the shapes cuBLASLt
// cannot take. Measured on an H200 (bench_cuda_kernels bf16, 2026-12-01): bf16_gemv beats cast + cuBLASLt
// 1.2-1.65x up to 17 MB of weights (indexer wk, kv_a, indexer wq_b), is even at 25 MB and 0.6-0.9x on the
// larger ones (q_b, o_proj, the dense MLP, lm_head), so BF16 weights above kBf16GemvMaxBytes keep cuBLASLt.
constexpr int64_t kBf16GemvMaxBytes = int64_t{20} << 20;
inline LinearPath linear_plan(WeightFormat format, int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return LinearPath::Direct;
  if (format == WeightFormat::F32) return k % 4 == 0 ? LinearPath::BlasLtF32 : LinearPath::Direct;
  if (k % 8 != 0) return LinearPath::Direct;
  const bool gemv = m <= kBf16GemvMaxM && n <= INT32_MAX && k <= INT32_MAX;
  if (format == WeightFormat::BF16)
    return gemv && n * k * 2 <= kBf16GemvMaxBytes ? LinearPath::GemvBf16 : LinearPath::BlasLtBf16;
  if (format == WeightFormat::FP8Block && gemv && k % 16 == 0) return LinearPath::GemvFp8Block;
  return LinearPath::DequantBlasLt;
}

// Scratch a path needs, in bytes: x_bytes for the bf16 copy of x [m, k] (row stride k), w_bytes for the
// dequantised weight [n, k] (row stride k), gemv_partial_bytes and gemv_counter_bytes for bf16_gemv's split-K
// partial sums and its counters (zeroed once, left zero by every launch). Zero where the path needs none.
struct LinearScratchBytes {
  size_t x_bytes = 0, w_bytes = 0;
  size_t gemv_partial_bytes = 0, gemv_counter_bytes = 0;
};
LinearScratchBytes linear_scratch_bytes(LinearPath path, int64_t m, int64_t n, int64_t k);

struct LinearParams {
  const float* __restrict__ x = nullptr;  // [m, k] rows x_stride apart (k = w.cols)
  int64_t x_stride = 0;
  DeviceWeight w;                   // [w.rows, k]; rows [row0, row0 + n) are used
  int64_t row0 = 0, n = 0;          // output features computed
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0;
  // Scratch for the cuBLASLt paths, linear_scratch_bytes(path, m, n, k) each, 256-byte aligned preferred.
  __nv_bfloat16* __restrict__ x_scratch = nullptr;  // [m, k] row stride k
  __nv_bfloat16* __restrict__ w_scratch = nullptr;  // [n, k] row stride k
  float* __restrict__ gemv_partial = nullptr;       // GemvBf16 / GemvFp8Block: the GEMV's partial sums
  uint32_t* __restrict__ gemv_counters = nullptr;   // GemvBf16 / GemvFp8Block: its counters (zeroed)
};

// Runs `path` (normally linear_plan(p.w.format, p.m, p.n, p.w.cols)); throws when the path does not fit the
// weight's format or its scratch is missing. `lt` is used by the cuBLASLt paths only.
void linear(const LinearParams& p, LinearPath path, BlasLtHandle& lt, cudaStream_t stream);

}  // namespace ms::cuda
