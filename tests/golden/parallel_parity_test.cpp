// Tensor and expert parallelism on the CPU: a model split over ranks (threads of a local group, each loading
// only its shard) gives the same greedy tokens as the whole model and logits within 1e-5 relative (f32 KV),
// on the golden fixtures and on generated weights with NVFP4 experts; each rank loads the bytes the memory
// planner gives it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "golden_fixture.h"
#include "io/quant_config.h"
#include "kv/forward_batch.h"
#include "kv/page_allocator.h"
#include "model/load_model.h"
#include "model/random_weights.h"
#include "model/weight_loader.h"
#include "model/weight_spec.h"
#include "moe/expert_distribution.h"
#include "runtime/local_parallel_executor.h"
#include "test_executor.h"

namespace ms {
namespace {

struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // every step's last-row logits
};

// Prompt prefill in one step, then `steps` greedy decode steps, on `exec`'s f32 pages; `record`, when given,
// counts every step's routing.
Greedy run_greedy(runtime::Executor& exec, const std::vector<int32_t>& prompt, int steps,
                  moe::ExpertDistribution* record = nullptr) {
  const int32_t ps = exec.kv_capacity().page_size;
  kv::PageAllocator alloc(exec.kv_capacity().num_pages);
  std::vector<int32_t> pages;
  const int64_t total = static_cast<int64_t>(prompt.size()) + steps;
  EXPECT_TRUE(alloc.allocate(static_cast<int32_t>((total + ps - 1) / ps), pages));
  const int64_t V = exec.model().config().vocab_size;
  Greedy g;
  std::vector<int32_t> ids = prompt;
  size_t start = 0;
  for (int s = 0; s <= steps; ++s) {
    const size_t n = ids.size() - start;
    kv::ForwardBatchBuilder bb(ps);
    bb.add_sequence(pages, static_cast<int32_t>(start), ids.data() + start, static_cast<int32_t>(n), true);
    kv::ForwardBatch b = bb.finish();
    model::StepRouting routing;
    routing.expert_distribution = record;
    const Tensor lg = exec.run(b, routing);
    EXPECT_EQ(lg.size(0), 1);
    const float* row = lg.data<float>();
    g.logits.insert(g.logits.end(), row, row + V);
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + V) - row);
    g.tokens.push_back(next);
    start = ids.size();
    ids.push_back(next);
  }
  return g;
}

runtime::ExecutorConfig exec_config() {
  return test::ExecPool::config(4, 64, kv::KvCacheDType::F32, 256, 4);
}

struct Split {
  int tp, ep;
};

// Every split of `cfg` the tests run: TP2, EP2, EP4 (where experts divide), TP2+EP2.
std::vector<Split> splits(const io::ModelConfig& cfg) {
  std::vector<Split> out{{2, 1}, {1, 2}, {2, 2}};
  if (cfg.n_routed_experts % 4 == 0) out.push_back({1, 4});
  return out;
}

void expect_parallel_matches(const io::ModelConfig& cfg, const model::TensorSource& src,
                             const std::vector<int32_t>& prompt, int steps, const std::string& what) {
  auto whole = std::make_shared<model::Model>(cfg, model::load_weights(cfg, src));
  runtime::CpuExecutor one(whole, exec_config());
  const Greedy want = run_greedy(one, prompt, steps);
  for (const Split& s : splits(cfg)) {
    SCOPED_TRACE(fmt::format("{} tp {} ep {}", what, s.tp, s.ep));
    auto shards = model::load_model_shards(cfg, src, s.tp, s.ep);
    std::vector<std::shared_ptr<const model::Model>> ranks(shards.begin(), shards.end());
    runtime::LocalParallelExecutor par(ranks, exec_config(), std::chrono::milliseconds(60000));
    EXPECT_EQ(par.model().config().num_attention_heads, cfg.num_attention_heads / s.tp);
    const Greedy got = run_greedy(par, prompt, steps);
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < want.logits.size(); ++i) {
      num = std::max(num, static_cast<double>(std::fabs(got.logits[i] - want.logits[i])));
      den = std::max(den, static_cast<double>(std::fabs(want.logits[i])));
    }
    EXPECT_LT(num / den, 1e-5) << "max abs diff " << num << " of max " << den;
    EXPECT_GT(num, 0.0) << "bit-identical to one rank: the split may not have happened";
  }
}

