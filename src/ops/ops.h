// Op entry points: each takes the op context first, checks shapes, dtypes and devices once, fills its
// kernel's Params struct and dispatches on ctx.device (the CPU today; a CUDA backend slots in beside it, and
// until it exists a CUDA context throws "op X: no CUDA backend built"). Activations are f32.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/tensor.h"
#include "ops/ctx.h"
#include "ops/linear_weight.h"

namespace ms::ops {

// y [m, w.out] = x [m, w.in] W^T. x and y may be column slices (row stride != width).
void linear(const Ctx& ctx, const Tensor& x, const LinearWeight& w, const Tensor& y);
// Rows [row0, row0 + y.size(1)) of w only.
void linear_rows(const Ctx& ctx, const Tensor& x, const LinearWeight& w, int64_t row0, const Tensor& y);

// out [m, hidden] = table[ids]; ids i32 [m], every id is checked against the vocabulary.
void embedding(const Ctx& ctx, const Tensor& ids, const LinearWeight& table, const Tensor& out);

// out = RMSNorm(x) * weight; out may alias x. x, out [m, n]; weight f32 [n].
void rms_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
// h += delta; xn = RMSNorm(h) * weight (the residual add fused with the next norm). h, delta, xn f32 [m, n]
// contiguous; the result is bit-identical to add_inplace then rms_norm.
void add_rms_norm(const Ctx& ctx, const Tensor& h, const Tensor& delta, const Tensor& weight, float eps,
                  const Tensor& xn);
// out = LayerNorm(x) * weight + bias.
void layer_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                const Tensor& out);

struct RopeTable {
  Tensor inv_freq;  // f32 [dim / 2]
  float attention_scaling = 1.0f;
  bool interleaved = false;
  int64_t dim() const { return inv_freq.numel() * 2; }
};
// Rotates channels [offset, offset + dim) of each head of x [m, heads, head_dim] in place; positions i32 [m].
void rope(const Ctx& ctx, const Tensor& x, int64_t offset, const Tensor& positions, const RopeTable& table);

// out [m, n] = silu(x[:, :n]) * x[:, n:], x [m, 2n].
void silu_mul(const Ctx& ctx, const Tensor& x, const Tensor& out);

// y += x, same shape, contiguous.
void add_inplace(const Ctx& ctx, const Tensor& y, const Tensor& x);
// x *= s, contiguous f32.
void scale(const Ctx& ctx, const Tensor& x, float s);
// Every byte of a contiguous tensor set to zero.
void fill_zero(const Ctx& ctx, const Tensor& x);
// out[i] = ids[i] < 0 ? -1 : map[ids[i]] (logical expert ids to a rank's local slots); ids, out i32 same
// shape contiguous, map i32 [n], every id below n.
void remap_ids(const Ctx& ctx, const Tensor& ids, const Tensor& map, const Tensor& out);
// Logical expert ids to a rank's local slots when experts have several copies over the EP ranks: assignment
// (t, j) of ids [m, k] goes to copy c = (t + j) mod copies[e] of its expert e, and
// out[t, j] = slots[e, c] (this rank's slot holding that copy, -1 when another rank holds it); a negative id
// gives -1. Every rank computes the same c, so exactly one rank runs each assignment. ids, out i32 [m, k]
// contiguous; copies i32 [E], each in [1, R]; slots i32 [E, R] contiguous; every id below E.
void remap_ids_replicated(const Ctx& ctx, const Tensor& ids, const Tensor& copies, const Tensor& slots,
                          const Tensor& out);
// ids_out [m, k + 1] = (ids [m, k], id) and wts_out [m, k + 1] = (wts [m, k], weight) row by row: a router's
// choice widened by one expert every token takes (the shared expert run as a routed one). i32 / f32,
// contiguous.
void append_expert_slot(const Ctx& ctx, const Tensor& ids, const Tensor& wts, int32_t id, float weight,
                        const Tensor& ids_out, const Tensor& wts_out);
// out [n, cols] = x[rows[i]] for rows i32 [n], each in [0, x.size(0)); x [m, cols] f32 contiguous.
void gather_rows(const Ctx& ctx, const Tensor& x, const Tensor& rows, const Tensor& out);

}  // namespace ms::ops
