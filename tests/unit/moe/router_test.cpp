// Plain routing against hand-computed cases of Hugging Face transformers' routing, and against a naive
// re-statement of it on random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "moe/router.h"

using namespace ms::moe;

namespace {

float logit_of(double p) {
  return static_cast<float>(std::log(p / (1.0 - p)));
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const RouterConfig& cfg, const std::vector<float>& logits, const std::vector<float>* bias,
             OeaConfig oea = {}) {
  const int n_tokens = static_cast<int>(logits.size()) / cfg.n_experts;
  Routed r{std::vector<int32_t>(n_tokens * cfg.top_k, 7777),
           std::vector<float>(n_tokens * cfg.top_k, 7777.f)};
  route_cpu(cfg, oea,
            {logits.data(), bias ? bias->data() : nullptr, r.ids.data(), r.weights.data(), n_tokens});
  return r;
}

// DeepSeek-V3-style: 16 experts in 4 groups of 4, keep 2 groups, top 4, sigmoid + bias, scaling 2.5.
RouterConfig ds_small() {
  RouterConfig c;
  c.n_experts = 16;
  c.top_k = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5f;
  return c;
}

}  // namespace

// Scores and biases chosen so that every step can be followed by hand:
//   group 0: sel .9 .1 .2 .3          -> top-2 sum 1.2
//   group 1: sel .5 .95 .5 .5 (e5 has bias +.45 on score .5) -> 1.45
//   group 2: sel .5 .6 .1 .1 (e8: score .8, bias -.3)         -> 1.1
//   group 3: sel .95 .05 .05 .05                               -> 1.0   (holds the best unbiased score,
//   masked)
// Kept groups 1, 0. Top 4 of e0..e7 by selection: e5 (.95), e0 (.9), then e4, e6, e7 tie at .5 -> e4, e6.
// Weights from unbiased scores .5 .9 .5 .5: / 2.4 * 2.5.
TEST(Router, SigmoidBiasGroupsByHand) {
  const std::vector<double> s = {.9, .1, .2, .3, .5, .5, .5, .5, .8, .6, .1, .1, .95, .05, .05, .05};
  std::vector<float> bias(16, 0.0f);
  bias[5] = 0.45f;
  bias[8] = -0.3f;
  std::vector<float> logits;
  for (double v : s) logits.push_back(logit_of(v));
  const Routed r = route(ds_small(), logits, &bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 0, 4, 6}));
  const float expect[4] = {0.5f / 2.4f * 2.5f, 0.9f / 2.4f * 2.5f, 0.5f / 2.4f * 2.5f, 0.5f / 2.4f * 2.5f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(r.weights[i], expect[i], 1e-6) << i;
  EXPECT_NEAR(std::accumulate(r.weights.begin(), r.weights.end(), 0.0f), 2.5f, 1e-6);
}

// Without group limits the masked group's expert 12 (score .95) would win: check the groups matter.
TEST(Router, SigmoidBiasNoGroupsPicksGlobalBest) {
  const std::vector<double> s = {.9, .1, .2, .3, .5, .5, .5, .5, .8, .6, .1, .1, .95, .05, .05, .05};
  std::vector<float> bias(16, 0.0f);
  bias[5] = 0.45f;
  bias[8] = -0.3f;
  std::vector<float> logits;
  for (double v : s) logits.push_back(logit_of(v));
  RouterConfig c = ds_small();
  c.n_group = 1;
  c.topk_group = 1;
  const Routed r = route(c, logits, &bias);
  // selection: e5 .95, e12 .95 (tie -> lower id first), e0 .9, e9 .6
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 12, 0, 9}));
  const float sum = 0.5f + 0.95f + 0.9f + 0.6f;
  EXPECT_NEAR(r.weights[1], 0.95f / sum * 2.5f, 1e-6);
}

// Every eligible expert has a negative biased score. -inf masking (GLM-5, vLLM) stays in the kept groups;
// transformers' DeepseekV3 (masked_fill 0.0) picks masked experts at 0 instead.
TEST(Router, MaskedFillZeroMatchesDeepseekV3Quirk) {
  std::vector<float> logits(16, 0.0f);  // every score .5
  std::vector<float> bias(16);
  const float group_bias[4] = {-0.6f, -0.55f, -0.7f, -0.8f};  // group sums -.2 -.1 -.4 -.6 -> keep 1, 0
  for (int e = 0; e < 16; ++e) bias[e] = group_bias[e / 4];
  RouterConfig c = ds_small();
  Routed r = route(c, logits, &bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 5, 6, 7}));
  c.masked_fill = MaskedFill::Zero;
  r = route(c, logits, &bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{8, 9, 10, 11}));
  for (float w : r.weights) EXPECT_NEAR(w, 0.25f * 2.5f, 1e-6);
}