void expect_close(const Greedy& got, const Greedy& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(got.logits[i] - want.logits[i])));
    den = std::max(den, static_cast<double>(std::fabs(want.logits[i])));
  }
  EXPECT_LT(num / den, 1e-5) << "max abs diff " << num << " of max " << den;
}

// Expert parallelism with redundant experts (EPLB): each layer's placement replicates the experts the whole
// model routed this prompt to most (counts recorded on the same run), so the replicated experts are the ones
// in use; every assignment must run on exactly one copy for the sums to equal one rank's.
void expect_replicated_matches(const io::ModelConfig& cfg, const model::TensorSource& src,
                               const std::vector<int32_t>& prompt, int steps, const std::string& what) {
  auto whole = std::make_shared<model::Model>(cfg, model::load_weights(cfg, src));
  runtime::CpuExecutor one(whole, exec_config());
  std::vector<int> moe_layers;
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    if (cfg.layer_is_moe[static_cast<size_t>(l)]) moe_layers.push_back(l);
  moe::ExpertDistribution record(cfg.n_routed_experts, moe_layers);
  const Greedy want = run_greedy(one, prompt, steps, &record);
  const auto counts = record.counts();
  struct Case {
    int tp, ep, redundant;
  };
  std::vector<Case> cases{{1, 2, 2}, {1, 2, 4}, {2, 2, 2}};
  if (cfg.n_routed_experts % 4 == 0) cases.push_back({1, 4, 4}), cases.push_back({1, 4, 8});
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} tp {} ep {} redundant {}", what, c.tp, c.ep, c.redundant));
    const auto placement =
        dist::LayerPlacements::with_redundancy(cfg.n_routed_experts, c.ep, c.redundant, counts);
    // The replicas are in use: in every MoE layer an expert with several copies was routed to.
    for (const auto& [l, p] : placement.layers()) {
      uint64_t replicated = 0;
      for (int e = 0; e < cfg.n_routed_experts; ++e)
        if (p.replicas(e).size() > 1) replicated += counts.at(l)[static_cast<size_t>(e)];
      EXPECT_GT(replicated, 0u) << "layer " << l;
    }
    auto shards = model::load_model_shards(cfg, src, c.tp, c.ep, &placement);
    const size_t slots = static_cast<size_t>((cfg.n_routed_experts + c.redundant) / c.ep);
    for (const auto& sh : shards)
      for (int l : moe_layers)
        EXPECT_EQ(sh->weights().layers[static_cast<size_t>(l)].moe.experts.size(), slots);
    std::vector<std::shared_ptr<const model::Model>> ranks(shards.begin(), shards.end());
    runtime::LocalParallelExecutor par(ranks, exec_config(), std::chrono::milliseconds(60000));
    expect_close(run_greedy(par, prompt, steps), want);
  }
}

class ParallelGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelGolden, RedundantExpertsMatchOneRank) {
  auto f = test::load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  expect_replicated_matches(f->cfg, *f->src, f->prompts.front(), 4, GetParam());
}

