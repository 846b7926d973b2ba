// config.json -> ModelConfig on the published configs of each supported model type, both RoPE spellings,
// the layer-plan and indexer-plan rules, and the errors bad configs give.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_config.h"

namespace ms::io {
namespace {

using nlohmann::json;

const std::string kConfigs = std::string(MS_TEST_DATA) + "/configs/";

json read(const std::string& name) {
  std::ifstream in(kConfigs + name);
  EXPECT_TRUE(in.good()) << name;
  return json::parse(in);
}

// The message of the ms::Error that parsing `j` throws ("" when it parses).
std::string parse_error(const json& j) {
  try {
    parse_model_config(j, "cfg.json");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(ModelConfig, Glm5) {
  ModelConfig c = parse_model_config(read("glm5_config.json"));
  EXPECT_EQ(c.arch, ModelArch::GlmMoeDsa);
  EXPECT_EQ(c.num_hidden_layers, 78);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_attention_heads, 64);
  ASSERT_TRUE(c.q_lora_rank.has_value());
  EXPECT_EQ(*c.q_lora_rank, 2048);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 256);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.kv_cache_width(), 576);
  EXPECT_EQ(c.rope.type, RopeType::Default);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.vocab_size, 154880);
  ASSERT_EQ(c.layer_is_moe.size(), 78u);
  EXPECT_FALSE(c.layer_is_moe[0]);
  EXPECT_FALSE(c.layer_is_moe[2]);
  EXPECT_TRUE(c.layer_is_moe[3]);
  EXPECT_EQ(c.num_moe_layers(), 75);
  EXPECT_TRUE(c.has_indexer);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  // No indexer_types and no schedule fields: freq 1 makes every layer "full".
  EXPECT_EQ(c.num_full_indexer_layers(), 78);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{154820, 154827, 154829}));
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / 16.0);
}

TEST(ModelConfig, DeepseekV3YarnScale) {
  ModelConfig c = parse_model_config(read("deepseek_v3_config.json"));
  EXPECT_EQ(c.arch, ModelArch::DeepseekV3);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_moe_layers(), 58);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_FALSE(c.has_indexer);
  EXPECT_EQ(c.rope.type, RopeType::Yarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_TRUE(c.rope.interleaved);  // transformers' DeepseekV3Config default
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  ASSERT_TRUE(c.bos_token_id.has_value());
  EXPECT_EQ(*c.bos_token_id, 0);
  // (0.1 * ln 40 + 1)^2 / sqrt(192), as DeepSeek-V3's attention scales its logits.
  double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.softmax_scale(), m * m / std::sqrt(192.0), 1e-15);
  EXPECT_NEAR(c.softmax_scale(), 0.1352, 1e-4);
}

TEST(ModelConfig, RopeParametersSpellingMatchesRopeScaling) {
  ModelConfig a = parse_model_config(read("deepseek_v3_config.json"));
  ModelConfig b = parse_model_config(read("deepseek_v3_rope_parameters_config.json"));
  EXPECT_EQ(b.rope.type, RopeType::Yarn);
  EXPECT_DOUBLE_EQ(a.rope.theta, b.rope.theta);
  EXPECT_DOUBLE_EQ(a.rope.factor, b.rope.factor);
  EXPECT_DOUBLE_EQ(a.rope.beta_fast, b.rope.beta_fast);
  EXPECT_DOUBLE_EQ(a.rope.beta_slow, b.rope.beta_slow);
  EXPECT_DOUBLE_EQ(a.rope.mscale, b.rope.mscale);
  EXPECT_DOUBLE_EQ(a.rope.mscale_all_dim, b.rope.mscale_all_dim);
  EXPECT_EQ(a.rope.original_max_position_embeddings, b.rope.original_max_position_embeddings);
  EXPECT_DOUBLE_EQ(a.softmax_scale(), b.softmax_scale());
  EXPECT_EQ(a.layer_is_moe, b.layer_is_moe);
}

