#include "runtime/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

using ms::runtime::GeneratedToken;
using ms::runtime::Sampler;
using ms::runtime::SamplerOptions;
using ms::runtime::SamplerState;
using ms::runtime::SamplingParams;
using ms::runtime::TokenProbability;

namespace {

SamplerOptions fixed_seed() {
  SamplerOptions o;
  o.global_seed = 1234;
  return o;
}

std::vector<float> log_of(const std::vector<double>& probs) {
  std::vector<float> x;
  for (double p : probs) x.push_back(static_cast<float>(std::log(p)));
  return x;
}

std::set<int32_t> tokens_of(const std::vector<TokenProbability>& d) {
  std::set<int32_t> s;
  for (const auto& e : d) s.insert(e.token);
  return s;
}

std::vector<float> random_logits(int n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

// Counts of `draws` tokens sampled from one state over the same row.
std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, const SamplingParams& p, int draws) {
  SamplerState st = s.new_state(p, {});
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) counts[s.sample(logits, p, st).token]++;
  return counts;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int draws) {
  double chi = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    double e = probs[i] * draws;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

// The kept set by definition, by sorting the whole row: top-k, then the top-p nucleus of the renormalised
// top-k distribution, then min-p relative to the largest probability. Weights are computed as the sampler
// does (f32 exp of the scaled logit) so that only the algorithm differs.
std::vector<int32_t> reference_kept(const std::vector<float>& x, const SamplingParams& p) {
  const int n_all = static_cast<int>(x.size());
  std::vector<int32_t> order(n_all);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  const float m = x[order[0]];
  const float inv_t = 1.0f / p.temperature;
  auto weight = [&](int t) { return static_cast<double>(std::exp((x[t] - m) * inv_t)); };
  int n = (p.top_k > 0 && p.top_k < n_all) ? p.top_k : n_all;
  if (p.top_p < 1.0f) {
    double z = 0.0;
    for (int i = 0; i < n; ++i) z += weight(order[i]);
    double cum = 0.0;
    int i = 0;
    while (i < n && cum < p.top_p * z) cum += weight(order[i++]);
    n = std::max(i, 1);
  }
  if (p.min_p > 0.0f) {
    while (n > 1 && (x[order[n - 1]] - m) * inv_t < std::log(p.min_p)) --n;
  }
  order.resize(n);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> sorted_tokens(const std::vector<TokenProbability>& d) {
  std::vector<int32_t> t;
  for (const auto& e : d) t.push_back(e.token);
  std::sort(t.begin(), t.end());
  return t;
}

}  // namespace

TEST(Sampler, GreedyPicksArgmaxTiesToLowestId) {
  Sampler s(5, fixed_seed());
  std::vector<float> x = {1.0f, 3.0f, 2.0f, 3.0f, -7.0f};
  for (float t : {0.0f, 1e-6f}) {
    SamplingParams p;
    p.temperature = t;
    SamplerState st = s.new_state(p, {});
    for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(x, p, st).token, 1);
    EXPECT_EQ(st.step(), 10);
  }
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(s.kept_distribution(x, p, s.new_state(p, {})).size(), 1u);
}

