// MoE routing on router logits: the reference (CPU) router and the interface a GPU routing kernel implements.
// Shapes are fixed per step (CUDA-graph safe): every token gets exactly top_k (expert, weight) slots.
#pragma once

#include <cstdint>

namespace ms::moe {

enum class Scoring { Sigmoid, Softmax };

struct RouterConfig {
  int n_experts = 0;
  int top_k = 0;
  int n_group = 1, topk_group = 1;  // group-limited selection (DeepSeek-V3: 8 / 4)
  Scoring scoring = Scoring::Sigmoid;
  bool use_correction_bias = true;  // noaux_tc: e_score_correction_bias is added for selection only
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// Opportunistic Expert Activation (decode only): keep each token's top-k0, fill the remaining slots, in the
// token's own score order, only with experts already in the batch's base set (the union of top-k0 sets),
// renormalise over the final set. k0 == top_k means plain routing. kmax caps the slots a token may fill.
struct OeaConfig {
  bool enabled = false;
  int k0 = 0;
  int kmax = 0;  // 0: top_k
};

struct RouterParams {
  const float* logits;           // [n_tokens, n_experts] router gate output, fp32
  const float* correction_bias;  // [n_experts] or null
  int32_t* topk_ids;             // [n_tokens, top_k] out; -1 for an unused slot (OEA may leave slots empty)
  float* topk_weights;           // [n_tokens, top_k] out; routed_scaling_factor applied; 0 for unused slots
  int n_tokens;
};

// The reference router. With oea.enabled, the base set spans all n_tokens of the call (for expert parallelism
// the caller passes the whole batch's logits gathered across ranks).
void route_cpu(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p);

// Distinct experts touched by a routed batch (ids < 0 ignored).
int count_distinct_experts(const int32_t* topk_ids, int n_tokens, int top_k, int n_experts);

}  // namespace ms::moe
