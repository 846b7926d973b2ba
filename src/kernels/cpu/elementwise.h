// Row-wise reference kernels of the forward pass: embedding gather, RMSNorm, LayerNorm, RoPE, SiLU-and-mul.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_view.h"

namespace ms::kernels::cpu {

struct EmbeddingParams {
  const int32_t* __restrict__ ids = nullptr;  // [m], each in [0, table.rows)
  WeightView table;                           // [vocab, hidden]
  float* __restrict__ out = nullptr;          // [m, hidden] contiguous
  int64_t m = 0;
};
void embedding(const EmbeddingParams& p);

// out = x / sqrt(mean(x^2) + eps) * weight (and LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias).
struct NormParams {
  const float* __restrict__ x = nullptr;  // [m, n] rows x_stride apart
  int64_t x_stride = 0;
  const float* __restrict__ weight = nullptr;  // [n]
  const float* __restrict__ bias = nullptr;    // [n] (LayerNorm only)
  float* out = nullptr;                        // [m, n] rows out_stride apart; may alias x
  int64_t out_stride = 0;
  int64_t m = 0, n = 0;
  float eps = 1e-6f;
};
void rms_norm(const NormParams& p);
void layer_norm(const NormParams& p);

// Rotates `dim` channels starting at `offset` of each head in place, at each row's position.
// Interleaved: pairs (2i, 2i+1) rotate by angle pos * inv_freq[i]; otherwise pairs (i, i + dim/2). Both match
// Hugging Face's rotations up to a fixed permutation of the output channels applied equally to q and k (the
// interleaved form there de-interleaves first), so dot products q.k are identical.
struct RopeParams {
  float* x = nullptr;  // [m, heads, ...] row r head h at x + r * row_stride + h * head_stride + offset
  int64_t row_stride = 0, head_stride = 0, offset = 0;
  int64_t m = 0, heads = 0, dim = 0;
  const int32_t* __restrict__ positions = nullptr;  // [m]
  const float* __restrict__ inv_freq = nullptr;     // [dim / 2]
  float attention_scaling = 1.0f;                   // YaRN multiplies cos and sin by it
  bool interleaved = false;
};
void rope(const RopeParams& p);

// out[r, i] = silu(x[r, i]) * x[r, n + i]  (x rows hold gate then up, 2n wide).
struct SiluMulParams {
  const float* __restrict__ x = nullptr;  // [m, 2n] rows x_stride apart
  int64_t x_stride = 0;
  float* __restrict__ out = nullptr;  // [m, n] rows out_stride apart
  int64_t out_stride = 0;
  int64_t m = 0, n = 0;
};
void silu_mul(const SiluMulParams& p);

// y[i] += x[i] for n elements.
void add_inplace(float* __restrict__ y, const float* __restrict__ x, int64_t n);

// x[i] *= s for n elements.
void scale_inplace(float* __restrict__ x, float s, int64_t n);

// out[i, :] = x[rows[i], :] for i < n; x [*, cols] and out [n, cols] contiguous.
struct GatherRowsParams {
  const float* __restrict__ x = nullptr;
  const int32_t* __restrict__ rows = nullptr;  // [n]
  float* __restrict__ out = nullptr;
  int64_t n = 0, cols = 0;
};
void gather_rows(const GatherRowsParams& p);

}  // namespace ms::kernels::cpu
