// Test-only stand-in for moe::route_cpu until the moe room's router is merged: Hugging Face's
// DeepseekV3 / GlmMoeDsa routing (sigmoid or softmax scores, correction bias for selection only,
// group-limited top-k, normalisation, scaling). Remove when moe/router.cpp lands.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "moe/router.h"

namespace ms::moe {

void route_cpu(const RouterConfig& cfg, const OeaConfig&, const RouterParams& p) {
  const int E = cfg.n_experts, K = cfg.top_k, G = cfg.n_group, per = E / G;
  std::vector<float> score(E), choice(E), gscore(G);
  std::vector<int> idx(E), gidx(G);
  for (int t = 0; t < p.n_tokens; ++t) {
    const float* lg = p.logits + static_cast<size_t>(t) * E;
    if (cfg.scoring == Scoring::Sigmoid) {
      for (int e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-lg[e]));
    } else {
      float mx = *std::max_element(lg, lg + E), s = 0;
      for (int e = 0; e < E; ++e) s += (score[e] = std::exp(lg[e] - mx));
      for (int e = 0; e < E; ++e) score[e] /= s;
    }
    for (int e = 0; e < E; ++e)
      choice[e] = score[e] + (cfg.use_correction_bias && p.correction_bias ? p.correction_bias[e] : 0.0f);
    for (int g = 0; g < G; ++g) {
      std::vector<float> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gscore[g] = v[0] + (per > 1 ? v[1] : 0.0f);
    }
    std::iota(gidx.begin(), gidx.end(), 0);
    std::stable_sort(gidx.begin(), gidx.end(), [&](int a, int b) { return gscore[a] > gscore[b]; });
    std::vector<bool> keep(G, false);
    for (int i = 0; i < cfg.topk_group; ++i) keep[gidx[i]] = true;
    for (int e = 0; e < E; ++e)
      if (!keep[e / per]) choice[e] = -INFINITY;
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return choice[a] > choice[b]; });
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += score[idx[k]];
    for (int k = 0; k < K; ++k) {
      p.topk_ids[t * K + k] = idx[k];
      float w = score[idx[k]];
      if (cfg.norm_topk_prob) w /= (sum + 1e-20f);
      p.topk_weights[t * K + k] = w * cfg.routed_scaling_factor;
    }
  }
}

int count_distinct_experts(const int32_t* ids, int n_tokens, int top_k, int n_experts) {
  std::vector<bool> seen(static_cast<size_t>(n_experts), false);
  int n = 0;
  for (int i = 0; i < n_tokens * top_k; ++i)
    if (ids[i] >= 0 && !seen[ids[i]]) seen[ids[i]] = true, ++n;
  return n;
}

}  // namespace ms::moe