// Qwen / DeepSeek-V2 greedy: softmax over all experts, top_k, no bias. Scores w / 14.
TEST(Router, SoftmaxGreedyByHand) {
  const std::vector<double> w = {1, 2, 4, 1, 1, 1, 1, 3};
  std::vector<float> logits;
  for (double v : w) logits.push_back(static_cast<float>(std::log(v)));
  RouterConfig c;
  c.n_experts = 8;
  c.top_k = 2;
  c.scoring = Scoring::Softmax;
  c.use_correction_bias = false;
  c.norm_topk_prob = false;
  Routed r = route(c, logits, nullptr);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 7}));
  EXPECT_NEAR(r.weights[0], 4.0f / 14, 1e-6);
  EXPECT_NEAR(r.weights[1], 3.0f / 14, 1e-6);
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 16.0f;
  r = route(c, logits, nullptr);
  EXPECT_NEAR(r.weights[0], 4.0f / 7 * 16, 1e-5);
  EXPECT_NEAR(r.weights[1], 3.0f / 7 * 16, 1e-5);
}

// DeepSeek-V2 group_limited_greedy: group score = the group's best softmax score.
// Softmax scores w / 16 in groups of 2: {1,2} {4,1} {1,1} {3,3}; one group kept.
TEST(Router, GroupScoreMaxVersusTop2Sum) {
  const std::vector<double> w = {1, 2, 4, 1, 1, 1, 3, 3};
  std::vector<float> logits;
  for (double v : w) logits.push_back(static_cast<float>(std::log(v)));
  RouterConfig c;
  c.n_experts = 8;
  c.top_k = 2;
  c.n_group = 4;
  c.topk_group = 1;
  c.scoring = Scoring::Softmax;
  c.use_correction_bias = false;
  c.group_score = GroupScore::Max;  // group maxima 2, 4, 1, 3 -> group 1 alone: e2, then e3
  EXPECT_EQ(route(c, logits, nullptr).ids, (std::vector<int32_t>{2, 3}));
  c.group_score = GroupScore::Top2Sum;  // sums 3, 5, 2, 6 -> group 3 alone: e6, e7
  EXPECT_EQ(route(c, logits, nullptr).ids, (std::vector<int32_t>{6, 7}));
}

TEST(Router, SoftmaxWithBiasSelectsByBiasWeighsWithoutIt) {
  const std::vector<double> w = {1, 2, 4, 1};
  std::vector<float> logits;
  for (double v : w) logits.push_back(static_cast<float>(std::log(v)));
  std::vector<float> bias = {0.5f, 0.f, 0.f, 0.f};  // e0: .125 + .5 beats e2's .5
  RouterConfig c;
  c.n_experts = 4;
  c.top_k = 1;
  c.scoring = Scoring::Softmax;
  c.norm_topk_prob = false;
  const Routed r = route(c, logits, &bias);
  EXPECT_EQ(r.ids[0], 0);
  EXPECT_NEAR(r.weights[0], 1.0f / 8, 1e-6);
}

namespace {

// transformers' steps, written out the slow way: float scores, stable sort (ties to the lower index).
Routed naive_route(const RouterConfig& c, const std::vector<float>& logits, const std::vector<float>& bias) {
  const int n = c.n_experts, nt = static_cast<int>(logits.size()) / n, gs = n / c.n_group;
  Routed r;
  for (int t = 0; t < nt; ++t) {
    const float* l = logits.data() + t * n;
    std::vector<float> s(n), sel(n);
    if (c.scoring == Scoring::Sigmoid) {
      for (int e = 0; e < n; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      const float mx = *std::max_element(l, l + n);
      float sum = 0;
      for (int e = 0; e < n; ++e) sum += s[e] = std::exp(l[e] - mx);
      for (int e = 0; e < n; ++e) s[e] /= sum;
    }
    for (int e = 0; e < n; ++e) sel[e] = s[e] + (c.use_correction_bias ? bias[e] : 0.0f);
    std::vector<float> gscore(c.n_group);
    for (int g = 0; g < c.n_group; ++g) {
      std::vector<float> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      gscore[g] = c.group_score == GroupScore::Max || gs < 2 ? v[0] : v[0] + v[1];
    }
    std::vector<int> gorder(c.n_group);
    std::iota(gorder.begin(), gorder.end(), 0);
    std::stable_sort(gorder.begin(), gorder.end(), [&](int a, int b) { return gscore[a] > gscore[b]; });
    std::vector<float> masked(n, -INFINITY);
    for (int i = 0; i < c.topk_group; ++i)
      for (int e = gorder[i] * gs; e < (gorder[i] + 1) * gs; ++e) masked[e] = sel[e];
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return masked[a] > masked[b]; });
    float sum = 0;
    for (int i = 0; i < c.top_k; ++i) sum += s[order[i]];
    for (int i = 0; i < c.top_k; ++i) {
      r.ids.push_back(order[i]);
      float w = c.norm_topk_prob ? s[order[i]] / (sum + 1e-20f) : s[order[i]];
      r.weights.push_back(w * c.routed_scaling_factor);
    }
  }
  return r;
}

}  // namespace