TEST_P(ParallelGolden, SplitRanksMatchOneRank) {
  auto f = test::load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  std::vector<int32_t> prompt = f->prompts.front();
  expect_parallel_matches(f->cfg, *f->src, prompt, 4, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParallelGolden,
                         ::testing::Values("glm5_tiny", "deepseek_v3_tiny", "deepseek_v3_tiny_qproj",
                                           "trained_builtin"));

// Generated weights (the gen-model / --load-format dummy source) with NVFP4 experts: row and column slices of
// packed weights and their block scales.
TEST(ParallelGenerated, Nvfp4ExpertsMatchOneRank) {
  auto f = test::load_fixture("glm5_tiny");
  if (!f) GTEST_SKIP() << "fixture glm5_tiny is absent";
  const model::RandomSource gen(f->cfg, model::quant_config_for(f->cfg, "nvfp4", "--quantization"), 7);
  model::MemorySource src("generated nvfp4");  // generated once, loaded by every rank of every split
  for (const auto& spec : gen.specs())
    if (!spec.mtp) src.put(spec.name, gen.tensor(spec.name));
  expect_parallel_matches(f->cfg, src, {1, 5, 9, 33, 2, 17, 40, 3}, 3, "generated nvfp4");
}

// Stored bytes of what a rank loaded, by the planner's roles.
struct Loaded {
  uint64_t heads = 0, dense = 0, routed = 0, replicated = 0;
};
uint64_t lin(const ops::LinearWeight& w) {
  return w.defined() ? w.weight.nbytes() + (w.scale.defined() ? w.scale.nbytes() : 0) : 0;
}
Loaded loaded_bytes(const model::ModelWeights& w) {
  Loaded b;
  b.replicated += lin(w.embed) + (w.lm_head.weight.raw() == w.embed.weight.raw() ? 0 : lin(w.lm_head));
  for (const auto& L : w.layers) {
    const auto& a = L.attn;
    b.heads += lin(a.q_b_proj) + lin(a.q_proj) + lin(a.kv_b_proj) + lin(a.o_proj);
    b.replicated += lin(a.q_a_proj) + lin(a.kv_a_proj);
    if (a.has_indexer) b.replicated += lin(a.indexer.wq_b) + lin(a.indexer.wk) + lin(a.indexer.weights_proj);
    if (L.is_moe) {
      for (const auto& e : L.moe.experts) b.routed += lin(e.gate) + lin(e.up) + lin(e.down);
      b.replicated +=
          lin(L.moe.router) + lin(L.moe.shared.gate) + lin(L.moe.shared.up) + lin(L.moe.shared.down);
    } else {
      b.dense += lin(L.mlp.gate) + lin(L.mlp.up) + lin(L.mlp.down);
    }
  }
  return b;
}

TEST(ParallelLoad, EachRankLoadsThePlannersBytes) {
  auto f = test::load_fixture("glm5_tiny");
  if (!f) GTEST_SKIP() << "fixture glm5_tiny is absent";
  const io::QuantConfig q = io::load_quant_config(f->src->checkpoint().dir());
  const dist::WeightBytes wb = model::parallel_weight_bytes(f->cfg, q, DType::F32);
  const Loaded whole = loaded_bytes(model::load_weights(f->cfg, *f->src));
  EXPECT_EQ(whole.heads, wb.attention_heads);
  EXPECT_EQ(whole.dense, wb.dense_mlp);
  EXPECT_EQ(whole.routed, wb.routed_experts);
  for (const Split& s : splits(f->cfg)) {
    dist::MemoryOptions o;
    o.tp_size = s.tp;
    o.ep_size = s.ep;
    o.gpu_memory_bytes = 1ull << 40;
    const dist::MemoryPlan plan = dist::plan_memory(wb, o);
    auto role = [&](const std::string& name) {
      for (const auto& r : plan.weights)
        if (r.role == name) return r.bytes;
      ADD_FAILURE() << "no role " << name;
      return uint64_t{0};
    };
    for (int r = 0; r < std::max(s.tp, s.ep); ++r) {
      SCOPED_TRACE(fmt::format("tp {} ep {} rank {}", s.tp, s.ep, r));
      model::WeightShard ws;
      ws.spec = model::shard_for_rank(s.tp, s.ep, r);
      const Loaded got = loaded_bytes(model::load_weights(f->cfg, *f->src, ws));
      EXPECT_EQ(got.heads, role("attention") - wb.attention_shared);
      EXPECT_EQ(got.dense, role("dense_mlp"));
      EXPECT_EQ(got.routed, role("routed_experts"));
      EXPECT_EQ(got.replicated, whole.replicated);
    }
  }
}

TEST(ParallelLoad, SplitsThatDoNotDivideAreNamed) {
  auto f = test::load_fixture("glm5_tiny");
  if (!f) GTEST_SKIP() << "fixture glm5_tiny is absent";
  auto msg = [&](int tp, int ep) {
    try {
      model::WeightShard ws;
      ws.spec = {0, tp, 0, ep};
      model::load_weights(f->cfg, *f->src, ws);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg(3, 1).find("--tp-size 3 does not divide num_attention_heads 4"), std::string::npos);
  EXPECT_NE(msg(1, 3).find("--ep-size 3 does not divide n_routed_experts 16"), std::string::npos);
  EXPECT_THROW(model::shard_for_rank(2, 4, 0), Error);
}

}  // namespace
}  // namespace ms
