// The engine's absorbed, paged forward pass against a naive Hugging-Face-shaped reference, for the built-in
// GLM-5-architecture model and DeepSeek-V3-shaped variants of it.
#include <gtest/gtest.h>

#include "model/builtin_model.h"
#include "model/weight_loader.h"
#include "model_test_util.h"
#include "reference_model.h"

namespace ms {
namespace {

std::vector<int32_t> prompt(int n, int seed = 1) {
  std::vector<int32_t> ids;
  uint32_t s = static_cast<uint32_t>(seed) * 2654435761u;
  for (int i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    ids.push_back(static_cast<int32_t>((s >> 8) % model::kBuiltinVocab));
  }
  return ids;
}

io::ModelConfig deepseek_variant() {
  io::ModelConfig c = model::builtin_model_config();
  c.model_type = "deepseek_v3";
  c.arch = io::ModelArch::DeepseekV3;
  c.has_indexer = false;
  c.indexer_types.clear();
  c.n_group = 4;
  c.topk_group = 2;
  c.rope.type = io::RopeType::Yarn;
  c.rope.factor = 4.0;
  c.rope.original_max_position_embeddings = 64;
  c.rope.mscale = 1.0;
  c.rope.mscale_all_dim = 1.0;
  c.rope.beta_fast = 32;
  c.rope.beta_slow = 1;
  return c;
}

struct Case {
  io::ModelConfig cfg;
  std::unique_ptr<model::MemorySource> src;
  std::unique_ptr<model::Model> model;
  explicit Case(io::ModelConfig c, model::ModelOptions opt = {}) : cfg(std::move(c)) {
    src = model::builtin_model_weights(cfg);
    model = std::make_unique<model::Model>(cfg, model::load_weights(cfg, *src), std::move(opt));
  }
};

void expect_matches_reference(Case& k, const std::vector<int32_t>& ids, int chunk, double tol,
                              kv::KvCacheDType dt = kv::KvCacheDType::F32) {
  test::Mat ref = test::reference_forward(k.cfg, *k.src, ids);
  test::Runner run(*k.model, dt);
  std::vector<float> got = run.run(ids, chunk);
  ASSERT_EQ(got.size(), ref.size());
  const int64_t V = k.cfg.vocab_size;
  for (size_t t = 0; t < ids.size(); ++t) {
    const double e = test::rel_error(got.data() + t * V, ref.data() + t * V, static_cast<size_t>(V));
    EXPECT_LT(e, tol) << "position " << t << " chunk " << chunk;
  }
}

TEST(Forward, Glm5BuiltinMatchesReferenceFullPrompt) {
  Case k(model::builtin_model_config());
  expect_matches_reference(k, prompt(40), 0, 1e-4);  // 40 > index_topk 16: the indexer really selects
}

TEST(Forward, Glm5BuiltinTokenByTokenDecodeMatchesReference) {
  Case k(model::builtin_model_config());
  expect_matches_reference(k, prompt(30, 2), 1, 1e-4);
}

TEST(Forward, Glm5BuiltinChunkedPrefillMatchesReference) {
  Case k(model::builtin_model_config());
  expect_matches_reference(k, prompt(37, 3), 7, 1e-4);
}

// Steps whose queries all sit below index_topk attend densely and only write the index keys; the steps past
// it select from keys the dense steps wrote. Both must match the reference, which always runs the indexer.
TEST(Forward, DsaDenseWhenShortMatchesReference) {
  model::ModelOptions opt;
  opt.dsa_dense_when_short = true;
  Case k(model::builtin_model_config(), opt);
  const int topk = static_cast<int>(k.cfg.index_topk);
  ASSERT_EQ(topk, 16);
  auto at = [](std::vector<int32_t> positions) {
    kv::ForwardBatch b;
    b.positions = std::move(positions);
    return b;
  };
  EXPECT_TRUE(k.model->dsa_dense_step(at({0, 3, topk - 1})));
  EXPECT_FALSE(k.model->dsa_dense_step(at({0, topk})));
  EXPECT_FALSE(k.model->dsa_dense_step(at({})));
  Case plain(model::builtin_model_config());
  EXPECT_FALSE(plain.model->dsa_dense_step(at({0})));
  expect_matches_reference(k, prompt(30, 2), 1, 1e-4);  // token by token: 16 dense steps, then 14 sparse
  expect_matches_reference(k, prompt(37, 3), 8, 1e-4);  // chunks [0, 8) and [8, 16) dense, the rest sparse
}

TEST(Forward, DeepseekV3YarnGroupedRoutingMatchesReference) {
  Case k(deepseek_variant());
  expect_matches_reference(k, prompt(33, 4), 0, 1e-4);
  expect_matches_reference(k, prompt(20, 5), 1, 1e-4);
}

TEST(Forward, NonInterleavedRope) {
  io::ModelConfig c = deepseek_variant();
  c.rope.interleaved = false;
  Case k(c);
  expect_matches_reference(k, prompt(25, 6), 0, 1e-4);
}

// The quantised caches against the reference that rounds its cached rows the same way: what remains is the
// engine's reading of the pages (in place, with the scale), so the fp32 tolerance applies. Against the
// unrounded reference the rows then move by the cache's own rounding.
TEST(Forward, Bf16AndFp8KvCacheReadInPlace) {
  Case k(model::builtin_model_config());
  const auto ids = prompt(24, 7);
  const int64_t V = k.cfg.vocab_size;
  struct Mode {
    kv::KvCacheDType dt;
    double (*round)(double);
  };
  for (Mode mode :
       {Mode{kv::KvCacheDType::BF16, test::round_bf16}, Mode{kv::KvCacheDType::FP8E4M3, test::round_fp8}}) {
    test::Mat ref = test::reference_forward(k.cfg, *k.src, ids, -1, mode.round, test::round_bf16);
    test::Mat exact = test::reference_forward(k.cfg, *k.src, ids);
    test::Runner run(*k.model, mode.dt);
    std::vector<float> got = run.run(ids, 1);
    double worst = 0, moved = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      worst =
          std::max(worst, test::rel_error(got.data() + t * V, ref.data() + t * V, static_cast<size_t>(V)));
      moved =
          std::max(moved, test::rel_error(got.data() + t * V, exact.data() + t * V, static_cast<size_t>(V)));
    }
    EXPECT_LT(worst, 1e-4) << kv::kv_cache_dtype_name(mode.dt);
    EXPECT_GT(moved, 1e-3) << kv::kv_cache_dtype_name(mode.dt) << " cache did not round";
  }
}

TEST(Forward, MixedPrefillAndDecodeInOneStep) {
  Case k(model::builtin_model_config());
  const auto a = prompt(21, 8), b = prompt(9, 9);
  test::Runner solo(*k.model, kv::KvCacheDType::F32);
  const auto ref_a = solo.run(a), ref_b = solo.run(b);
  const int64_t V = k.cfg.vocab_size;
  // Sequence a prefilled up to 20 tokens, then one step: a decodes token 20 while b prefills whole.
  test::ExecPool& pool = solo.pool;
  std::vector<int32_t> pa, pb;
  ASSERT_TRUE(pool.allocator().allocate(pool.pages_for(21), pa));
  ASSERT_TRUE(pool.allocator().allocate(pool.pages_for(9), pb));
  {
    kv::ForwardBatchBuilder bb(pool.page_size());
    bb.add_sequence(pa, 0, a.data(), 20, true);
    pool.forward(bb.finish());
  }
  kv::ForwardBatchBuilder bb(pool.page_size());
  bb.add_sequence(pa, 20, a.data() + 20, 1, true);
  bb.add_sequence(pb, 0, b.data(), 9, true);
  kv::ForwardBatch fb = bb.finish();
  ASSERT_EQ(fb.logit_rows, (std::vector<int32_t>{0, 9}));
  Tensor lg = pool.forward(fb);
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_NEAR(lg.data<float>()[v], ref_a[20 * V + v], 1e-4);
    EXPECT_NEAR(lg.data<float>()[V + v], ref_b[8 * V + v], 1e-4);
  }
}

}  // namespace
}  // namespace ms