TEST(ModelConfig, DeepseekV32Indexer) {
  ModelConfig c = parse_model_config(read("deepseek_v32_config.json"));
  EXPECT_EQ(c.arch, ModelArch::DeepseekV32);
  EXPECT_TRUE(c.has_indexer);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.num_full_indexer_layers(), 61);
  EXPECT_FALSE(c.indexer_rope_interleaved);
}

TEST(ModelConfig, KimiK2) {
  ModelConfig c = parse_model_config(read("kimi_k2_config.json"));
  EXPECT_EQ(c.arch, ModelArch::KimiK2);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.num_moe_layers(), 60);  // first_k_dense_replace 1
  EXPECT_DOUBLE_EQ(c.rope.theta, 50000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
}

TEST(ModelConfig, LayerPlanRules) {
  json j = read("deepseek_v3_config.json");
  j["num_hidden_layers"] = 8;
  j["first_k_dense_replace"] = 2;
  j["moe_layer_freq"] = 2;
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, false, true, false, true, false, true, false}));
  j["mlp_layer_types"] = {"sparse", "dense", "sparse", "sparse", "dense", "dense", "sparse", "dense"};
  c = parse_model_config(j);
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{true, false, true, true, false, false, true, false}));
  j["mlp_layer_types"] = {"sparse", "dense"};
  EXPECT_NE(parse_error(j).find("mlp_layer_types"), std::string::npos) << parse_error(j);
  j["mlp_layer_types"] = {"sparse", "dense", "sparse", "sparse", "dense", "dense", "sparse", "mixed"};
  EXPECT_NE(parse_error(j).find("'mixed'"), std::string::npos) << parse_error(j);
}

TEST(ModelConfig, IndexerPlanFallbacks) {
  json j = read("glm5_config.json");
  j["num_hidden_layers"] = 10;
  j.erase("mlp_layer_types");
  auto kinds = [&] {
    std::string s;
    for (auto k : parse_model_config(j).indexer_types) s += k == IndexerKind::Full ? 'F' : 'S';
    return s;
  };
  // transformers: full <=> max(i - offset + 1, 0) % freq == 0, freq default 1, offset default 2.
  EXPECT_EQ(kinds(), "FFFFFFFFFF");
  j["index_topk_freq"] = 4;
  j["index_skip_topk_offset"] = 3;
  EXPECT_EQ(kinds(), "FFFSSSFSSS");
  j["index_topk_freq"] = 2;
  j.erase("index_skip_topk_offset");  // offset 2: i=0 -> 0, i=1 -> 0, i=2 -> 1, ...
  EXPECT_EQ(kinds(), "FFSFSFSFSF");
  j["index_topk_pattern"] = "FSSFFSSFFS";
  EXPECT_EQ(kinds(), "FSSFFSSFFS");
  j["indexer_types"] = {"full", "full",   "shared", "full",   "shared",
                        "full", "shared", "full",   "shared", "full"};
  EXPECT_EQ(kinds(), "FFSFSFSFSF");
  j["indexer_types"] = {"shared", "full",   "shared", "full",   "shared",
                        "full",   "shared", "full",   "shared", "full"};
  EXPECT_NE(parse_error(j).find("layer 0"), std::string::npos) << parse_error(j);
  j["indexer_types"] = {"full"};
  EXPECT_NE(parse_error(j).find("indexer_types"), std::string::npos) << parse_error(j);
}

TEST(ModelConfig, QLoraNullAndDefaults) {
  json j = read("deepseek_v3_config.json");
  j["q_lora_rank"] = nullptr;
  ModelConfig c = parse_model_config(j);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  j.erase("q_lora_rank");  // absent: transformers' default
  c = parse_model_config(j);
  ASSERT_TRUE(c.q_lora_rank.has_value());
  EXPECT_EQ(*c.q_lora_rank, 1536);
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("eos_token_id");
  c = parse_model_config(j);
  EXPECT_EQ(c.rope.type, RopeType::Default);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
  j["rope_interleave"] = false;
  EXPECT_FALSE(parse_model_config(j).rope.interleaved);
}

TEST(ModelConfig, DsaNeedsQLora) {
  json j = read("glm5_config.json");
  j["q_lora_rank"] = nullptr;
  EXPECT_NE(parse_error(j).find("q_lora_rank"), std::string::npos);
}

