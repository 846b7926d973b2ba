#include "ops/moe_experts.h"

#include "ops/cuda/cuda_ops.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/moe.h"
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
  // All touched experts in one parallel region (kernels/cpu/moe.h): gate/up tiles of every expert split
  // over the threads together, then every down tile, then the weighted sums.
  MS_CHECK(top_k <= kernels::cpu::kMoeMaxTopK, "moe top_k {} above {}", top_k, kernels::cpu::kMoeMaxTopK);
  static thread_local std::vector<kernels::cpu::WeightView> views;
  views.resize(3 * static_cast<size_t>(n_experts));
  int64_t inter = -1;
  for (int e = 0; e < n_experts; ++e) {
    if (offsets[e + 1] == offsets[e]) continue;
    const ExpertWeights& w = experts[static_cast<size_t>(e)];
    if (inter < 0) inter = w.gate.out;
    MS_CHECK(w.gate.out == inter && w.up.out == inter && w.gate.in == hidden && w.up.in == hidden &&
                 w.down.in == inter && w.down.out == hidden,
             "moe expert {}: gate {}x{}, up {}x{}, down {}x{} vs hidden {} and intermediate {}", e,
             w.gate.out, w.gate.in, w.up.out, w.up.in, w.down.out, w.down.in, hidden, inter);
    const auto ue = static_cast<size_t>(e);
    views[ue] = w.gate.cpu_view();
    views[static_cast<size_t>(n_experts) + ue] = w.up.cpu_view();
    views[2 * static_cast<size_t>(n_experts) + ue] = w.down.cpu_view();
  }
  if (inter < 0) return;
  const int64_t scratch_rows = std::min(
      {s.x.numel() / hidden, s.gate_up.numel() / (2 * inter), s.act.numel() / inter, s.y.numel() / hidden});
  MS_CHECK(s.x.dtype() == DType::F32 && s.gate_up.dtype() == DType::F32 && s.act.dtype() == DType::F32 &&
               s.y.dtype() == DType::F32 && scratch_rows >= m,
           "moe scratch holds {} rows, fewer than the {} tokens", scratch_rows, m);
  kernels::cpu::MoeExpertsParams p;
  p.x = x.data<float>();
  p.topk_ids = ids;
  p.topk_weights = wts;
  p.offsets = offsets;
  p.order = order;
  p.gate = views.data();
  p.up = views.data() + n_experts;
  p.down = views.data() + 2 * static_cast<int64_t>(n_experts);
  p.m = m;
  p.hidden = hidden;
  p.inter = inter;
  p.top_k = top_k;
  p.n_experts = n_experts;
  p.xs = s.x.data<float>();
  p.gate_up = s.gate_up.data<float>();
  p.act = s.act.data<float>();
  p.ys = s.y.data<float>();
  p.scratch_rows = scratch_rows;
  p.out = out.data<float>();
  kernels::cpu::moe_experts(p);
}

}  // namespace ms::ops
