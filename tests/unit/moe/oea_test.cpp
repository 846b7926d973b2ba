// Opportunistic Expert Activation: the properties of arXiv:2511.02237's routing on random batches, checked
// against quantities the test derives itself from plain routing and from the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "moe/router.h"

using namespace ms::moe;

namespace {

struct Batch {
  std::vector<float> logits, bias;
  int n_tokens;
};

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Batch random_batch(const RouterConfig& c, int n_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.5f);
  std::uniform_int_distribution<int> coarse(-3, 3);
  Batch b{std::vector<float>(static_cast<size_t>(n_tokens) * c.n_experts), std::vector<float>(c.n_experts),
          n_tokens};
  // Every third seed uses coarse values: many exact ties.
  for (auto& v : b.logits) v = seed % 3 == 0 ? coarse(rng) * 0.5f : nd(rng);
  for (auto& v : b.bias) v = seed % 3 == 0 ? coarse(rng) * 0.1f : nd(rng) * 0.2f;
  return b;
}

RouterParams params(const RouterConfig& c, const Batch& b, Routed& r) {
  r.ids.assign(static_cast<size_t>(b.n_tokens) * c.top_k, 7777);
  r.weights.assign(r.ids.size(), 7777.f);
  return {b.logits.data(), c.use_correction_bias ? b.bias.data() : nullptr, r.ids.data(), r.weights.data(),
          b.n_tokens};
}

Routed route(const RouterConfig& c, const OeaConfig& oea, const Batch& b) {
  Routed r;
  route_cpu(c, oea, params(c, b, r));
  return r;
}

// Unbiased scores [n_tokens, n_experts], computed here from the logits; selection adds the bias.
std::vector<float> scores_of(const RouterConfig& c, const Batch& b) {
  std::vector<float> out(b.logits.size());
  for (int t = 0; t < b.n_tokens; ++t) {
    const float* l = b.logits.data() + static_cast<size_t>(t) * c.n_experts;
    float* o = out.data() + static_cast<size_t>(t) * c.n_experts;
    if (c.scoring == Scoring::Sigmoid) {
      for (int e = 0; e < c.n_experts; ++e) o[e] = 1.0f / (1.0f + std::exp(-l[e]));
      continue;
    }
    const float mx = *std::max_element(l, l + c.n_experts);
    float sum = 0;
    for (int e = 0; e < c.n_experts; ++e) sum += std::exp(l[e] - mx);
    for (int e = 0; e < c.n_experts; ++e) o[e] = std::exp(l[e] - mx) / sum;
  }
  return out;
}

struct Scores {
  const RouterConfig& c;
  const Batch& b;
  std::vector<float> table;
  Scores(const RouterConfig& c_, const Batch& b_) : c(c_), b(b_), table(scores_of(c_, b_)) {}
  float score(int t, int e) const { return table[static_cast<size_t>(t) * c.n_experts + e]; }
  float selection(int t, int e) const { return score(t, e) + (c.use_correction_bias ? b.bias[e] : 0.0f); }
};

// Groups kept for token t, derived from the logits (group score = top-2 sum; ties to the lower group).
std::vector<bool> eligible_experts(const RouterConfig& c, const Scores& sc, int t) {
  const int gs = c.n_experts / c.n_group;
  std::vector<std::pair<float, int>> g;
  for (int gi = 0; gi < c.n_group; ++gi) {
    std::vector<float> v;
    for (int e = gi * gs; e < (gi + 1) * gs; ++e) v.push_back(sc.selection(t, e));
    std::sort(v.rbegin(), v.rend());
    g.push_back({-(gs > 1 ? v[0] + v[1] : v[0]), gi});
  }
  std::sort(g.begin(), g.end());
  std::vector<bool> ok(c.n_experts, false);
  for (int i = 0; i < c.topk_group; ++i)
    for (int e = g[i].second * gs; e < (g[i].second + 1) * gs; ++e) ok[e] = true;
  return ok;
}

struct Shape {
  const char* name;
  int n, k, ng, tg;
  Scoring sc;
  bool bias;
  float scale;
};

const Shape kShapes[] = {
    {"ds16_g4", 16, 4, 4, 2, Scoring::Sigmoid, true, 2.5f},    // the hand-checked shape, randomised
    {"ds64_g8", 64, 8, 8, 4, Scoring::Sigmoid, true, 2.5f},    // DeepSeek-V3 proportions
    {"glm256", 256, 8, 1, 1, Scoring::Sigmoid, true, 2.5f},    // GLM-5
    {"qwen128", 128, 8, 1, 1, Scoring::Softmax, false, 1.0f},  // Qwen3-30B-A3B
};

