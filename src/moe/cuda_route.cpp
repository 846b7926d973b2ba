#if MOESERVE_HAVE_CUDA
#include "moe/cuda_route.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/moe/moe_route.h"

namespace ms::moe {

namespace {

cuda::MoeRouteConfig to_gpu(const RouterConfig& c, const OeaConfig& o, bool use_bias) {
  cuda::MoeRouteConfig g;
  g.n_experts = c.n_experts;
  g.top_k = c.top_k;
  g.n_group = c.n_group;
  g.topk_group = c.topk_group;
  g.scoring = c.scoring == Scoring::Sigmoid ? cuda::MoeScoring::Sigmoid : cuda::MoeScoring::Softmax;
  g.use_correction_bias = use_bias;
  g.norm_topk_prob = c.norm_topk_prob;
  g.routed_scaling_factor = c.routed_scaling_factor;
  g.group_score =
      c.group_score == GroupScore::Top2Sum ? cuda::MoeGroupScore::Top2Sum : cuda::MoeGroupScore::Max;
  g.masked_fill =
      c.masked_fill == MaskedFill::NegInf ? cuda::MoeMaskedFill::NegInf : cuda::MoeMaskedFill::Zero;
  g.oea_enabled = o.enabled;
  g.oea_k0 = o.k0;
  g.oea_kmax = o.kmax;
  return g;
}

}  // namespace

void route_step_cuda(const ops::Ctx& ctx, const RouterConfig& cfg, const OeaConfig& oea, const Tensor& logits,
                     const Tensor& correction_bias, const Tensor& decode_mask, const Tensor& topk_ids,
                     const Tensor& topk_weights, const Tensor& plain_ids, const Tensor& plain_weights_scratch,
                     const Tensor& base_set_scratch) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const bool bias = cfg.use_correction_bias && (correction_bias.defined() && correction_bias.numel() > 0);
  const bool has_mask = (decode_mask.defined() && decode_mask.numel() > 0);
  MS_CHECK(base_set_scratch.numel() >= cfg.n_experts,
           "moe_route: base-set scratch {} holds fewer than {} experts", base_set_scratch.desc(),
           cfg.n_experts);
  cuda::MoeRouteParams p;
  p.logits = logits.data<float>();
  p.ld_logits = logits.stride(0);
  p.correction_bias = bias ? correction_bias.data<float>() : nullptr;
  p.base_set = base_set_scratch.data<uint8_t>();
  p.m = static_cast<int>(logits.size(0));
  if ((plain_ids.defined() && plain_ids.numel() > 0)) {
    // The baseline for expert statistics: every row routed plainly.
    p.decode_mask = nullptr;
    p.topk_ids = plain_ids.data<int32_t>();
    p.topk_weights = plain_weights_scratch.data<float>();
    cuda::moe_route(to_gpu(cfg, OeaConfig{}, bias), p, stream);
  }
  p.decode_mask = has_mask ? decode_mask.data<uint8_t>() : nullptr;
  p.topk_ids = topk_ids.data<int32_t>();
  p.topk_weights = topk_weights.data<float>();
  // Without decode rows OEA has nothing to act on: route every row plainly.
  cuda::moe_route(to_gpu(cfg, has_mask ? oea : OeaConfig{}, bias), p, stream);
}

}  // namespace ms::moe
#endif
