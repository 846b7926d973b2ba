// Step routing in the forward pass: OEA applies to decode tokens only, k0 = top_k changes nothing, the
// distinct experts OEA leaves a decode step never exceed plain routing's, and the router follows each
// architecture's masking of dropped expert groups.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "model/builtin_model.h"
#include "model/weight_loader.h"
#include "test_executor.h"

namespace ms {
namespace {

std::shared_ptr<model::Model> builtin() {
  static std::shared_ptr<model::Model> m = model::make_builtin_model();
  return m;
}

std::vector<int32_t> prompt(int n, int seed) {
  std::vector<int32_t> ids;
  uint32_t s = static_cast<uint32_t>(seed) * 2654435761u + 7;
  for (int i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    ids.push_back(static_cast<int32_t>((s >> 8) % model::kBuiltinVocab));
  }
  return ids;
}

// B sequences prefilled in one pool; then steps that mix decode tokens and a prefill chunk.
struct Batch {
  model::Model& m;
  test::ExecPool pool;
  std::vector<std::vector<int32_t>> pages, ids;
  std::vector<int32_t> computed;
  explicit Batch(model::Model& mm, int B, int extra_prompt = 0)
      : m(mm), pool(mm, 256, 16, kv::KvCacheDType::F32) {
    for (int i = 0; i < B; ++i) {
      ids.push_back(prompt(3 + i % 5 + (i == 0 ? extra_prompt : 0), i + 1));
      pages.emplace_back();
      EXPECT_TRUE(pool.allocator().allocate(pool.pages_for(64), pages.back()));
      computed.push_back(0);
    }
  }
  // Runs every sequence's uncomputed tokens (sequence 0: at most `chunk0`); tokens past their sequence's
  // prompt length are decode tokens. Returns logits of every token [n_tokens, vocab].
  std::vector<int32_t> n_of;
  Tensor step(const model::StepRouting& base, std::vector<int>& prompt_len, int chunk0 = 1000) {
    kv::ForwardBatchBuilder bb(16);
    model::StepRouting r = base;
    r.decode_tokens.clear();
    n_of.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t left = static_cast<int32_t>(ids[i].size()) - computed[i];
      const int32_t n = i == 0 ? std::min<int32_t>(chunk0, left) : left;
      n_of.push_back(n);
      bb.add_sequence(pages[i], computed[i], ids[i].data() + computed[i], n, false);
      r.decode_tokens.insert(r.decode_tokens.end(), static_cast<size_t>(n),
                             computed[i] >= prompt_len[i] ? 1 : 0);
    }
    kv::ForwardBatch b = bb.finish();
    for (int32_t t = 0; t < b.n_tokens(); ++t) b.logit_rows.push_back(t);
    Tensor lg = pool.forward(b, r);
    for (size_t i = 0; i < ids.size(); ++i) computed[i] += n_of[i];
    return lg;
  }
  void append(size_t i, int32_t t) { ids[i].push_back(t); }
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data<float>(), b.data<float>(), a.numel() * 4) == 0;
}

model::StepRouting oea(int k0, moe::ExpertStats* stats = nullptr) {
  model::StepRouting r;
  r.oea = moe::OeaConfig{true, k0, 0};
  r.expert_stats = stats;
  return r;
}

// Prefill all, then `steps` decode steps feeding the same tokens to both; returns the decode logits.
std::vector<std::pair<Tensor, Tensor>> decode_pair(const model::StepRouting& ra, const model::StepRouting& rb,
                                                   int B, int steps) {
  Batch a(*builtin(), B), b(*builtin(), B);
  std::vector<int> plen;
  for (auto& v : a.ids) plen.push_back(static_cast<int>(v.size()));
  EXPECT_TRUE(bitwise_equal(a.step(ra, plen), b.step(rb, plen))) << "prefill differs";
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < B; ++i) {
      a.append(static_cast<size_t>(i), (s * 31 + i * 7) % 512);
      b.append(static_cast<size_t>(i), (s * 31 + i * 7) % 512);
    }
    out.emplace_back(a.step(ra, plen), b.step(rb, plen));
  }
  return out;
}

TEST(OeaRouting, K0EqualToTopKGivesTheSameLogitsAsPlainRouting) {
  const int K = builtin()->router_config().top_k;
  for (const auto& [plain, with_oea] : decode_pair(model::StepRouting{}, oea(K), 8, 3))
    EXPECT_TRUE(bitwise_equal(plain, with_oea));
}

TEST(OeaRouting, SmallerK0ChangesDecodeAndNeverWidensTheExpertSet) {
  const int L = builtin()->config().num_hidden_layers, E = builtin()->config().n_routed_experts;
  moe::ExpertStats stats(L, E);
  bool differs = false;
  for (const auto& [plain, with_oea] : decode_pair(model::StepRouting{}, oea(1, &stats), 8, 4))
    differs = differs || !bitwise_equal(plain, with_oea);
  EXPECT_TRUE(differs) << "k0 = 1 left every decode logit unchanged: OEA never ran";
  for (int l = 0; l < L; ++l) {
    const auto hb = stats.histogram(l, moe::RoutingKind::Baseline),
               ho = stats.histogram(l, moe::RoutingKind::Oea);
    EXPECT_EQ(hb.count, builtin()->config().layer_is_moe[static_cast<size_t>(l)] ? 4u : 0u) << "layer " << l;
    EXPECT_EQ(ho.count, hb.count);
  }
  EXPECT_LT(stats.mean(moe::RoutingKind::Oea), stats.mean(moe::RoutingKind::Baseline));
}