RouterConfig config_of(const Shape& s) {
  RouterConfig c;
  c.n_experts = s.n;
  c.top_k = s.k;
  c.n_group = s.ng;
  c.topk_group = s.tg;
  c.scoring = s.sc;
  c.use_correction_bias = s.bias;
  c.routed_scaling_factor = s.scale;
  return c;
}

constexpr int kSeeds = 40;

}  // namespace

TEST(Oea, K0EqualsTopKIsPlainRouting) {
  for (const Shape& s : kShapes) {
    const RouterConfig c = config_of(s);
    for (int seed = 0; seed < kSeeds; ++seed) {
      const Batch b = random_batch(c, 1 + seed % 32, seed);
      const Routed plain = route(c, {}, b);
      const Routed oea = route(c, {true, c.top_k, 0}, b);
      ASSERT_EQ(plain.ids, oea.ids) << s.name << " seed " << seed;
      ASSERT_EQ(plain.weights, oea.weights) << s.name << " seed " << seed;  // bitwise
    }
  }
}

// All the per-token and per-batch properties at once, for several (k0, kmax) on every shape.
TEST(Oea, PropertiesOnRandomBatches) {
  for (const Shape& s : kShapes) {
    const RouterConfig c = config_of(s);
    const int k = c.top_k;
    const std::pair<int, int> ks[] = {{1, 0}, {k / 2, 0}, {k - 2, 0}, {k / 2, k - 1}, {k - 1, k - 1}};
    for (auto [k0, kmax_arg] : ks) {
      const int kmax = kmax_arg == 0 ? k : kmax_arg;
      for (int seed = 0; seed < kSeeds; ++seed) {
        const Batch b = random_batch(c, 1 + (seed * 7) % 64, 1000 + seed);
        const Routed plain = route(c, {}, b);
        const Routed oea = route(c, {true, k0, kmax_arg}, b);
        const Scores sc(c, b);
        SCOPED_TRACE(testing::Message() << s.name << " k0 " << k0 << " kmax " << kmax << " seed " << seed);

        // Base set from plain routing (its slots are in selection order, so the first k0 are the top-k0).
        std::vector<bool> base(c.n_experts, false);
        for (int t = 0; t < b.n_tokens; ++t)
          for (int i = 0; i < k0; ++i) base[plain.ids[t * k + i]] = true;
        const int base_size = static_cast<int>(std::count(base.begin(), base.end(), true));

        for (int t = 0; t < b.n_tokens; ++t) {
          const int32_t* ids = oea.ids.data() + t * k;
          const float* w = oea.weights.data() + t * k;
          // Keeps its top-k0, in the first k0 slots.
          for (int i = 0; i < k0; ++i) ASSERT_EQ(ids[i], plain.ids[t * k + i]) << "token " << t;
          int used = 0;
          while (used < k && ids[used] >= 0) ++used;
          ASSERT_GE(used, k0);
          ASSERT_LE(used, kmax);
          for (int i = used; i < k; ++i) {
            ASSERT_EQ(ids[i], -1);
            ASSERT_EQ(w[i], 0.0f);
          }
          const std::vector<bool> eligible = eligible_experts(c, sc, t);
          std::set<int> mine;
          float sum = 0;
          for (int i = 0; i < used; ++i) {
            ASSERT_TRUE(base[ids[i]]) << "expert " << ids[i] << " outside the base set";
            ASSERT_TRUE(eligible[ids[i]]) << "expert " << ids[i] << " from a masked group";
            ASSERT_TRUE(mine.insert(ids[i]).second) << "duplicate expert";
            if (i > 0) {
              ASSERT_GE(sc.selection(t, ids[i - 1]), sc.selection(t, ids[i]));
            }
            sum += sc.score(t, ids[i]);
          }
          // Weights renormalise over the final set and carry routed_scaling_factor.
          float wsum = 0;
          for (int i = 0; i < used; ++i) {
            ASSERT_NEAR(w[i], sc.score(t, ids[i]) / sum * c.routed_scaling_factor,
                        2e-6f * c.routed_scaling_factor);
            wsum += w[i];
          }
          ASSERT_NEAR(wsum, c.routed_scaling_factor, 1e-5f * c.routed_scaling_factor);
          // The fill is greedy: a token with a free slot has no eligible base-set expert left; a full token
          // skipped none that outranks its last pick.
          const float last = sc.selection(t, ids[used - 1]);
          for (int e = 0; e < c.n_experts; ++e) {
            if (!base[e] || !eligible[e] || mine.count(e)) continue;
            ASSERT_EQ(used, kmax) << "free slot but base expert " << e << " unused";
            ASSERT_LE(sc.selection(t, e), last) << "skipped base expert " << e;
          }
        }
        const int d_oea = count_distinct_experts(oea.ids.data(), b.n_tokens, k, c.n_experts);
        const int d_plain = count_distinct_experts(plain.ids.data(), b.n_tokens, k, c.n_experts);
        ASSERT_EQ(d_oea, base_size);  // never above the base set, and every top-k0 expert stays used
        ASSERT_LE(d_oea, d_plain);
      }
    }
  }
}

