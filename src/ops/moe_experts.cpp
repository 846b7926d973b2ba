#include "ops/moe_experts.h"

#include "ops/cuda/cuda_ops.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace ms::ops {

MoeScratch MoeScratch::make(const TensorAlloc& alloc, int64_t max_tokens, int top_k, int n_experts,
                            int64_t hidden, int64_t intermediate) {
  MoeScratch s;
  s.offsets = alloc({n_experts + 1}, DType::I32);
  s.cursor = alloc({n_experts}, DType::I32);
  s.order = alloc({max_tokens * top_k}, DType::I32);
  s.x = alloc({max_tokens * hidden}, DType::F32);
  s.gate_up = alloc({max_tokens * 2 * intermediate}, DType::F32);
  s.act = alloc({max_tokens * intermediate}, DType::F32);
  s.y = alloc({max_tokens * hidden}, DType::F32);
  return s;
}

namespace {

// The first rows x cols values of a flat scratch tensor as a [rows, cols] matrix.
Tensor rows_of(const Tensor& flat, int64_t rows, int64_t cols, std::string_view what) {
  MS_CHECK(flat.dtype() == DType::F32 && flat.dim() == 1 && flat.numel() >= rows * cols,
           "moe scratch {} {} cannot hold [{}, {}]", what, flat.desc(), rows, cols);
  return flat.slice(0, 0, rows * cols).view({rows, cols});
}

}  // namespace

void moe_experts(const Ctx& ctx, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                 std::span<const ExpertWeights> experts, const Tensor& out, const MoeScratch& s) {
  check_device(ctx, "moe_experts", {&x, &topk_ids, &topk_weights, &out, &s.offsets, &s.order, &s.x});
  MS_CHECK(x.dtype() == DType::F32 && x.dim() == 2 && x.is_contiguous(),
           "moe input must be contiguous f32 [m, hidden], got {}", x.desc());
  MS_CHECK(out.dtype() == DType::F32 && out.shape() == x.shape() && out.is_contiguous(),
           "moe output {} vs input {}", out.desc(), x.desc());
  const int64_t m = x.size(0), hidden = x.size(1);
  const int n_experts = static_cast<int>(experts.size());
  MS_CHECK(topk_ids.dtype() == DType::I32 && topk_ids.dim() == 2 && topk_ids.size(0) == m &&
               topk_ids.is_contiguous(),
           "moe routing ids must be contiguous i32 [{}, top_k], got {}", m, topk_ids.desc());
  const int top_k = static_cast<int>(topk_ids.size(1));
  MS_CHECK(topk_weights.dtype() == DType::F32 && topk_weights.shape() == topk_ids.shape() &&
               topk_weights.is_contiguous(),
           "moe routing weights {} vs ids {}", topk_weights.desc(), topk_ids.desc());
  MS_CHECK(s.offsets.dtype() == DType::I32 && s.offsets.numel() >= n_experts + 1 &&
               s.cursor.dtype() == DType::I32 && s.cursor.numel() >= n_experts &&
               s.order.dtype() == DType::I32 && s.order.numel() >= m * top_k,
           "moe scratch sized for fewer tokens or experts than {} x {} of {}", m, top_k, n_experts);
  MS_OPS_ON_CUDA(ctx, cuda_ops::moe_experts(ctx, x, topk_ids, topk_weights, experts, out));
  const int32_t* ids = topk_ids.data<int32_t>();
  const float* wts = topk_weights.data<float>();
  const int64_t n_slots = m * top_k;
  int32_t* offsets = s.offsets.data<int32_t>();
  int32_t* cursor = s.cursor.data<int32_t>();
  int32_t* order = s.order.data<int32_t>();
  std::fill(offsets, offsets + n_experts + 1, 0);
  for (int64_t slot = 0; slot < n_slots; ++slot) {
    const int32_t e = ids[slot];
    MS_CHECK(e < n_experts, "routed expert {} outside {} experts", e, n_experts);
    if (e >= 0) ++offsets[e + 1];
  }
  for (int e = 0; e < n_experts; ++e) offsets[e + 1] += offsets[e];
  std::copy(offsets, offsets + n_experts, cursor);
  for (int64_t slot = 0; slot < n_slots; ++slot)
    if (ids[slot] >= 0) order[cursor[ids[slot]]++] = static_cast<int32_t>(slot);
  const float* xd = x.data<float>();
  float* od = out.data<float>();
  for (int e = 0; e < n_experts; ++e) {
    const int64_t cnt = offsets[e + 1] - offsets[e];
    if (cnt == 0) continue;
    const ExpertWeights& w = experts[static_cast<size_t>(e)];
    const int64_t inter = w.gate.out;
    Tensor xs = rows_of(s.x, cnt, hidden, "x");
    Tensor gu = rows_of(s.gate_up, cnt, 2 * inter, "gate_up");
    Tensor act = rows_of(s.act, cnt, inter, "act");
    Tensor ys = rows_of(s.y, cnt, hidden, "y");
    float* xsd = xs.data<float>();
    for (int64_t i = 0; i < cnt; ++i) {
      const int64_t tok = order[offsets[e] + i] / top_k;
      std::copy(xd + tok * hidden, xd + (tok + 1) * hidden, xsd + i * hidden);
    }
    linear(ctx, xs, w.gate, gu.slice(1, 0, inter));
    linear(ctx, xs, w.up, gu.slice(1, inter, 2 * inter));
    silu_mul(ctx, gu, act);
    linear(ctx, act, w.down, ys);
    const float* yd = ys.data<float>();
    for (int64_t i = 0; i < cnt; ++i) {
      const int32_t slot = order[offsets[e] + i];
      const int64_t tok = slot / top_k;
      const float wt = wts[slot];
      float* o = od + tok * hidden;
      const float* y = yd + i * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += wt * y[c];
    }
  }
}

}  // namespace ms::ops
