// Quantization configs: ModelOpt NVFP4 in both spellings, DeepSeek FP8 block, wildcard excludes, errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/quant_config.h"

namespace ms::io {
namespace {

using nlohmann::json;

std::string quant_error(const json& cfg, const json* hq) {
  try {
    parse_quant_config(cfg, hq, "q.json");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(Wildcard, Match) {
  EXPECT_TRUE(wildcard_match("lm_head", "lm_head"));
  EXPECT_FALSE(wildcard_match("lm_head", "lm_heads"));
  EXPECT_TRUE(wildcard_match("*self_attn*", "model.layers.3.self_attn.q_a_proj"));
  EXPECT_TRUE(wildcard_match("model.layers.*.mlp.gate", "model.layers.10.mlp.gate"));
  EXPECT_FALSE(wildcard_match("model.layers.*.mlp.gate", "model.layers.10.mlp.gate_proj"));
  EXPECT_TRUE(wildcard_match("model.layers.?.mlp*", "model.layers.1.mlp.down_proj"));
  EXPECT_FALSE(wildcard_match("model.layers.?.mlp*", "model.layers.12.mlp.down_proj"));
  EXPECT_TRUE(wildcard_match("*", ""));
  EXPECT_TRUE(wildcard_match("a*b*c", "aXXbYYbZc"));
  EXPECT_FALSE(wildcard_match("a*b*c", "aXXbYYbZ"));
  EXPECT_TRUE(wildcard_match("**x", "x"));
}

TEST(QuantConfig, NoneIsBf16) {
  json cfg = {{"model_type", "deepseek_v3"}};
  QuantConfig q = parse_quant_config(cfg, nullptr, "config.json");
  EXPECT_EQ(q.format, WeightFormat::BF16);
  EXPECT_FALSE(q.is_quantized("model.layers.3.mlp.experts.0.up_proj"));
}

TEST(QuantConfig, ModelOptHfQuantConfig) {
  json hq = json::parse(R"({"producer": {"name": "modelopt"},
    "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8",
                     "exclude_modules": ["lm_head", "*self_attn*", "model.layers.0.mlp*", "*shared_experts*"]}})");
  QuantConfig q = parse_quant_config(json::object(), &hq, "hf_quant_config.json");
  EXPECT_EQ(q.format, WeightFormat::NVFP4);
  EXPECT_EQ(q.group_size, 16);
  EXPECT_TRUE(q.kv_cache_fp8);
  EXPECT_TRUE(q.is_quantized("model.layers.3.mlp.experts.7.down_proj"));
  EXPECT_TRUE(q.is_quantized("model.layers.10.mlp.gate_proj"));
  EXPECT_FALSE(q.is_quantized("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(q.is_quantized("model.layers.3.self_attn.q_b_proj"));
  EXPECT_FALSE(q.is_quantized("model.layers.3.mlp.shared_experts.up_proj"));
  EXPECT_FALSE(q.is_quantized("lm_head"));

  hq["quantization"]["kv_cache_quant_algo"] = nullptr;
  EXPECT_FALSE(parse_quant_config(json::object(), &hq, "h").kv_cache_fp8);
}

TEST(QuantConfig, ParentModuleExcludes) {
  QuantConfig q;
  q.format = WeightFormat::NVFP4;
  q.exclude_modules = {"model.layers.1.self_attn", "model.layers.2"};
  EXPECT_FALSE(q.is_quantized("model.layers.1.self_attn.o_proj"));
  EXPECT_TRUE(q.is_quantized("model.layers.1.mlp.experts.0.up_proj"));
  EXPECT_FALSE(q.is_quantized("model.layers.2.mlp.experts.0.up_proj"));
  EXPECT_TRUE(q.is_quantized("model.layers.20.mlp.experts.0.up_proj"));
}

TEST(QuantConfig, ModelOptInConfigJson) {
  json cfg = json::parse(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
    "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": false},
    "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 16}, "targets": ["Linear"]}},
    "ignore": ["lm_head", "model.layers.*.self_attn*"]}})");
  QuantConfig q = parse_quant_config(cfg, nullptr, "config.json");
  EXPECT_EQ(q.format, WeightFormat::NVFP4);
  EXPECT_TRUE(q.kv_cache_fp8);
  EXPECT_EQ(q.exclude_modules.size(), 2u);
  EXPECT_FALSE(q.is_quantized("model.layers.5.self_attn.kv_b_proj"));
  EXPECT_TRUE(q.is_quantized("model.layers.5.mlp.experts.1.up_proj"));

