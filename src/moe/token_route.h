// One token's routing state, shared by plain routing and OEA (internal to moe/).
#pragma once

#include <cstdint>
#include <vector>

#include "moe/router.h"

namespace ms::moe::detail {

// Below this many tokens (a decode batch) routing runs on the calling thread: a parallel region costs more
// than the few microseconds of work, and far more when the cores are shared.
inline constexpr int kParallelMinTokens = 64;

struct Candidate {
  float value;  // selection score (biased); 0 for a masked expert under MaskedFill::Zero
  int32_t id;
};

// Higher value first; equal values: lower id first. The one tie rule of every routing path.
inline bool before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// Per-thread scratch; reused across tokens so the hot loop does not allocate.
class TokenRoute {
 public:
  explicit TokenRoute(const RouterConfig& cfg);

  // Scores one token: scores() = unbiased scores [n_experts]; candidates() = the experts the token may use
  // (group-limited), unordered until order_first() is called.
  void score(const float* logits, const float* bias);

  // Puts the first n candidates in selection order (n clipped to the candidate count).
  void order_first(int n);

  // OEA fill: the first k0 candidates in selection order, followed by the best (up to n_fill) of the others
  // whose base_set flag is set, in selection order. Returns how many were filled. O(n_experts + b log n_fill)
  // for b base-set candidates, instead of sorting every candidate.
  int order_fill(int k0, int n_fill, const uint8_t* base_set);

  const std::vector<float>& scores() const { return scores_; }
  const std::vector<Candidate>& candidates() const { return candidates_; }

 private:
  const RouterConfig& cfg_;
  std::vector<float> scores_;      // [n_experts]
  std::vector<float> selection_;   // [n_experts]
  std::vector<Candidate> groups_;  // [n_group]
  std::vector<uint8_t> eligible_;  // [n_experts]
  std::vector<Candidate> candidates_;
};

// Writes one token's top_k slots: ids[0..n_used) with weights from the unbiased scores (norm_topk_prob, then
// routed_scaling_factor), the rest -1 / 0. out_ids / out_weights: [top_k].
void write_slots(const RouterConfig& cfg, const std::vector<float>& scores, const int32_t* ids, int n_used,
                 int32_t* out_ids, float* out_weights);

// Rejects NaN / infinite logits or bias with an ms::Error naming the token and expert.
void check_inputs(const RouterConfig& cfg, const RouterParams& p);

}  // namespace ms::moe::detail