// A batch of one has nothing to piggyback on: OEA leaves it with exactly its top-k0.
TEST(Oea, SingleTokenKeepsOnlyTopK0) {
  const RouterConfig c = config_of(kShapes[1]);
  const Batch b = random_batch(c, 1, 5);
  const Routed plain = route(c, {}, b);
  const Routed oea = route(c, {true, 3, 0}, b);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(oea.ids[i], plain.ids[i]);
  for (int i = 3; i < c.top_k; ++i) EXPECT_EQ(oea.ids[i], -1);
}

// Hand case: 8 experts, top 3, k0 1. Token A ranks 0 > 1 > 2 > ...; token B ranks 1 > 5 > 0 > ...
// Base set {0, 1}. A keeps 0, fills 1 (base), then nothing else of its order is in the base: 2 slots used.
// B keeps 1, skips 5, fills 0.
TEST(Oea, FillByHand) {
  RouterConfig c;
  c.n_experts = 8;
  c.top_k = 3;
  c.use_correction_bias = false;
  const std::vector<float> a = {3, 2, 1, -1, -1, -1, -1, -1};
  const std::vector<float> bb = {0.5f, 3, -1, -1, -1, 2, -1, -1};
  Batch b{a, {}, 2};
  b.logits.insert(b.logits.end(), bb.begin(), bb.end());
  const Routed r = route(c, {true, 1, 0}, b);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, -1, 1, 0, -1}));
  auto sig = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  EXPECT_NEAR(r.weights[0], sig(3) / (sig(3) + sig(2)), 1e-6);
  EXPECT_NEAR(r.weights[4], sig(0.5f) / (sig(3) + sig(0.5f)), 1e-6);
  EXPECT_EQ(r.weights[2], 0.0f);
  EXPECT_EQ(count_distinct_experts(r.ids.data(), 2, 3, 8), 2);
}

// The cross-rank hook: base sets computed on token ranges and OR'd equal the whole batch's; a wider base set
// (other ranks' experts) only adds candidates; the full set gives plain routing back.
TEST(Oea, BaseSetStepsCompose) {
  for (const Shape& s : kShapes) {
    const RouterConfig c = config_of(s);
    const OeaConfig oea{true, c.top_k / 2, 0};
    for (int seed = 0; seed < 10; ++seed) {
      const Batch b = random_batch(c, 16, 2000 + seed);
      Routed whole_r;
      RouterParams whole = params(c, b, whole_r);
      std::vector<uint8_t> whole_set(c.n_experts, 0), split_set(c.n_experts, 0);
      oea_base_set_cpu(c, oea, whole, whole_set.data());
      // Two "ranks" holding tokens [0, 5) and [5, 16): each ORs its own tokens into the shared flags.
      RouterParams lo = whole, hi = whole;
      lo.n_tokens = 5;
      hi.logits += 5 * c.n_experts;
      hi.n_tokens = 11;
      std::vector<uint8_t> lo_set(c.n_experts, 0), hi_set(c.n_experts, 0);
      oea_base_set_cpu(c, oea, lo, lo_set.data());
      oea_base_set_cpu(c, oea, hi, hi_set.data());
      for (int e = 0; e < c.n_experts; ++e) split_set[e] = std::max(lo_set[e], hi_set[e]);  // all-reduce(max)
      ASSERT_EQ(split_set, whole_set) << s.name;

      route_oea_fill_cpu(c, oea, whole, split_set.data());
      const Routed direct = route(c, oea, b);
      ASSERT_EQ(whole_r.ids, direct.ids);
      ASSERT_EQ(whole_r.weights, direct.weights);

      // A wider set: every expert still lies in it, and the token's top-k0 stays.
      std::vector<uint8_t> wide = whole_set;
      std::mt19937 rng(seed);
      for (int i = 0; i < c.n_experts / 4; ++i) wide[rng() % c.n_experts] = 1;
      Routed wide_r;
      route_oea_fill_cpu(c, oea, params(c, b, wide_r), wide.data());
      for (int t = 0; t < b.n_tokens; ++t) {
        for (int i = 0; i < oea.k0; ++i) ASSERT_EQ(wide_r.ids[t * c.top_k + i], direct.ids[t * c.top_k + i]);
        for (int i = 0; i < c.top_k; ++i) {
          const int32_t e = wide_r.ids[t * c.top_k + i];
          if (e >= 0) {
            ASSERT_TRUE(wide[e]);
          }
        }
      }
      std::vector<uint8_t> all(c.n_experts, 1);
      Routed all_r;
      route_oea_fill_cpu(c, oea, params(c, b, all_r), all.data());
      ASSERT_EQ(all_r.ids, route(c, {}, b).ids);
    }
  }
}

