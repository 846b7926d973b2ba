// moeserve perplexity on the built-in model: decode and prefill modes agree with an exact cache, the figure
// is the mean NLL of a hand-made forward, a setting against itself reports no divergence, and a lossy cache
// or OEA reports some.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/perplexity.h"
#include "kv/forward_batch.h"
#include "model/builtin_model.h"
#include "test_executor.h"
#include "tokenizer/builtin.h"
#include "tokenizer/tokenizer.h"

namespace ms {
namespace {

model::Model& builtin() {
  static std::unique_ptr<model::Model> m = model::make_builtin_model();
  return *m;
}

std::vector<int32_t> text_ids() {
  auto tok = tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in");
  std::string text;
  for (int i = 0; i < 6; ++i)
    text += "The model reads a page of text and predicts every next token from the tokens before it. ";
  return tok->encode(text, false);
}

eval::PplSetting setting(kv::KvCacheDType dt, int k0 = 0) {
  eval::PplSetting s;
  s.model = &builtin();
  s.kv_dtype = dt;
  if (k0 > 0) s.oea = moe::OeaConfig{true, k0, 0};
  return s;
}

TEST(Perplexity, DecodeAndPrefillAgreeWithAnExactCache) {
  const auto ids = text_ids();
  eval::PplOptions o;
  o.context = 32;
  o.batch = 3;
  const auto dec = eval::perplexity(ids, setting(kv::KvCacheDType::F32), o);
  o.decode = false;
  const auto pre = eval::perplexity(ids, setting(kv::KvCacheDType::F32), o);
  EXPECT_EQ(dec.predicted_tokens, pre.predicted_tokens);
  EXPECT_EQ(dec.windows, static_cast<int>((ids.size() - 1) / 32 + 1));
  // Every window predicts all its tokens but the first.
  EXPECT_EQ(dec.predicted_tokens, static_cast<int64_t>(ids.size()) - dec.windows);
  EXPECT_NEAR(dec.test.nll_mean, pre.test.nll_mean, 1e-4 * pre.test.nll_mean);
  EXPECT_GT(dec.test.ppl, 1.0);
}

TEST(Perplexity, IsTheMeanNllOfAHandMadeForward) {
  const auto all = text_ids();
  const std::vector<int32_t> ids(all.begin(), all.begin() + 20);
  model::Model& m = builtin();
  test::ExecPool pool(m, 1, 64, kv::KvCacheDType::F32);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.allocator().allocate(1, pages));
  kv::ForwardBatchBuilder bb(64);
  bb.add_sequence(pages, 0, ids.data(), static_cast<int32_t>(ids.size()), false);
  kv::ForwardBatch b = bb.finish();
  for (int32_t i = 0; i < b.n_tokens(); ++i) b.logit_rows.push_back(i);
  Tensor lg = pool.forward(b);
  const int64_t V = m.config().vocab_size;
  double nll = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = lg.data<float>() + static_cast<int64_t>(t) * V;
    double mx = row[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    nll -= row[ids[t + 1]] - mx - std::log(sum);
  }
  nll /= static_cast<double>(ids.size() - 1);
  eval::PplOptions o;
  o.context = 64;
  const auto r = eval::perplexity(ids, setting(kv::KvCacheDType::F32), o);
  EXPECT_NEAR(r.test.nll_mean, nll, 1e-5 * nll);
  EXPECT_NEAR(r.test.ppl, std::exp(nll), 1e-4 * std::exp(nll));
}

TEST(Perplexity, ReferenceComparison) {
  const auto ids = text_ids();
  eval::PplOptions o;
  o.context = 40;
  o.batch = 4;
  const auto f32 = setting(kv::KvCacheDType::F32);
  const auto same = eval::perplexity(ids, f32, o, &f32);
  EXPECT_EQ(same.kl_mean, 0.0);
  EXPECT_EQ(same.kl_max, 0.0);
  EXPECT_EQ(same.top1_agreement, 1.0);
  EXPECT_DOUBLE_EQ(same.ppl_ratio(), 1.0);

  const auto fp8 = eval::perplexity(ids, setting(kv::KvCacheDType::FP8E4M3), o, &f32);
  ASSERT_TRUE(fp8.reference.has_value());
  EXPECT_DOUBLE_EQ(fp8.reference->ppl, same.test.ppl);
  EXPECT_GT(fp8.kl_mean, 0.0);
  EXPECT_GE(fp8.kl_max, fp8.kl_p99);
  EXPECT_GE(fp8.kl_p99, 0.0);
  EXPECT_LE(fp8.top1_agreement, 1.0);
  const nlohmann::json j = fp8.to_json();
  for (const char* k : {"ppl", "ppl_ratio", "kl_mean", "kl_p99", "kl_max", "top1_agreement", "reference"})
    EXPECT_TRUE(j.contains(k)) << k;

  // OEA keeping every expert is plain routing; keeping one changes the distributions.
  const int top_k = builtin().router_config().top_k;
  const auto full = eval::perplexity(ids, setting(kv::KvCacheDType::F32, top_k), o, &f32);
  EXPECT_EQ(full.kl_max, 0.0);
  const auto one = eval::perplexity(ids, setting(kv::KvCacheDType::F32, 1), o, &f32);
  EXPECT_GT(one.kl_mean, 0.0);
}

TEST(Perplexity, RefusesBadSettings) {
  const auto ids = text_ids();
  eval::PplOptions o;
  o.context = 1;
  EXPECT_THROW(eval::perplexity(ids, setting(kv::KvCacheDType::F32), o), Error);
  o.context = 32;
  o.decode = false;
  EXPECT_THROW(eval::perplexity(ids, setting(kv::KvCacheDType::F32, 2), o), Error);  // OEA needs decode
  o.decode = true;
  EXPECT_THROW(eval::perplexity({5}, setting(kv::KvCacheDType::F32), o), Error);
  EXPECT_THROW(eval::perplexity({5, 100000}, setting(kv::KvCacheDType::F32), o), Error);
}

}  // namespace
}  // namespace ms
