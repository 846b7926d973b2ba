// moe-eval on the built-in model: k0 = top_k reproduces the baseline exactly, smaller k0 touches fewer
// experts with sane quality figures, the JSON has its keys, and bad settings are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/moe_eval.h"
#include "model/builtin_model.h"
#include "tokenizer/builtin.h"
#include "tokenizer/tokenizer.h"

namespace ms {
namespace {

model::Model& builtin() {
  static std::unique_ptr<model::Model> m = model::make_builtin_model();
  return *m;
}

std::vector<std::vector<int32_t>> text_prompts(int batch) {
  auto tok = tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in");
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : eval::fixed_text_prompts(batch)) out.push_back(tok->encode(p));
  return out;
}

TEST(MoeEval, K0EqualToTopKIsTheBaseline) {
  eval::MoeEvalOptions o;
  o.k0 = builtin().router_config().top_k;
  o.steps = 4;
  const eval::MoeEvalResult r = eval::moe_eval_prompts(builtin(), text_prompts(8), o);
  EXPECT_EQ(r.top1_agreement, 1.0);
  EXPECT_EQ(r.kl_mean, 0.0);
  EXPECT_EQ(r.distinct_experts_oea, r.distinct_experts_baseline);
  EXPECT_EQ(r.compared, 8 * 4);
  EXPECT_EQ(r.moe_layers, (std::vector<int>{1, 2}));  // the built-in model's MoE layers
}

TEST(MoeEval, SmallerK0TouchesFewerExpertsAndTheJsonHasItsKeys) {
  eval::MoeEvalOptions o;
  o.k0 = 1;
  o.steps = 6;
  const eval::MoeEvalResult r = eval::moe_eval_prompts(builtin(), text_prompts(16), o);
  const int E = builtin().config().n_routed_experts, K = builtin().router_config().top_k;
  EXPECT_LT(r.distinct_experts_oea, r.distinct_experts_baseline);
  EXPECT_GE(r.distinct_experts_oea, 1.0);
  EXPECT_LE(r.distinct_experts_baseline, std::min(E, 16 * K));
  ASSERT_EQ(r.distinct_experts_oea_per_layer.size(), 2u);
  for (size_t l = 0; l < 2; ++l)
    EXPECT_LE(r.distinct_experts_oea_per_layer[l], r.distinct_experts_baseline_per_layer[l]);
  EXPECT_GE(r.top1_agreement, 0.0);
  EXPECT_LE(r.top1_agreement, 1.0);
  EXPECT_GT(r.kl_mean, 0.0);
  EXPECT_TRUE(std::isfinite(r.kl_mean));
  EXPECT_GE(r.kl_max, r.kl_mean);
  const nlohmann::json j = r.to_json();
  for (const char* key : {"distinct_experts_baseline", "distinct_experts_oea", "top1_agreement", "kl_mean"})
    EXPECT_TRUE(j.contains(key) && j[key].is_number()) << key;
  EXPECT_FALSE(j.contains("ppl_baseline"));
  EXPECT_EQ(j["k0"], 1);
  EXPECT_EQ(j["kmax"], K);
}

TEST(MoeEval, TextGivesPerplexities) {
  auto tok = tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in");
  std::string text;
  for (const auto& p : eval::fixed_text_prompts(32)) text += p + "\n";
  const std::vector<int32_t> ids = tok->encode(text);
  eval::MoeEvalOptions o;
  o.steps = 10;
  o.k0 = builtin().router_config().top_k;
  const eval::MoeEvalResult same = eval::moe_eval_text(builtin(), ids, 8, o);
  ASSERT_TRUE(same.ppl_baseline && same.ppl_oea);
  EXPECT_EQ(*same.ppl_baseline, *same.ppl_oea);
  EXPECT_GT(*same.ppl_baseline, 1.0);
  EXPECT_EQ(same.predicted_tokens, 8 * 11);  // 12 tokens a stream: 11 predicted, 10 of them by decode steps
  EXPECT_EQ(same.compared, 8 * 10);
  o.k0 = 1;
  const eval::MoeEvalResult r = eval::moe_eval_text(builtin(), ids, 8, o);
  EXPECT_EQ(*r.ppl_baseline, *same.ppl_baseline) << "the baseline run does not depend on k0";
  EXPECT_NE(*r.ppl_oea, *r.ppl_baseline);
  EXPECT_TRUE(std::isfinite(*r.ppl_oea));
  EXPECT_TRUE(r.to_json().contains("ppl_oea"));
}

TEST(MoeEval, FixedPromptsAreDistinctAndInRange) {
  const auto ids = eval::fixed_token_prompts(64, 320);
  ASSERT_EQ(ids.size(), 64u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_GE(ids[i].size(), 4u);
    for (int32_t t : ids[i]) EXPECT_TRUE(t >= 0 && t < 320);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(ids[i], ids[j]);
  }
  const auto text = eval::fixed_text_prompts(64);
  for (size_t i = 0; i < text.size(); ++i)
    for (size_t j = 0; j < i; ++j) EXPECT_NE(text[i], text[j]);
}

TEST(MoeEval, BadSettingsAreRefused) {
  eval::MoeEvalOptions o;
  o.k0 = 0;
  EXPECT_THROW(eval::moe_eval_prompts(builtin(), text_prompts(2), o), Error);
  o.k0 = 2;
  o.kmax = 1;
  EXPECT_THROW(eval::moe_eval_prompts(builtin(), text_prompts(2), o), Error);
  o.kmax = 0;
  EXPECT_THROW(eval::moe_eval_text(builtin(), {1, 2, 3}, 4, o), Error);
  EXPECT_THROW(eval::moe_eval_prompts(builtin(), {{1, 999}}, o), Error);
}

}  // namespace
}  // namespace ms