// On batches that share preferences, OEA must actually cut the distinct experts (not only keep them).
TEST(Oea, ReducesDistinctExpertsOnTypicalBatches) {
  const RouterConfig c = config_of(kShapes[2]);  // 256 experts, top 8
  long plain_total = 0, oea_total = 0;
  for (int seed = 0; seed < 20; ++seed) {
    const Batch b = random_batch(c, 16, 3000 + seed);
    plain_total += count_distinct_experts(route(c, {}, b).ids.data(), 16, 8, 256);
    oea_total += count_distinct_experts(route(c, {true, 4, 0}, b).ids.data(), 16, 8, 256);
  }
  EXPECT_LT(oea_total, plain_total * 3 / 4) << "plain " << plain_total << " oea " << oea_total;
}

TEST(Oea, StepsRejectDisabledConfig) {
  const RouterConfig c = config_of(kShapes[0]);
  const Batch b = random_batch(c, 2, 1);
  Routed r;
  std::vector<uint8_t> set(c.n_experts, 0);
  EXPECT_THROW(oea_base_set_cpu(c, {}, params(c, b, r), set.data()), ms::Error);
  EXPECT_THROW(route_oea_fill_cpu(c, {true, 2, 0}, params(c, b, r), nullptr), ms::Error);
}

// Batches past the serial threshold run on several threads: the result must not depend on it.
TEST(Oea, LargeBatchMatchesTokenRanges) {
  for (const Shape& s : kShapes) {
    const RouterConfig c = config_of(s);
    const OeaConfig oea{true, 2, 0};
    const int nt = 300, chunk = 10;
    const Batch b = random_batch(c, nt, 4000);
    const Routed plain = route(c, {}, b), whole = route(c, oea, b);
    Routed r;
    RouterParams all = params(c, b, r);
    std::vector<uint8_t> set(c.n_experts, 0);
    for (int t0 = 0; t0 < nt; t0 += chunk) {
      RouterParams part = all;
      part.logits += static_cast<size_t>(t0) * c.n_experts;
      part.n_tokens = chunk;
      oea_base_set_cpu(c, oea, part, set.data());
    }
    for (int t0 = 0; t0 < nt; t0 += chunk) {
      RouterParams part = all;
      part.logits += static_cast<size_t>(t0) * c.n_experts;
      part.topk_ids += static_cast<size_t>(t0) * c.top_k;
      part.topk_weights += static_cast<size_t>(t0) * c.top_k;
      part.n_tokens = chunk;
      route_oea_fill_cpu(c, oea, part, set.data());
    }
    ASSERT_EQ(r.ids, whole.ids) << s.name;
    ASSERT_EQ(r.weights, whole.weights) << s.name;
    for (int t0 = 0; t0 < nt; t0 += chunk) {
      Batch part{std::vector<float>(b.logits.begin() + t0 * c.n_experts,
                                    b.logits.begin() + (t0 + chunk) * c.n_experts),
                 b.bias, chunk};
      const Routed pr = route(c, {}, part);
      ASSERT_TRUE(std::equal(pr.ids.begin(), pr.ids.end(), plain.ids.begin() + t0 * c.top_k)) << s.name;
    }
  }
}
