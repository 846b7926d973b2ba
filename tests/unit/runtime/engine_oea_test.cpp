// The Engine with Opportunistic Expert Activation: k0 = top_k changes nothing, the first token (from the
// prefill) never feels OEA, distinct-expert stats are recorded per decode step and OEA's never exceed the
// plain-routing baseline's, and bad settings are refused.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/builtin_model.h"
#include "runtime/engine.h"

namespace ms {
namespace {

std::shared_ptr<model::Model> builtin() {
  static std::shared_ptr<model::Model> m = model::make_builtin_model();
  return m;
}

runtime::EngineConfig config(int k0, bool stats) {
  runtime::EngineConfig cfg;
  cfg.page_size = 8;
  cfg.kv_cache_tokens = 2048;
  cfg.kv_cache_dtype = kv::KvCacheDType::F32;
  cfg.max_running = 8;
  cfg.max_prefill_tokens = 24;  // chunked prefill of the long prompt while others decode
  if (k0 > 0) cfg.oea = moe::OeaConfig{true, k0, 0};
  cfg.expert_stats = stats;
  return cfg;
}

struct Outcome {
  std::map<uint64_t, std::vector<runtime::GeneratedToken>> tokens;
  int decode_steps = 0;
};

// 8 requests, one with a 40-token prompt; `each_step` runs after every step.
Outcome run(
    runtime::Engine& e, const std::function<void()>& each_step = [] {}) {
  for (int i = 0; i < 8; ++i) {
    runtime::Request r;
    for (int j = 0; j < (i == 3 ? 40 : 3 + i); ++j) r.prompt_ids.push_back((i * 61 + j * 29 + 5) % 512);
    r.max_tokens = 6 + i;
    r.sampling.temperature = 0;
    r.sampling.top_logprobs = 0;  // the chosen token's logprob: a function of the whole logit row
    e.submit(std::move(r));
  }
  Outcome o;
  for (int guard = 0; e.has_work() && guard < 1000; ++guard) {
    for (const auto& out : e.step())
      for (const auto& g : out.tokens) o.tokens[out.request_id].push_back(g);
    each_step();
  }
  return o;
}

TEST(EngineOea, K0EqualToTopKMatchesOeaOff) {
  runtime::Engine off(builtin(), config(0, false)),
      same(builtin(), config(builtin()->router_config().top_k, true));
  const Outcome a = run(off), b = run(same);
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (const auto& [id, toks] : a.tokens) {
    const auto& other = b.tokens.at(id);
    ASSERT_EQ(toks.size(), other.size());
    for (size_t i = 0; i < toks.size(); ++i) {
      EXPECT_EQ(toks[i].token, other[i].token) << "request " << id << " token " << i;
      EXPECT_EQ(toks[i].logprob, other[i].logprob) << "request " << id << " token " << i;
    }
  }
  EXPECT_EQ(same.distinct_experts_histogram(moe::RoutingKind::Oea).sum,
            same.distinct_experts_histogram(moe::RoutingKind::Baseline).sum);
  EXPECT_GT(same.distinct_experts_histogram(moe::RoutingKind::Oea).count, 0u);
}

TEST(EngineOea, FirstTokenComesFromPlainPrefill) {
  runtime::Engine off(builtin(), config(0, false)), on(builtin(), config(1, false));
  const Outcome a = run(off), b = run(on);
  bool later_differs = false;
  for (const auto& [id, toks] : a.tokens) {
    const auto& other = b.tokens.at(id);
    EXPECT_EQ(toks[0].token, other[0].token) << "request " << id;
    EXPECT_EQ(toks[0].logprob, other[0].logprob) << "request " << id;
    for (size_t i = 1; i < std::min(toks.size(), other.size()); ++i)
      later_differs = later_differs || toks[i].logprob != other[i].logprob;
  }
  EXPECT_TRUE(later_differs) << "OEA with k0 = 1 never changed a decode step";
}

TEST(EngineOea, DistinctExpertsPerDecodeStepNeverExceedBaseline) {
  runtime::Engine e(builtin(), config(2, true));
  const moe::ExpertStats* st = e.expert_stats();
  ASSERT_NE(st, nullptr);
  const int L = st->n_layers();
  std::vector<double> base(static_cast<size_t>(L), 0), oea(static_cast<size_t>(L), 0);
  int checked = 0;
  run(e, [&] {
    for (int l = 0; l < L; ++l) {
      const double b = st->histogram(l, moe::RoutingKind::Baseline).sum;
      const double o = st->histogram(l, moe::RoutingKind::Oea).sum;
      EXPECT_LE(o - oea[static_cast<size_t>(l)], b - base[static_cast<size_t>(l)]) << "layer " << l;
      checked += b > base[static_cast<size_t>(l)];
      base[static_cast<size_t>(l)] = b;
      oea[static_cast<size_t>(l)] = o;
    }
  });
  EXPECT_GT(checked, 10);
  const auto hb = e.distinct_experts_histogram(moe::RoutingKind::Baseline);
  const auto ho = e.distinct_experts_histogram(moe::RoutingKind::Oea);
  EXPECT_EQ(hb.count, ho.count);
  EXPECT_LT(ho.mean(), hb.mean());
  EXPECT_EQ(hb.bounds.back(), builtin()->config().n_routed_experts);
  EXPECT_EQ(hb.cumulative().back(), hb.count);
}

TEST(EngineOea, StatsAreOffByDefault) {
  runtime::Engine e(builtin(), runtime::EngineConfig{});
  EXPECT_EQ(e.expert_stats(), nullptr);
  EXPECT_TRUE(e.distinct_experts_histogram(moe::RoutingKind::Baseline).bounds.empty());
}

void expect_refused(runtime::EngineConfig cfg, const std::string& needle) {
  try {
    runtime::Engine e(builtin(), cfg);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& err) {
    EXPECT_NE(err.message().find(needle), std::string::npos) << err.message();
  }
}

TEST(EngineOea, BadSettingsAreRefused) {
  const int K = builtin()->router_config().top_k;
  expect_refused(config(K + 1, false), "--oea-k0 5 must be in [1, 4]");
  runtime::EngineConfig c = config(2, false);
  c.oea.kmax = 1;
  expect_refused(c, "--oea-kmax 1 must be in [--oea-k0 2, 4]");
}

}  // namespace
}  // namespace ms
