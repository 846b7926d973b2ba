// MoE routing on router logits: the reference (CPU) router and the interface a GPU routing kernel implements.
// Shapes are fixed per step (CUDA-graph safe): every token gets exactly top_k (expert, weight) slots.
//
// Routing of one token, as Hugging Face transformers does it (DeepseekV3MoE / GlmMoeDsaMoE
// route_tokens_to_experts, Qwen2Moe / DeepseekV2 greedy softmax):
//   score[e]     = sigmoid(logit[e])  or  softmax(logits)[e]                     (fp32)
//   selection[e] = score[e] + correction_bias[e]   (noaux_tc; score[e] when there is no bias)
//   n_group > 1: group score = sum of the 2 largest selection scores of each group (Top2Sum, DeepSeek-V3)
//                or the largest one (Max, DeepSeek-V2 group_limited_greedy); the topk_group best groups stay
//                eligible, the experts of the other groups are masked;
//   ids          = top_k of selection over the eligible experts;
//   weight[i]    = score[ids[i]] (the unbiased score), / (sum + 1e-20) when norm_topk_prob, *
//   routed_scaling_factor.
//
// Tie rule (deterministic, the same on every backend): a higher value wins; among equal values the lower
// index wins (lower expert id for experts, lower group id for groups). torch.topk leaves ties unspecified.
// Output order: slots are sorted by selection score, descending (torch returns them unsorted; weights and the
// set of experts are what matter). NaN or infinite logits / bias are rejected with an ms::Error.
#pragma once

#include <cstdint>

namespace ms::moe {

enum class Scoring { Sigmoid, Softmax };

// How a group is scored for group-limited selection (n_group > 1).
enum class GroupScore {
  Top2Sum,  // DeepSeek-V3 / GLM (noaux_tc): sum of the two best selection scores of the group
  Max,      // DeepSeek-V2 group_limited_greedy: the best selection score of the group
};

// What a masked (not selected) group's experts score in the final top_k.
//   NegInf: they can never be chosen (GLM-5 in transformers, DeepSeek's own inference code, vLLM, SGLang).
//   Zero:   transformers' DeepseekV3MoE masks with 0.0, so a masked expert beats an eligible one whose biased
//           score is negative. Use it only for bit-parity with that code; ties among the zeros go to the
//           lower expert id here (torch leaves them unspecified).
enum class MaskedFill { NegInf, Zero };

struct RouterConfig {
  int n_experts = 0;
  int top_k = 0;
  int n_group = 1, topk_group = 1;  // group-limited selection (DeepSeek-V3: 8 / 4)
  Scoring scoring = Scoring::Sigmoid;
  bool use_correction_bias = true;  // noaux_tc: e_score_correction_bias is added for selection only
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  GroupScore group_score = GroupScore::Top2Sum;
  MaskedFill masked_fill = MaskedFill::NegInf;
};

// Opportunistic Expert Activation (decode only): keep each token's top-k0, fill the remaining slots, in the
// token's own score order, only with experts already in the batch's base set (the union of top-k0 sets),
// renormalise over the final set. k0 == top_k means plain routing. kmax caps the slots a token may fill.
//
// Precisely, per token t (selection order = selection score descending, ties to the lower id, over the
// experts eligible for t under group-limited selection only):
//   kept(t)  = the first k0 experts in t's selection order            (identical to t's plain top-k0)
//   base     = OR over the batch of kept(t)                            (a flag per expert)
//   final(t) = kept(t) + the next experts in t's selection order that are in base, until kmax slots are full
//   weights over final(t) as in plain routing (norm_topk_prob divides by their sum, then
//   routed_scaling_factor); slots past |final(t)| hold id -1 and weight 0.
// With MaskedFill::Zero, a token's selection order also holds its masked experts, at value 0 (where plain
// routing would rank them), so k0 == top_k still equals plain routing.
//
// Data flow, the same on the GPU without a host sync (two kernels in stream order, graph-capturable):
//   1. oea_base_set:  one block per token computes its selection order and top-k0; sets
//                     base_set[e] = 1 for its kept experts (plain byte stores of 1: races are benign), into a
//                     [n_experts] uint8 buffer zeroed by a memset node earlier in the same graph.
//   2. (expert parallelism) all-reduce(max) of base_set over the EP group: max over {0,1} flags is OR, and
//   NCCL
//                     has max but no bitwise OR, which is why the base set is one byte per expert, not bits.
//   3. route_oea_fill: one block per token recomputes its selection order (cheaper than storing it) and fills
//                     its slots from base_set; weights as above.
// route_cpu with oea.enabled runs 1 and 3 on the tokens of the call; the two functions below are steps 1 and
// 3 separately, so a caller with expert parallelism can put the all-reduce between them.
struct OeaConfig {
  bool enabled = false;
  int k0 = 0;
  int kmax = 0;  // 0: top_k
};

struct RouterParams {
  const float* logits;           // [n_tokens, n_experts] router gate output, fp32
  const float* correction_bias;  // [n_experts] or null; required when cfg.use_correction_bias
  int32_t* topk_ids;             // [n_tokens, top_k] out; -1 for an unused slot (OEA may leave slots empty)
  float* topk_weights;           // [n_tokens, top_k] out; routed_scaling_factor applied; 0 for unused slots
  int n_tokens;
};

// The reference router. With oea.enabled, the base set spans all n_tokens of the call (for expert parallelism
// either pass the whole batch's logits gathered across ranks, or use the two steps below).
void route_cpu(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p);

// OEA step 1: ORs each token's top-k0 into base_set ([n_experts] flags, 0 or 1; not cleared here, so a caller
// may accumulate several token ranges). p.topk_ids / p.topk_weights are not touched and may be null.
void oea_base_set_cpu(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p,
                      uint8_t* base_set);

// OEA step 3: routes with a given base set ([n_experts] flags; nonzero = in the set), e.g. the all-reduced
// one. Each token still keeps its own top-k0 even if base_set lacks them (a base set from other ranks only
// adds).
void route_oea_fill_cpu(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p,
                        const uint8_t* base_set);

// Throws ms::Error naming the field when a config cannot be routed (n_experts % n_group, top_k range, ...).
void validate(const RouterConfig& cfg);
void validate(const RouterConfig& cfg, const OeaConfig& oea);

// Distinct experts touched by a routed batch (ids < 0 ignored; ids >= n_experts rejected).
int count_distinct_experts(const int32_t* topk_ids, int n_tokens, int top_k, int n_experts);

}  // namespace ms::moe