TEST(Router, MatchesNaiveStatementOnRandomInputs) {
  struct Case {
    int n, k, ng, tg;
    Scoring sc;
    bool bias, norm;
    GroupScore gsc;
  };
  const Case cases[] = {
      {16, 4, 4, 2, Scoring::Sigmoid, true, true, GroupScore::Top2Sum},
      {64, 6, 8, 4, Scoring::Sigmoid, true, true, GroupScore::Top2Sum},
      {256, 8, 1, 1, Scoring::Sigmoid, true, true, GroupScore::Top2Sum},
      {32, 8, 1, 1, Scoring::Softmax, false, false, GroupScore::Top2Sum},
      {64, 6, 8, 3, Scoring::Softmax, false, true, GroupScore::Max},
  };
  for (const Case& cs : cases) {
    RouterConfig c;
    c.n_experts = cs.n;
    c.top_k = cs.k;
    c.n_group = cs.ng;
    c.topk_group = cs.tg;
    c.scoring = cs.sc;
    c.use_correction_bias = cs.bias;
    c.norm_topk_prob = cs.norm;
    c.group_score = cs.gsc;
    c.routed_scaling_factor = 2.5f;
    for (int seed = 0; seed < 20; ++seed) {
      std::mt19937 rng(seed);
      std::normal_distribution<float> nd(0.f, 2.f);
      // Coarse values make exact ties frequent, so the tie rule is exercised too.
      std::uniform_int_distribution<int> coarse(-4, 4);
      const int nt = 13;
      std::vector<float> logits(nt * cs.n), bias(cs.n);
      for (auto& v : logits) v = seed % 2 ? nd(rng) : coarse(rng) * 0.5f;
      for (auto& v : bias) v = seed % 2 ? nd(rng) * 0.1f : coarse(rng) * 0.125f;
      const Routed got = route(c, logits, cs.bias ? &bias : nullptr);
      const Routed want = naive_route(c, logits, bias);
      ASSERT_EQ(got.ids, want.ids) << "n " << cs.n << " seed " << seed;
      for (size_t i = 0; i < got.weights.size(); ++i) ASSERT_NEAR(got.weights[i], want.weights[i], 1e-6);
    }
  }
}

TEST(Router, BadInputNamesTheField) {
  RouterConfig c = ds_small();
  std::vector<float> logits(32, 0.f), bias(16, 0.f);
  std::vector<int32_t> ids(8);
  std::vector<float> w(8);
  RouterParams p{logits.data(), bias.data(), ids.data(), w.data(), 2};
  logits[16 + 3] = NAN;
  try {
    route_cpu(c, {}, p);
    FAIL();
  } catch (const ms::Error& e) {
    EXPECT_NE(e.message().find("logits[token 1, expert 3]"), std::string::npos) << e.message();
  }
  logits[16 + 3] = 0.f;
  bias[2] = INFINITY;
  EXPECT_THROW(route_cpu(c, {}, p), ms::Error);
  bias[2] = 0.f;
  p.correction_bias = nullptr;
  EXPECT_THROW(route_cpu(c, {}, p), ms::Error);
  p.correction_bias = bias.data();
  auto expect_msg = [&](RouterConfig bad, OeaConfig oea, const char* field) {
    try {
      route_cpu(bad, oea, p);
      ADD_FAILURE() << field;
    } catch (const ms::Error& e) {
      EXPECT_NE(e.message().find(field), std::string::npos) << e.message();
    }
  };
  RouterConfig bad = c;
  bad.n_group = 3;
  expect_msg(bad, {}, "n_group");
  bad = c;
  bad.topk_group = 5;
  expect_msg(bad, {}, "topk_group");
  bad = c;
  bad.topk_group = 1;  // 4 eligible experts for top_k 4 is fine; 1 group of 4 with top_k 5 is not
  bad.top_k = 5;
  expect_msg(bad, {}, "topk_group");
  bad = c;
  bad.top_k = 17;
  expect_msg(bad, {}, "num_experts_per_tok");
  expect_msg(c, {true, 0, 0}, "k0");
  expect_msg(c, {true, 3, 2}, "kmax");
  expect_msg(c, {true, 2, 5}, "kmax");
}

TEST(Router, CountDistinctExperts) {
  const std::vector<int32_t> ids = {3, 1, -1, 3, 7, -1};
  EXPECT_EQ(count_distinct_experts(ids.data(), 2, 3, 8), 3);
  EXPECT_EQ(count_distinct_experts(ids.data(), 0, 3, 8), 0);
  EXPECT_THROW(count_distinct_experts(ids.data(), 2, 3, 7), ms::Error);
}
