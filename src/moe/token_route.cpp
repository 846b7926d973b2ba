#include "moe/token_route.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace ms::moe::detail {

TokenRoute::TokenRoute(const RouterConfig& cfg)
    : cfg_(cfg),
      scores_(cfg.n_experts),
      selection_(cfg.n_experts),
      groups_(cfg.n_group),
      eligible_(cfg.n_experts) {
  candidates_.reserve(cfg.n_experts);
}

void TokenRoute::score(const float* logits, const float* bias) {
  const int n = cfg_.n_experts;
  if (cfg_.scoring == Scoring::Sigmoid) {
    for (int e = 0; e < n; ++e) scores_[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    float mx = logits[0];
    for (int e = 1; e < n; ++e) mx = std::max(mx, logits[e]);
    float sum = 0.0f;
    for (int e = 0; e < n; ++e) {
      scores_[e] = std::exp(logits[e] - mx);
      sum += scores_[e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < n; ++e) scores_[e] *= inv;
  }
  for (int e = 0; e < n; ++e) selection_[e] = bias ? scores_[e] + bias[e] : scores_[e];

  candidates_.clear();
  if (cfg_.n_group <= 1) {
    for (int e = 0; e < n; ++e) candidates_.push_back({selection_[e], e});
    return;
  }
  // Group-limited selection: rank groups by their score, keep the topk_group best (ties: lower group id).
  const int gs = n / cfg_.n_group;
  for (int g = 0; g < cfg_.n_group; ++g) {
    const float* s = selection_.data() + g * gs;
    float best = -std::numeric_limits<float>::infinity(), second = best;
    for (int i = 0; i < gs; ++i) {
      if (s[i] > best) {
        second = best;
        best = s[i];
      } else if (s[i] > second) {
        second = s[i];
      }
    }
    // A one-expert group has no second value: its score is its single value (top-min(2, size)).
    const float gscore = cfg_.group_score == GroupScore::Max || gs == 1 ? best : best + second;
    groups_[g] = {gscore, g};
  }
  std::partial_sort(groups_.begin(), groups_.begin() + cfg_.topk_group, groups_.end(), before);
  std::fill(eligible_.begin(), eligible_.end(), uint8_t{0});
  for (int i = 0; i < cfg_.topk_group; ++i)
    std::fill_n(eligible_.begin() + groups_[i].id * gs, gs, uint8_t{1});
  for (int e = 0; e < n; ++e) {
    if (eligible_[e]) {
      candidates_.push_back({selection_[e], e});
    } else if (cfg_.masked_fill == MaskedFill::Zero) {
      candidates_.push_back({0.0f, e});
    }
  }
}

void TokenRoute::order_first(int n) {
  n = std::min<int>(n, static_cast<int>(candidates_.size()));
  if (n == static_cast<int>(candidates_.size())) {
    std::sort(candidates_.begin(), candidates_.end(), before);
  } else {
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), before);
  }
}

int TokenRoute::order_fill(int k0, int n_fill, const uint8_t* base_set) {
  order_first(k0);
  const auto rest = candidates_.begin() + std::min<size_t>(k0, candidates_.size());
  const auto in_set_end =
      std::partition(rest, candidates_.end(), [base_set](const Candidate& c) { return base_set[c.id] != 0; });
  const int filled = static_cast<int>(std::min<ptrdiff_t>(n_fill, in_set_end - rest));
  std::partial_sort(rest, rest + filled, in_set_end, before);
  return filled;
}

void write_slots(const RouterConfig& cfg, const std::vector<float>& scores, const int32_t* ids, int n_used,
                 int32_t* out_ids, float* out_weights) {
  float sum = 0.0f;
  for (int i = 0; i < n_used; ++i) sum += scores[ids[i]];
  // transformers: weights / (sum + 1e-20), then * routed_scaling_factor, in fp32.
  const float denom = cfg.norm_topk_prob ? sum + 1e-20f : 1.0f;
  for (int i = 0; i < n_used; ++i) {
    const float w = cfg.norm_topk_prob ? scores[ids[i]] / denom : scores[ids[i]];
    out_ids[i] = ids[i];
    out_weights[i] = w * cfg.routed_scaling_factor;
  }
  for (int i = n_used; i < cfg.top_k; ++i) {
    out_ids[i] = -1;
    out_weights[i] = 0.0f;
  }
}

void check_inputs(const RouterConfig& cfg, const RouterParams& p) {
  MS_CHECK(p.n_tokens >= 0, "router: n_tokens is {}", p.n_tokens);
  MS_CHECK(p.n_tokens == 0 || p.logits != nullptr, "router: logits is null");
  MS_CHECK(!cfg.use_correction_bias || p.correction_bias != nullptr,
           "router: use_correction_bias is set but correction_bias (e_score_correction_bias) is null");
  const int n = cfg.n_experts;
  if (cfg.use_correction_bias) {
    for (int e = 0; e < n; ++e) {
      if (!std::isfinite(p.correction_bias[e])) {
        MS_THROW("router: e_score_correction_bias[{}] is {}", e, p.correction_bias[e]);
      }
    }
  }
  // The scan runs in parallel; the lowest bad index is reported so the message does not depend on threads.
  int64_t bad = std::numeric_limits<int64_t>::max();
  const int64_t total = static_cast<int64_t>(p.n_tokens) * n;
#pragma omp parallel for reduction(min : bad) schedule(static) if (p.n_tokens >= kParallelMinTokens)
  for (int64_t i = 0; i < total; ++i) {
    if (!std::isfinite(p.logits[i])) bad = std::min(bad, i);
  }
  if (bad != std::numeric_limits<int64_t>::max()) {
    MS_THROW("router: logits[token {}, expert {}] is {}", bad / n, bad % n, p.logits[bad]);
  }
}

}  // namespace ms::moe::detail