  cfg["quantization_config"]["quant_algo"] = "W4A8_AWQ";
  EXPECT_NE(quant_error(cfg, nullptr).find("'W4A8_AWQ' is not supported"), std::string::npos);
  cfg["quantization_config"]["quant_algo"] = "NVFP4";
  cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32;
  EXPECT_NE(quant_error(cfg, nullptr).find("group_size"), std::string::npos) << quant_error(cfg, nullptr);
}

TEST(QuantConfig, DeepseekFp8) {
  json cfg = json::parse(R"({"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
    "quant_method": "fp8", "weight_block_size": [128, 128]}})");
  QuantConfig q = parse_quant_config(cfg, nullptr, "config.json");
  EXPECT_EQ(q.format, WeightFormat::FP8Block);
  EXPECT_EQ(q.weight_block_rows, 128);
  EXPECT_EQ(q.weight_block_cols, 128);
  EXPECT_TRUE(q.is_quantized("model.layers.0.self_attn.q_a_proj"));
  EXPECT_TRUE(q.is_quantized("model.layers.5.self_attn.indexer.wk"));
  EXPECT_FALSE(q.is_quantized("lm_head"));
  EXPECT_FALSE(q.is_quantized("model.layers.61.shared_head.head"));
  EXPECT_TRUE(q.is_quantized("model.layers.61.mlp.experts.3.up_proj"));
  EXPECT_FALSE(q.is_quantized("model.layers.5.self_attn.indexer.weights_proj"));

  json bad = cfg;
  bad["quantization_config"].erase("weight_block_size");
  EXPECT_NE(quant_error(bad, nullptr).find("weight_block_size"), std::string::npos);
  bad = cfg;
  bad["quantization_config"]["weight_block_size"] = {64, 64};
  EXPECT_NE(quant_error(bad, nullptr).find("[64, 64]"), std::string::npos) << quant_error(bad, nullptr);
  bad = cfg;
  bad["quantization_config"]["fmt"] = "e5m2";
  EXPECT_NE(quant_error(bad, nullptr).find("fmt 'e5m2'"), std::string::npos) << quant_error(bad, nullptr);
  bad = cfg;
  bad["quantization_config"]["activation_scheme"] = "static";
  EXPECT_NE(quant_error(bad, nullptr).find("activation_scheme"), std::string::npos);
  bad = cfg;
  bad["quantization_config"]["modules_to_not_convert"] = {"model.layers.0.mlp*"};
  EXPECT_FALSE(parse_quant_config(bad, nullptr, "c").is_quantized("model.layers.0.mlp.up_proj"));
}

TEST(QuantConfig, UnsupportedMethodsAreClear) {
  json cfg = json::parse(R"({"quantization_config": {"quant_method": "gptq", "bits": 4}})");
  std::string e = quant_error(cfg, nullptr);
  EXPECT_NE(e.find("quant_method 'gptq' is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("modelopt"), std::string::npos) << e;
  json hq = json::parse(R"({"quantization": {"quant_algo": "FP8"}})");
  e = quant_error(json::object(), &hq);
  EXPECT_NE(e.find("'FP8' is not supported"), std::string::npos) << e;
  hq = json::parse(R"({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "INT8"}})");
  EXPECT_NE(quant_error(json::object(), &hq).find("kv_cache_quant_algo"), std::string::npos);
  hq = json::parse(R"({"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}})");
  EXPECT_NE(quant_error(json::object(), &hq).find("exclude_modules"), std::string::npos);
  hq = json::parse(R"({"quant": {}})");
  EXPECT_NE(quant_error(json::object(), &hq).find("'quantization'"), std::string::npos);
}

}  // namespace
}  // namespace ms::io
