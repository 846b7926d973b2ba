// Row normalisations on the device, one block per row: RMSNorm, RMSNorm fused with the residual add, and
// LayerNorm with bias. Sums are f32 (block-wide tree order, so last bits differ from the CPU's sequential
// sums).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda {

// out = x / sqrt(mean(x^2) + eps) * weight.
struct RmsNormParams {
  const float* x = nullptr;  // [m, n] rows x_stride apart; may alias out (not __restrict__)
  int64_t x_stride = 0;
  const float* __restrict__ weight = nullptr;  // [n]
  float* out = nullptr;                        // [m, n] rows out_stride apart
  int64_t out_stride = 0;
  int64_t m = 0, n = 0;
  float eps = 1e-6f;
};
void rms_norm(const RmsNormParams& p, cudaStream_t stream);

// h += delta; out = rmsnorm(h) * weight (the residual stream h keeps the sum). out may alias delta, never h.
struct AddRmsNormParams {
  float* __restrict__ h = nullptr;  // [m, n] residual, rows h_stride apart; updated in place
  int64_t h_stride = 0;
  const float* delta = nullptr;  // [m, n] rows delta_stride apart; may alias out
  int64_t delta_stride = 0;
  const float* __restrict__ weight = nullptr;  // [n]
  float* out = nullptr;                        // [m, n] rows out_stride apart
  int64_t out_stride = 0;
  int64_t m = 0, n = 0;
  float eps = 1e-6f;
};
void add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream);

// out = (x - mean) / sqrt(var + eps) * weight + bias (biased variance, two passes as the CPU reference).
struct LayerNormParams {
  const float* x = nullptr;  // [m, n] rows x_stride apart; may alias out
  int64_t x_stride = 0;
  const float* __restrict__ weight = nullptr;  // [n]
  const float* __restrict__ bias = nullptr;    // [n], or null for none
  float* out = nullptr;                        // [m, n] rows out_stride apart
  int64_t out_stride = 0;
  int64_t m = 0, n = 0;
  float eps = 1e-6f;
};
void layer_norm(const LayerNormParams& p, cudaStream_t stream);

}  // namespace ms::cuda
