#include "ops/moe_experts.h"

#include "core/error.h"
#include "ops/ops.h"

namespace ms::ops {

int moe_experts(const Tensor& x, std::span<const int32_t> topk_ids, std::span<const float> topk_weights,
                int top_k, std::span<const ExpertWeights> experts, const Tensor& out, MoeScratch& s) {
  MS_CHECK(x.dtype() == DType::F32 && x.dim() == 2 && x.is_contiguous(),
           "moe input must be contiguous f32 [m, hidden], got {}", x.desc());
  MS_CHECK(out.dtype() == DType::F32 && out.shape() == x.shape() && out.is_contiguous(),
           "moe output {} vs input {}", out.desc(), x.desc());
  const int64_t m = x.size(0), hidden = x.size(1);
  const int n_experts = static_cast<int>(experts.size());
  MS_CHECK(static_cast<int64_t>(topk_ids.size()) == m * top_k && topk_weights.size() == topk_ids.size(),
           "moe routing holds {} slots, expected {} x {}", topk_ids.size(), m, top_k);
  s.offsets.assign(static_cast<size_t>(n_experts) + 1, 0);
  for (int32_t e : topk_ids) {
    MS_CHECK(e < n_experts, "routed expert {} outside {} experts", e, n_experts);
    if (e >= 0) ++s.offsets[static_cast<size_t>(e) + 1];
  }
  for (int e = 0; e < n_experts; ++e) s.offsets[e + 1] += s.offsets[e];
  s.order.resize(static_cast<size_t>(s.offsets[n_experts]));
  {
    std::vector<int32_t> fill(s.offsets.begin(), s.offsets.end() - 1);
    for (size_t slot = 0; slot < topk_ids.size(); ++slot)
      if (topk_ids[slot] >= 0)
        s.order[static_cast<size_t>(fill[topk_ids[slot]]++)] = static_cast<int32_t>(slot);
  }
  int used = 0;
  const float* xd = x.data<float>();
  float* od = out.data<float>();
  for (int e = 0; e < n_experts; ++e) {
    const int64_t cnt = s.offsets[e + 1] - s.offsets[e];
    if (cnt == 0) continue;
    ++used;
    const ExpertWeights& w = experts[static_cast<size_t>(e)];
    const int64_t inter = w.gate.out;
    s.x.resize(static_cast<size_t>(cnt * hidden));
    s.gate_up.resize(static_cast<size_t>(cnt * 2 * inter));
    s.act.resize(static_cast<size_t>(cnt * inter));
    s.y.resize(static_cast<size_t>(cnt * hidden));
    for (int64_t i = 0; i < cnt; ++i) {
      const int64_t tok = s.order[static_cast<size_t>(s.offsets[e] + i)] / top_k;
      std::copy(xd + tok * hidden, xd + (tok + 1) * hidden, s.x.begin() + i * hidden);
    }
    Tensor xs = Tensor::borrow(s.x.data(), {cnt, hidden}, DType::F32);
    Tensor gu = Tensor::borrow(s.gate_up.data(), {cnt, 2 * inter}, DType::F32);
    Tensor act = Tensor::borrow(s.act.data(), {cnt, inter}, DType::F32);
    Tensor ys = Tensor::borrow(s.y.data(), {cnt, hidden}, DType::F32);
    linear(xs, w.gate, gu.slice(1, 0, inter));
    linear(xs, w.up, gu.slice(1, inter, 2 * inter));
    silu_mul(gu, act);
    linear(act, w.down, ys);
    for (int64_t i = 0; i < cnt; ++i) {
      const int32_t slot = s.order[static_cast<size_t>(s.offsets[e] + i)];
      const int64_t tok = slot / top_k;
      const float wt = topk_weights[static_cast<size_t>(slot)];
      float* o = od + tok * hidden;
      const float* y = s.y.data() + i * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += wt * y[c];
    }
  }
  return used;
}

}  // namespace ms::ops