TEST(ModelConfig, UnknownModelTypeListsSupported) {
  json j = read("deepseek_v3_config.json");
  j["model_type"] = "llama";
  std::string e = parse_error(j);
  EXPECT_NE(e.find("'llama'"), std::string::npos) << e;
  for (const char* t : {"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "kimi_k2"})
    EXPECT_NE(e.find(t), std::string::npos) << e;
}

TEST(ModelConfig, MissingFieldNamesFieldAndFile) {
  for (const char* field : {"hidden_size", "kv_lora_rank", "num_hidden_layers", "n_routed_experts",
                            "vocab_size", "qk_rope_head_dim", "moe_intermediate_size", "model_type"}) {
    json j = read("deepseek_v3_config.json");
    j.erase(field);
    std::string e = parse_error(j);
    EXPECT_NE(e.find(std::string("'") + field + "' is missing"), std::string::npos) << field << ": " << e;
    EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  }
}

TEST(ModelConfig, WrongTypeNamesField) {
  struct Case {
    const char* field;
    json value;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"hidden_size", "7168", "'hidden_size' must be an integer, got a string"},
      {"num_attention_heads", 12.5, "'num_attention_heads' must be an integer, got a float"},
      {"norm_topk_prob", 1, "'norm_topk_prob' must be true or false"},
      {"rms_norm_eps", "small", "'rms_norm_eps' must be a number"},
      {"eos_token_id", "eos", "'eos_token_id' must be an integer"},
      {"rope_scaling", 3, "'rope_scaling' must be an object"},
      {"hidden_size", -1, "'hidden_size' must be >= 1"},
      {"hidden_act", "gelu", "'hidden_act' is 'gelu'"},
      {"num_experts_per_tok", 300, "'num_experts_per_tok' (300) exceeds n_routed_experts"},
  };
  for (const auto& c : cases) {
    json j = read("deepseek_v3_config.json");
    j[c.field] = c.value;
    std::string e = parse_error(j);
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.field << ": " << e;
  }
  json j = read("deepseek_v3_config.json");
  j["rope_scaling"]["type"] = "longrope";
  EXPECT_NE(parse_error(j).find("rope_scaling.type"), std::string::npos) << parse_error(j);
  j["rope_scaling"]["type"] = "yarn";
  j["rope_scaling"].erase("factor");
  EXPECT_NE(parse_error(j).find("rope_scaling.factor"), std::string::npos) << parse_error(j);
  EXPECT_NE(parse_error(json::array()).find("JSON object"), std::string::npos);
}

TEST(ModelConfig, LoadNamesTheFile) {
  try {
    load_model_config(kConfigs + "no_such_dir");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("config.json"), std::string::npos) << e.message();
  }
}

TEST(ModelConfig, JsonRoundTrip) {
  for (const char* name : {"glm5_config.json", "deepseek_v3_config.json", "kimi_k2_config.json",
                           "deepseek_v32_config.json", "tiny_glm_config.json"}) {
    ModelConfig a = parse_model_config(read(name));
    ModelConfig b = parse_model_config(model_config_to_json(a));
    EXPECT_EQ(a.arch, b.arch) << name;
    EXPECT_EQ(a.hidden_size, b.hidden_size) << name;
    EXPECT_EQ(a.q_lora_rank, b.q_lora_rank) << name;
    EXPECT_EQ(a.layer_is_moe, b.layer_is_moe) << name;
    EXPECT_EQ(a.indexer_types, b.indexer_types) << name;
    EXPECT_EQ(a.rope.type, b.rope.type) << name;
    EXPECT_DOUBLE_EQ(a.rope.theta, b.rope.theta) << name;
    EXPECT_DOUBLE_EQ(a.softmax_scale(), b.softmax_scale()) << name;
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids) << name;
    EXPECT_EQ(a.n_group, b.n_group) << name;
    EXPECT_EQ(a.num_nextn_predict_layers, b.num_nextn_predict_layers) << name;
  }
}

}  // namespace
}  // namespace ms::io