TEST(Sampler, TemperatureFrequenciesMatchSoftmax) {
  Sampler s(5, fixed_seed());
  const std::vector<float> x = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f};
  for (float t : {0.7f, 1.0f, 2.5f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 99;
    std::vector<double> probs(5);
    double z = 0.0;
    for (int i = 0; i < 5; ++i) z += probs[i] = std::exp(x[i] / t);
    for (auto& v : probs) v /= z;
    const int draws = 20000;
    auto counts = histogram(s, x, p, draws);
    // chi-square with 4 degrees of freedom exceeds 25 with probability 5e-5; a sampler that ignored the
    // temperature or was off by one token would score in the hundreds or more.
    EXPECT_LT(chi_square(counts, probs, draws), 25.0) << "temperature " << t;
    auto d = s.kept_distribution(x, p, s.new_state(p, {}));
    ASSERT_EQ(d.size(), 5u);
    for (const auto& e : d) EXPECT_NEAR(e.probability, probs[e.token], 1e-6);
  }
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  Sampler s(5, fixed_seed());
  const std::vector<float> x = {1.0f, 5.0f, 3.0f, 4.0f, 2.0f};
  SamplingParams p;
  p.top_k = 2;
  p.seed = 5;
  auto d = s.kept_distribution(x, p, s.new_state(p, {}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[1].token, 3);
  const double p1 = std::exp(1.0) / (std::exp(1.0) + 1.0);  // softmax over {5, 4}
  EXPECT_NEAR(d[0].probability, p1, 1e-6);
  EXPECT_NEAR(d[1].probability, 1.0 - p1, 1e-6);
  const int draws = 20000;
  auto counts = histogram(s, x, p, draws);
  EXPECT_LT(chi_square(counts, {0.0, p1, 0.0, 1.0 - p1, 0.0}, draws), 20.0);  // 1 dof: P(>20) < 1e-5
  // Ties at the k-th place go to the lowest id.
  const std::vector<float> tied = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  EXPECT_EQ(tokens_of(s.kept_distribution(tied, p, s.new_state(p, {}))), (std::set<int32_t>{1, 2}));
  // -1 and k >= vocab mean off.
  for (int k : {-1, 0, 5, 9}) {
    p.top_k = k;
    EXPECT_EQ(s.kept_distribution(x, p, s.new_state(p, {})).size(), 5u) << "top_k " << k;
  }
}

TEST(Sampler, TopPKeepsTheNucleus) {
  Sampler s(5, fixed_seed());
  const std::vector<float> x = log_of({0.5, 0.2, 0.15, 0.1, 0.05});
  SamplingParams p;
  p.seed = 7;
  auto kept = [&](float top_p) {
    p.top_p = top_p;
    return tokens_of(s.kept_distribution(x, p, s.new_state(p, {})));
  };
  EXPECT_EQ(kept(0.45f), (std::set<int32_t>{0}));  // the most likely token alone reaches 0.45
  EXPECT_EQ(kept(0.6f), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(kept(0.8f), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(kept(0.9f), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(kept(0.99f), (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(kept(1e-6f), (std::set<int32_t>{0}));  // at least one
  p.top_p = 0.8f;
  const int draws = 20000;
  auto counts = histogram(s, x, p, draws);
  EXPECT_LT(chi_square(counts, {0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0.0, 0.0}, draws), 25.0);
}

TEST(Sampler, MinPIsRelativeToTheMostLikely) {
  Sampler s(5, fixed_seed());
  const std::vector<float> x = log_of({0.5, 0.2, 0.15, 0.1, 0.05});
  SamplingParams p;
  p.min_p = 0.25f;  // keeps p >= 0.125
  EXPECT_EQ(tokens_of(s.kept_distribution(x, p, s.new_state(p, {}))), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.35f;  // keeps p >= 0.175
  EXPECT_EQ(tokens_of(s.kept_distribution(x, p, s.new_state(p, {}))), (std::set<int32_t>{0, 1}));
  p.min_p = 1.0f;
  EXPECT_EQ(tokens_of(s.kept_distribution(x, p, s.new_state(p, {}))), (std::set<int32_t>{0}));
  p.min_p = 0.35f;
  p.seed = 3;
  auto counts = histogram(s, x, p, 5000);
  EXPECT_EQ(counts[2] + counts[3] + counts[4], 0);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], 0);
}

TEST(Sampler, TruncationsApplyInOrderKThenPThenMinP) {
  Sampler s(4, fixed_seed());
  SamplingParams p;
  // top-p measures the renormalised top-k distribution: top-2 of (.4 .3 .2 .1) is (.571 .429), whose first
  // token alone reaches 0.55 (over the full distribution it would take two).
  std::vector<float> x = log_of({0.4, 0.3, 0.2, 0.1});
  p.top_k = 2;
  p.top_p = 0.55f;
  EXPECT_EQ(tokens_of(s.kept_distribution(x, p, s.new_state(p, {}))), (std::set<int32_t>{0}));
  // min-p comes after top-p: top-p 0.6 of (.5 .3 .2) keeps two, min-p 0.5 keeps them (0.3 >= 0.25). Had min-p
  // come first, the renormalised (.625 .375) would leave top-p one token.
  x = log_of({0.5, 0.3, 0.2, 1e-9});
  p.top_k = 0;
  p.top_p = 0.6f;
  p.min_p = 0.5f;
  EXPECT_EQ(tokens_of(s.kept_distribution(x, p, s.new_state(p, {}))), (std::set<int32_t>{0, 1}));
  // Temperature comes before truncation: at T = 2 the probabilities flatten and min-p 0.5 keeps more.
  p.top_p = 1.0f;
  p.temperature = 2.0f;  // relative probabilities sqrt(.3/.5) = .77, sqrt(.2/.5) = .63
  EXPECT_EQ(tokens_of(s.kept_distribution(x, p, s.new_state(p, {}))), (std::set<int32_t>{0, 1, 2}));
}

TEST(Sampler, TruncationMatchesAFullSortOnRandomRows) {
  for (int vocab : {7, 1000, 154880}) {
    Sampler s(vocab, fixed_seed());
    for (uint64_t row_seed = 0; row_seed < 3; ++row_seed) {
      const auto x = random_logits(vocab, 100 + row_seed, vocab > 1000 ? 2.0f : 3.0f);
      const std::vector<std::tuple<float, int, float, float>> cases = {
          // temperature, top_k, top_p, min_p
          {1.0f, 0, 0.9f, 0.0f},  {0.7f, 0, 0.5f, 0.0f},  {1.3f, 50, 1.0f, 0.0f}, {1.0f, 40, 0.8f, 0.0f},
          {1.0f, 0, 1.0f, 0.05f}, {0.8f, 0, 0.95f, 0.1f}, {1.0f, 5, 0.7f, 0.3f},  {0.5f, 3000, 0.99f, 0.0f},
          {1.0f, 1, 1.0f, 0.0f},  {2.0f, 0, 0.3f, 0.0f}};
      for (auto [t, k, top_p, min_p] : cases) {
        SamplingParams p;
        p.temperature = t;
        p.top_k = k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.seed = row_seed;
        SamplerState st = s.new_state(p, {});
        auto d = s.kept_distribution(x, p, st);
        const auto want = reference_kept(x, p);
        EXPECT_EQ(sorted_tokens(d), want)
            << "vocab " << vocab << " T " << t << " top_k " << k << " top_p " << top_p << " min_p " << min_p;
        double sum = 0.0;
        for (size_t i = 0; i < d.size(); ++i) {
          sum += d[i].probability;
          if (i > 0) {
            EXPECT_GE(d[i - 1].probability, d[i].probability);
          }
        }
        EXPECT_NEAR(sum, 1.0, 1e-4);
        const std::set<int32_t> allowed(want.begin(), want.end());
        for (int i = 0; i < 20; ++i) {
          int32_t tok = s.sample(x, p, st).token;
          EXPECT_TRUE(allowed.count(tok)) << "token " << tok << " is outside the kept set";
        }
      }
    }
  }
}

TEST(Sampler, PenaltiesChangeLogitsAsSpecified) {
  Sampler s(6, fixed_seed());
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const std::vector<int32_t> prompt = {0, 1, 0};
  const std::vector<int32_t> output = {2, 2, 3};
  SamplerState st = s.new_state(p, prompt, output);
  EXPECT_TRUE(st.tracks_tokens());
  EXPECT_EQ(st.step(), 3);
  EXPECT_EQ(st.output_count(2), 2);
  EXPECT_EQ(st.output_count(0), 0);
  std::vector<float> x = {2.0f, -1.0f, 0.5f, -3.0f, 1.0f, 0.0f};
  s.apply_penalties(x, p, st);
  EXPECT_FLOAT_EQ(x[0], 1.0f);    // prompt, positive: 2 / 2; no frequency/presence (prompt only)
  EXPECT_FLOAT_EQ(x[1], -2.0f);   // prompt, negative: -1 * 2
  EXPECT_FLOAT_EQ(x[2], -1.0f);   // output twice: 0.5 / 2 - 0.5 * 2 - 0.25
  EXPECT_FLOAT_EQ(x[3], -6.75f);  // output once: -3 * 2 - 0.5 - 0.25
  EXPECT_FLOAT_EQ(x[4], 1.0f);    // unseen
  EXPECT_FLOAT_EQ(x[5], 0.0f);    // unseen

  // Greedy sees the penalised row: tokens 0 and 4 tie at 1.0, the lowest id wins; then token 0 is output once
  // and drops to 1 / 2 - 0.5 - 0.25 = -0.25, so token 4 wins next, and so on.
  SamplingParams g = p;
  g.temperature = 0.0f;
  SamplerState gs = s.new_state(g, prompt, output);
  const std::vector<float> row = {2.0f, -1.0f, 0.5f, -3.0f, 1.0f, 0.0f};
  EXPECT_EQ(s.sample(row, g, gs).token, 0);
  EXPECT_EQ(gs.output_count(0), 1);
  EXPECT_EQ(s.sample(row, g, gs).token, 4);  // 0 is now 2/2 - 0.5 - 0.25 = 0.25 < 1.0
  EXPECT_EQ(s.sample(row, g, gs).token, 0);  // 4 is now 1/2 - 0.75 = -0.25; 0 (0.25) beats 5 (0.0)
  EXPECT_EQ(s.sample(row, g, gs).token, 5);  // 0 is now 1 - 2 * 0.5 - 0.25 = -0.25
  EXPECT_EQ(gs.output_count(0), 2);
}

TEST(Sampler, NegativePenaltiesAndNoPenaltyLeaveOthersAlone) {
  Sampler s(3, fixed_seed());
  SamplingParams p;
  p.frequency_penalty = -1.0f;  // encourages repetition
  SamplerState st = s.new_state(p, std::vector<int32_t>{2}, std::vector<int32_t>{1});
  std::vector<float> x = {0.0f, 0.0f, 0.0f};
  s.apply_penalties(x, p, st);
  EXPECT_FLOAT_EQ(x[0], 0.0f);
  EXPECT_FLOAT_EQ(x[1], 1.0f);
  EXPECT_FLOAT_EQ(x[2], 0.0f);  // prompt tokens get no frequency penalty

  SamplingParams plain;
  SamplerState ps = s.new_state(plain, std::vector<int32_t>{0, 1});
  EXPECT_FALSE(ps.tracks_tokens());
  // A state made without penalties refuses params with them rather than silently ignoring the history.
  EXPECT_THROW(s.sample(x, p, ps), ms::Error);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedsDiffer) {
  const int vocab = 1000;
  Sampler s(vocab, fixed_seed());
  std::vector<std::vector<float>> rows;
  for (int i = 0; i < 64; ++i) rows.push_back(random_logits(vocab, 500 + i, 1.0f));
  auto run = [&](std::optional<uint64_t> seed, Sampler& sampler) {
    SamplingParams p;
    p.seed = seed;
    p.top_p = 0.95f;
    SamplerState st = sampler.new_state(p, {});
    std::vector<int32_t> out;
    for (const auto& r : rows) out.push_back(sampler.sample(r, p, st).token);
    return out;
  };
  EXPECT_EQ(run(42, s), run(42, s));
  EXPECT_NE(run(42, s), run(43, s));
  EXPECT_NE(run(0, s), run(1, s));
  // Without a seed, requests differ from each other; a sampler with the same global seed repeats them.
  Sampler s2(vocab, fixed_seed());
  auto a1 = run(std::nullopt, s);
  auto a2 = run(std::nullopt, s);
  EXPECT_NE(a1, a2);
  auto b1 = run(std::nullopt, s2);
  EXPECT_EQ(a1, b1);
}

TEST(Sampler, SeededTokensDoNotDependOnTheBatch) {
  const int vocab = 500;
  Sampler s(vocab, fixed_seed());
  SamplingParams pa;
  pa.seed = 2024;
  pa.temperature = 0.9f;
  pa.top_k = 100;
  SamplingParams pb;  // unseeded, different settings
  pb.top_p = 0.8f;
  pb.top_logprobs = 3;
  SamplingParams pc;
  pc.temperature = 0.0f;

  const int steps = 20;
  std::vector<std::vector<float>> rows_a;
  for (int i = 0; i < steps; ++i) rows_a.push_back(random_logits(vocab, 900 + i));

  SamplerState alone = s.new_state(pa, {});
  std::vector<int32_t> want;
  for (const auto& r : rows_a) want.push_back(s.sample(r, pa, alone).token);

  // The same request in batches of 3 at a varying position.
  SamplerState a = s.new_state(pa, {}), b = s.new_state(pb, {}), c = s.new_state(pc, {});
  std::vector<int32_t> got;
  for (int i = 0; i < steps; ++i) {
    const int pos = i % 3;
    std::vector<float> batch;
    std::vector<const SamplingParams*> params;
    std::vector<SamplerState*> states;
    const auto other = random_logits(vocab, 7000 + i);
    int filled_other = 0;
    for (int row = 0; row < 3; ++row) {
      if (row == pos) {
        batch.insert(batch.end(), rows_a[i].begin(), rows_a[i].end());
        params.push_back(&pa);
        states.push_back(&a);
      } else {
        batch.insert(batch.end(), other.begin(), other.end());
        params.push_back(filled_other++ == 0 ? &pb : &pc);
        states.push_back(filled_other == 1 ? &b : &c);
      }
    }
    std::vector<GeneratedToken> out(3);
    s.sample_batch(batch, params, states, out);
    got.push_back(out[pos].token);
    for (int row = 0; row < 3; ++row) EXPECT_EQ(out[row].top_logprobs.size(), params[row] == &pb ? 3u : 0u);
  }
  EXPECT_EQ(got, want);
}

TEST(Sampler, ResumedStateContinuesTheStream) {
  const int vocab = 300;
  Sampler s(vocab, fixed_seed());
  SamplingParams p;
  p.seed = 11;
  p.presence_penalty = 0.5f;
  const std::vector<int32_t> prompt = {4, 5, 6};
  const auto row = random_logits(vocab, 77, 0.5f);
  SamplerState st = s.new_state(p, prompt);
  std::vector<int32_t> first;
  for (int i = 0; i < 8; ++i) first.push_back(s.sample(row, p, st).token);
  SamplerState resumed = s.new_state(p, prompt, std::span<const int32_t>(first.data(), 5));
  for (int i = 5; i < 8; ++i) EXPECT_EQ(s.sample(row, p, resumed).token, first[i]) << "step " << i;
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  Sampler s(4, fixed_seed());
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 2.0f};
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(2.0) + std::exp(3.0));  // 3.5515...
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_logprobs = 3;
  SamplerState st = s.new_state(p, {});
  GeneratedToken t = s.sample(x, p, st);
  EXPECT_EQ(t.token, 2);
  EXPECT_NEAR(t.logprob, 3.0 - lse, 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].token, 2);
  EXPECT_EQ(t.top_logprobs[1].token, 1);  // ties to the lowest id
  EXPECT_EQ(t.top_logprobs[2].token, 3);
  EXPECT_NEAR(t.top_logprobs[0].logprob, 3.0 - lse, 1e-6);
  EXPECT_NEAR(t.top_logprobs[1].logprob, 2.0 - lse, 1e-6);
  EXPECT_NEAR(t.top_logprobs[2].logprob, 2.0 - lse, 1e-6);

  // They describe the model's output, not the sampling settings: the same values under penalties, temperature
  // and truncation; the chosen token's logprob is its raw one.
  SamplingParams q;
  q.temperature = 0.3f;
  q.top_k = 2;
  q.repetition_penalty = 1.5f;
  q.frequency_penalty = 0.4f;
  q.top_logprobs = 4;
  q.seed = 1;
  SamplerState qs = s.new_state(q, std::vector<int32_t>{2}, std::vector<int32_t>{1, 1});
  GeneratedToken u = s.sample(x, q, qs);
  EXPECT_NEAR(u.logprob, x[u.token] - lse, 1e-6);
  ASSERT_EQ(u.top_logprobs.size(), 4u);
  EXPECT_EQ(u.top_logprobs[3].token, 0);
  EXPECT_NEAR(u.top_logprobs[3].logprob, 1.0 - lse, 1e-6);

  // 0: the chosen token's logprob only; -1: none.
  p.top_logprobs = 0;
  t = s.sample(x, p, st);
  EXPECT_NEAR(t.logprob, 3.0 - lse, 1e-6);
  EXPECT_TRUE(t.top_logprobs.empty());
  p.top_logprobs = -1;
  t = s.sample(x, p, st);
  EXPECT_EQ(t.logprob, 0.0f);
}

TEST(Sampler, LargeVocabularyRuns) {
  const int vocab = 154880;
  Sampler s(vocab, fixed_seed());
  const int rows = 8;
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) {
    auto x = random_logits(vocab, 31 + r, 4.0f);
    logits.insert(logits.end(), x.begin(), x.end());
  }
  std::vector<SamplingParams> params(rows);
  params[0].temperature = 0.0f;
  params[1].top_p = 0.9f;
  params[2].top_k = 50;
  params[3].min_p = 0.1f;
  params[4].top_k = 20;
  params[4].top_p = 0.95f;
  params[4].repetition_penalty = 1.1f;
  params[5].top_logprobs = 20;
  params[6].frequency_penalty = 0.3f;
  params[6].presence_penalty = 0.3f;
  params[7].temperature = 0.6f;
  params[7].top_p = 0.95f;
  std::vector<int32_t> prompt(2000);
  for (int i = 0; i < 2000; ++i) prompt[i] = (i * 7919) % vocab;
  std::vector<SamplerState> states;
  for (int r = 0; r < rows; ++r) states.push_back(s.new_state(params[r], prompt));
  std::vector<const SamplingParams*> pp;
  std::vector<SamplerState*> sp;
  for (int r = 0; r < rows; ++r) {
    pp.push_back(&params[r]);
    sp.push_back(&states[r]);
  }
  std::vector<GeneratedToken> out(rows);
  for (int step = 0; step < 20; ++step) {
    s.sample_batch(logits, pp, sp, out);
    for (int r = 0; r < rows; ++r) {
      EXPECT_GE(out[r].token, 0);
      EXPECT_LT(out[r].token, vocab);
    }
  }
  const float* row0 = logits.data();
  EXPECT_EQ(out[0].token, std::max_element(row0, row0 + vocab) - row0);
  ASSERT_EQ(out[5].top_logprobs.size(), 20u);
  for (int i = 1; i < 20; ++i) EXPECT_GE(out[5].top_logprobs[i - 1].logprob, out[5].top_logprobs[i].logprob);
  EXPECT_GE(states[6].output_count(out[6].token), 1);
  EXPECT_EQ(states[6].step(), 20);
}

TEST(Sampler, BadInputNamesWhatIsWrong) {
  Sampler s(10, fixed_seed());
  auto message_of = [&](SamplingParams p) {
    try {
      s.validate(p);
    } catch (const ms::Error& e) {
      return e.message();
    }
    return std::string();
  };
  auto with = [](auto set) {
    SamplingParams p;
    set(p);
    return p;
  };
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.temperature = -1; })),
              testing::HasSubstr("temperature"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.temperature = NAN; })),
              testing::HasSubstr("temperature"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.top_p = 0; })), testing::HasSubstr("top_p"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.top_p = 1.5f; })), testing::HasSubstr("top_p"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.top_k = -2; })), testing::HasSubstr("top_k"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.min_p = 2; })), testing::HasSubstr("min_p"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.repetition_penalty = 0; })),
              testing::HasSubstr("repetition_penalty"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.frequency_penalty = 3; })),
              testing::HasSubstr("frequency_penalty"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.presence_penalty = -2.5f; })),
              testing::HasSubstr("presence_penalty"));
  EXPECT_THAT(message_of(with([](SamplingParams& p) { p.top_logprobs = 21; })),
              testing::HasSubstr("top_logprobs"));
  EXPECT_EQ(message_of(SamplingParams{}), "");

  SamplingParams p;
  try {
    s.new_state(p, std::vector<int32_t>{1, 10});
    ADD_FAILURE() << "no error for a prompt id outside the vocabulary";
  } catch (const ms::Error& e) {
    EXPECT_THAT(e.message(), testing::HasSubstr("prompt_ids[1] = 10"));
  }
  SamplerState st = s.new_state(p, {});
  EXPECT_THROW(s.sample(std::vector<float>(9, 0.0f), p, st), ms::Error);
  std::vector<float> nan_row(10, 0.0f);
  nan_row[3] = NAN;
  EXPECT_THROW(s.sample(nan_row, p, st), ms::Error);
  EXPECT_THROW(s.sample(std::vector<float>(10, -INFINITY), p, st), ms::Error);

  // A batch names the failing row and refuses one state in two rows.
  std::vector<float> batch(20, 0.0f);
  batch[15] = NAN;
  SamplerState st2 = s.new_state(p, {});
  std::vector<const SamplingParams*> pp = {&p, &p};
  std::vector<SamplerState*> sp = {&st, &st2};
  std::vector<GeneratedToken> out(2);
  try {
    s.sample_batch(batch, pp, sp, out);
    ADD_FAILURE() << "no error for a NaN row";
  } catch (const ms::Error& e) {
    EXPECT_THAT(e.message(), testing::HasSubstr("row 1"));
  }
  sp = {&st, &st};
  EXPECT_THROW(s.sample_batch(std::vector<float>(20, 0.0f), pp, sp, out), ms::Error);
}