TEST(OeaRouting, DistinctExpertsPerStepNeverExceedPlainRouting) {
  const int L = builtin()->config().num_hidden_layers, E = builtin()->config().n_routed_experts;
  for (int k0 = 1; k0 <= builtin()->router_config().top_k; ++k0)
    for (int B : {1, 3, 8, 16}) {
      moe::ExpertStats stats(L, E);
      Batch b(*builtin(), B);
      std::vector<int> plen;
      for (auto& v : b.ids) plen.push_back(static_cast<int>(v.size()));
      b.step(oea(k0, &stats), plen);
      for (int s = 0; s < 3; ++s) {
        for (int i = 0; i < B; ++i) b.append(static_cast<size_t>(i), (s * 13 + i * 5 + k0) % 512);
        std::vector<double> before_b, before_o;
        for (int l = 0; l < L; ++l) {
          before_b.push_back(stats.histogram(l, moe::RoutingKind::Baseline).sum);
          before_o.push_back(stats.histogram(l, moe::RoutingKind::Oea).sum);
        }
        b.step(oea(k0, &stats), plen);
        for (int l = 0; l < L; ++l) {
          const double db =
              stats.histogram(l, moe::RoutingKind::Baseline).sum - before_b[static_cast<size_t>(l)];
          const double dn = stats.histogram(l, moe::RoutingKind::Oea).sum - before_o[static_cast<size_t>(l)];
          EXPECT_LE(dn, db) << "k0 " << k0 << " batch " << B << " step " << s << " layer " << l;
          if (k0 == builtin()->router_config().top_k) {
            EXPECT_EQ(dn, db);
          }
        }
      }
    }
}

TEST(OeaRouting, PrefillTokensKeepPlainRoutingInAMixedStep) {
  // Sequence 0 has a long prompt still prefilling (chunks of 4) while the others decode.
  const int B = 8;
  Batch a(*builtin(), B, 12), b(*builtin(), B, 12);
  std::vector<int> plen;
  for (auto& v : a.ids) plen.push_back(static_cast<int>(v.size()));
  const model::StepRouting plain, with_oea = oea(1);
  a.step(plain, plen, 4);
  b.step(with_oea, plen, 4);
  for (int s = 0; s < 3; ++s) {
    for (int i = 1; i < B; ++i) {
      a.append(static_cast<size_t>(i), (s * 17 + i) % 512);
      b.append(static_cast<size_t>(i), (s * 17 + i) % 512);
    }
    Tensor la = a.step(plain, plen, 4), lb = b.step(with_oea, plen, 4);
    const int64_t V = builtin()->config().vocab_size;
    // The prefill chunk is sequence 0's, first in the batch. Its rows use plain routing, and its attention
    // reads only its own cache, so they match bit for bit.
    const int64_t n0 = a.n_of[0];
    ASSERT_GT(n0, 0);
    ASSERT_EQ(la.size(0), n0 + B - 1);
    EXPECT_EQ(std::memcmp(la.data<float>(), lb.data<float>(), static_cast<size_t>(n0 * V) * 4), 0)
        << "step " << s;
    EXPECT_NE(std::memcmp(la.data<float>() + n0 * V, lb.data<float>() + n0 * V,
                          static_cast<size_t>((B - 1) * V) * 4),
              0)
        << "the decode rows should feel OEA k0 = 1";
  }
}

TEST(OeaRouting, PrefillOnlyStepIgnoresOea) {
  Batch a(*builtin(), 6), b(*builtin(), 6);
  std::vector<int> plen;
  for (auto& v : a.ids) plen.push_back(static_cast<int>(v.size()));
  moe::ExpertStats stats(builtin()->config().num_hidden_layers, builtin()->config().n_routed_experts);
  EXPECT_TRUE(bitwise_equal(a.step(model::StepRouting{}, plen), b.step(oea(1, &stats), plen)));
  EXPECT_EQ(stats.histogram(moe::RoutingKind::Baseline).count, 0u) << "prefill steps are not recorded";
}

TEST(OeaRouting, BadRoutingRequestsAreRefused) {
  Batch a(*builtin(), 2);
  std::vector<int> plen = {0, 0};  // everything counts as decode
  model::StepRouting r = oea(builtin()->router_config().top_k + 1);
  EXPECT_THROW(a.step(r, plen), Error);
  moe::ExpertStats wrong(1, 16);
  EXPECT_THROW(a.step(oea(1, &wrong), plen), Error);
}

TEST(OeaRouting, DroppedGroupsAreMaskedAsEachArchitectureDoes) {
  EXPECT_EQ(builtin()->router_config().masked_fill, moe::MaskedFill::NegInf);  // glm_moe_dsa
  for (auto arch : {io::ModelArch::DeepseekV3, io::ModelArch::DeepseekV32, io::ModelArch::KimiK2}) {
    io::ModelConfig c = model::builtin_model_config();
    c.arch = arch;
    c.has_indexer = arch == io::ModelArch::DeepseekV32;
    if (!c.has_indexer) c.indexer_types.clear();
    c.n_group = 4;
    c.topk_group = 2;
    auto src = model::builtin_model_weights(c);
    model::Model m(c, model::load_weights(c, *src));
    EXPECT_EQ(m.router_config().masked_fill, moe::MaskedFill::Zero);
    EXPECT_EQ(m.router_config().n_group, 4);
    EXPECT_EQ(m.router_config().group_score, moe::GroupScore::Top2Sum);
  }
}

}  // namespace
}  // namespace ms
