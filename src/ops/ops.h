// Op entry points: each checks shapes and dtypes once, fills its kernel's Params struct and dispatches to the
// backend of the tensors' device (CPU today; a CUDA backend slots in beside it). Activations are f32.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/tensor.h"
#include "ops/linear_weight.h"

namespace ms::ops {

// y [m, w.out] = x [m, w.in] W^T. x and y may be column slices (row stride != width).
void linear(const Tensor& x, const LinearWeight& w, const Tensor& y);
// Rows [row0, row0 + y.size(1)) of w only.
void linear_rows(const Tensor& x, const LinearWeight& w, int64_t row0, const Tensor& y);

// out [m, hidden] = table[ids]; every id is checked against the vocabulary.
void embedding(std::span<const int32_t> ids, const LinearWeight& table, const Tensor& out);

// out = RMSNorm(x) * weight; out may alias x. x, out [m, n]; weight f32 [n].
void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
// out = LayerNorm(x) * weight + bias.
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out);

struct RopeTable {
  Tensor inv_freq;  // f32 [dim / 2]
  float attention_scaling = 1.0f;
  bool interleaved = false;
  int64_t dim() const { return inv_freq.numel() * 2; }
};
// Rotates channels [offset, offset + dim) of each head of x [m, heads, head_dim] in place.
void rope(const Tensor& x, int64_t offset, std::span<const int32_t> positions, const RopeTable& table);

// out [m, n] = silu(x[:, :n]) * x[:, n:], x [m, 2n].
void silu_mul(const Tensor& x, const Tensor& out);

// y += x, same shape, contiguous.
void add_inplace(const Tensor& y, const Tensor& x);

}  // namespace ms::ops