// logit_bias moves the logits the draw sees (not the reported logprobs); ids and values are validated.
TEST(Sampler, LogitBiasShiftsTheDistributionAndIsValidated) {
  Sampler s(4, fixed_seed());
  const std::vector<float> x = {0.0f, 2.0f, 1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_logprobs = 0;
  p.logit_bias = {{0, 5.0f}, {1, -100.0f}};
  SamplerState st = s.new_state(p, {});
  const GeneratedToken g = s.sample(x, p, st);
  EXPECT_EQ(g.token, 0);  // 0 + 5 beats 2 - 100 and the rest
  double z = 0;
  for (float v : x) z += std::exp(v);
  EXPECT_NEAR(g.logprob, 0.0 - std::log(z), 1e-5);  // raw logprob, before the bias

  // Temperature 1: probabilities are softmax(x + bias).
  p.temperature = 1.0f;
  p.logit_bias = {{3, 1.5f}};
  const auto d = s.kept_distribution(x, p, s.new_state(p, {}));
  const std::vector<float> biased = {0.0f, 2.0f, 1.0f, 2.0f};
  double zb = 0;
  for (float v : biased) zb += std::exp(v);
  for (const auto& e : d)
    EXPECT_NEAR(e.probability, std::exp(biased[static_cast<size_t>(e.token)]) / zb, 1e-5);

  p.logit_bias = {{4, 1.0f}};
  EXPECT_THROW(
      {
        try {
          s.new_state(p, {});
        } catch (const ms::Error& e) {
          EXPECT_THAT(e.message(), ::testing::HasSubstr("logit_bias: token id 4 is outside the vocabulary"));
          throw;
        }
      },
      ms::Error);
  p.logit_bias = {{1, 100.5f}};
  EXPECT_THROW(s.new_state(p, {}), ms::Error);
}
