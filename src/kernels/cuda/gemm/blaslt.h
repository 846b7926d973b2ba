// Dense GEMMs through cuBLASLt: y [m, n] f32 = x [m, k] W^T with W [n, k] row-major as checkpoints store it
// (in cuBLASLt's column-major terms: D [n, m] = op(A)=W^T-as-stored [n, k] x B = x^T [k, m], a "TN" GEMM).
// BF16 inputs with f32 accumulation and output, pure f32 (no TF32), or FP8 e4m3 inputs (the matrix rate
// ceiling's second figure).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ms::cuda {

// The cuBLASLt handle, its workspace (allocated once, here) and the algorithm chosen for each shape (the
// heuristic is asked once per shape, strides and pointer alignment; later calls only launch). Not
// thread-safe: one per executor and stream. Launches through it are capturable in CUDA graphs.
class BlasLtHandle {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  explicit BlasLtHandle(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~BlasLtHandle();
  BlasLtHandle(const BlasLtHandle&) = delete;
  BlasLtHandle& operator=(const BlasLtHandle&) = delete;

  struct Impl;
  Impl& impl() { return *impl_; }
  size_t workspace_bytes() const;
  size_t cached_plans() const;  // shapes planned so far

 private:
  std::unique_ptr<Impl> impl_;
};

struct GemmBf16Params {
  // [m, k] f32 rows x_f32_stride apart. When set, it is first cast (round to nearest even) into x_bf16,
  // which is then the caller's scratch; when null, x_bf16 is the input.
  const float* __restrict__ x_f32 = nullptr;
  int64_t x_f32_stride = 0;
  __nv_bfloat16* __restrict__ x_bf16 = nullptr;  // [m, k] rows x_bf16_stride apart
  int64_t x_bf16_stride = 0;
  const __nv_bfloat16* __restrict__ w = nullptr;  // [n, k] rows w_stride apart
  int64_t w_stride = 0;
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0, n = 0, k = 0;
};
void gemm_bf16(const GemmBf16Params& p, BlasLtHandle& lt, cudaStream_t stream);

// A batch of bf16 GEMMs with f32 output, one per b in [0, batch): y_b [m, n] = x_b [m, k] W_b^T, where
// x_b = x + b * x_batch_stride ([m, k] rows x_stride apart), y_b likewise, and W_b = w + b * w_batch_stride
// either [n, k] rows w_stride apart (w_kn false, the checkpoint layout of a linear) or [k, n] rows w_stride
// apart (w_kn true: y_b = x_b W_b). One cuBLASLt call; capturable.
struct GemmBf16BatchedParams {
  const __nv_bfloat16* __restrict__ x = nullptr;
  int64_t x_stride = 0, x_batch_stride = 0;
  const __nv_bfloat16* __restrict__ w = nullptr;
  int64_t w_stride = 0, w_batch_stride = 0;
  bool w_kn = false;
  float* __restrict__ y = nullptr;
  int64_t y_stride = 0, y_batch_stride = 0;
  int64_t m = 0, n = 0, k = 0, batch = 0;
};
void gemm_bf16_batched(const GemmBf16BatchedParams& p, BlasLtHandle& lt, cudaStream_t stream);

struct GemmF32Params {
  const float* __restrict__ x = nullptr;  // [m, k] rows x_stride apart
  int64_t x_stride = 0;
  const float* __restrict__ w = nullptr;  // [n, k] rows w_stride apart
  int64_t w_stride = 0;
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0, n = 0, k = 0;
};
void gemm_f32(const GemmF32Params& p, BlasLtHandle& lt, cudaStream_t stream);

// FP8 e4m3 x e4m3 on the tensor cores (sm_89+), f32 accumulation and output, one scale for the product
// (the two per-tensor scales multiplied). k, every stride and pointer 16-byte multiples/aligned (cuBLASLt
// refuses FP8 products on narrower rows).
struct GemmFp8Params {
  const uint8_t* __restrict__ x = nullptr;  // [m, k] e4m3 rows x_stride bytes apart
  int64_t x_stride = 0;
  const uint8_t* __restrict__ w = nullptr;  // [n, k] e4m3 rows w_stride bytes apart
  int64_t w_stride = 0;
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0, n = 0, k = 0;
  float scale = 1.0f;
};
void gemm_fp8(const GemmFp8Params& p, BlasLtHandle& lt, cudaStream_t stream);

}  // namespace ms::cuda
