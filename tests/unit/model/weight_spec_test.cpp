// The tensor list of a checkpoint and the figures derived from it, against hand counts and published totals.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "model/weight_spec.h"

namespace ms::model {
namespace {

using nlohmann::json;

io::ModelConfig config(const std::string& name) {
  std::ifstream in(std::string(MS_TEST_DATA) + "/configs/" + name);
  return io::parse_model_config(json::parse(in), name);
}

const WeightSpec* find(const std::vector<WeightSpec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

// The usual ModelOpt layout: routed and shared expert linears in NVFP4, the rest BF16.
io::QuantConfig nvfp4_experts_only(int dense_layers) {
  io::QuantConfig q;
  q.format = io::WeightFormat::NVFP4;
  q.exclude_modules = {"lm_head", "*self_attn*"};
  for (int i = 0; i < dense_layers; ++i)
    q.exclude_modules.push_back("model.layers." + std::to_string(i) + ".mlp*");
  return q;
}

// Tiny GLM config (tests/data/configs/tiny_glm_config.json), counted by hand:
//   H 64, vocab 512, 4 layers (1 dense + 3 MoE), 4 heads, q_lora 48, kv_lora 32, nope 16, rope 8, v 16
//   attention: q_a 48*64 + q_a_norm 48 + q_b 4*24*48 + kv_a 40*64 + kv_a_norm 32 + kv_b 4*32*32 + o 64*64
//            = 3072 + 48 + 4608 + 2560 + 32 + 4096 + 4096 = 18512
//   indexer: wq_b 2*16*48 + wk 16*64 + k_norm 16+16 + weights_proj 2*64 = 1536 + 1024 + 32 + 128 = 2720
//   two layer norms: 128 -> every layer 21360
//   dense mlp 3*64*128 = 24576; MoE: gate 8*64 + bias 8 + 8 experts * 6144 + shared 6144 = 55816
//   total = (21360 + 24576) + 3 * (21360 + 55816) + embed 32768 + norm 64 + lm_head 32768 = 343064
//   active = total - embed + one row (64) - 3 layers * 6 unchosen experts * 6144 = 199768
constexpr int64_t kTinyTotal = 343064, kTinyActive = 199768;

TEST(WeightSpec, TinyHandCount) {
  io::ModelConfig c = config("tiny_glm_config.json");
  auto specs = model_weight_specs(c, io::QuantConfig{});
  EXPECT_EQ(params_total(specs), kTinyTotal);
  EXPECT_EQ(params_active_per_token(c, specs), kTinyActive);
  // indexer F S F S: keys cached on 2 layers. bf16: 4 * 40 * 2 + 2 * 16 * 2.
  EXPECT_EQ(kv_bytes_per_token(c, DType::BF16), 384u);
  EXPECT_EQ(kv_bytes_per_token(c, DType::F8_E4M3), 192u);
  // Decode floor, bf16: non-expert non-embedding params 343064 - 32768 - 3 * 49152 = 162840, of which the 24
  // correction-bias values are f32: (162840 - 24) * 2 + 24 * 4; + one embedding row 128 B; + 2 experts of
  // 6144 bf16 params per MoE layer.
  EXPECT_EQ(decode_floor_bytes(c, specs), (162840u - 24) * 2 + 24 * 4 + 128 + 3 * 2 * 6144 * 2);
  auto roles = params_by_role(specs);
  EXPECT_EQ(roles["expert"], 3 * 8 * 6144);
  EXPECT_EQ(roles["shared_expert"], 3 * 6144);
  EXPECT_EQ(roles["indexer"], 4 * 2720);
  EXPECT_EQ(roles["dense_mlp"], 24576);
  EXPECT_EQ(roles["router"], 3 * (512 + 8));
}

TEST(WeightSpec, TinyNamesAndMtp) {
  io::ModelConfig c = config("tiny_glm_config.json");
  auto specs = model_weight_specs(c, io::QuantConfig{});
  std::set<std::string> names;
  for (const auto& s : specs) EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
  for (const char* n : {"model.embed_tokens.weight",
                        "model.layers.0.self_attn.q_a_proj.weight",
                        "model.layers.0.self_attn.q_a_layernorm.weight",
                        "model.layers.0.self_attn.q_b_proj.weight",
                        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                        "model.layers.0.self_attn.kv_a_layernorm.weight",
                        "model.layers.0.self_attn.kv_b_proj.weight",
                        "model.layers.0.self_attn.o_proj.weight",
                        "model.layers.0.self_attn.indexer.wq_b.weight",
                        "model.layers.0.self_attn.indexer.wk.weight",
                        "model.layers.0.self_attn.indexer.k_norm.weight",
                        "model.layers.0.self_attn.indexer.k_norm.bias",
                        "model.layers.0.self_attn.indexer.weights_proj.weight",
                        "model.layers.0.mlp.gate_proj.weight",
                        "model.layers.1.mlp.gate.weight",
                        "model.layers.1.mlp.gate.e_score_correction_bias",
                        "model.layers.3.mlp.experts.7.down_proj.weight",
                        "model.layers.3.mlp.shared_experts.up_proj.weight",
                        "model.layers.1.input_layernorm.weight",
                        "model.layers.1.post_attention_layernorm.weight",
                        "model.norm.weight",
                        "lm_head.weight",
                        "model.layers.4.eh_proj.weight",
                        "model.layers.4.shared_head.head.weight",
                        "model.layers.4.mlp.experts.0.up_proj.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("model.layers.0.mlp.gate.weight"));
  const WeightSpec* wq = find(specs, "model.layers.2.self_attn.indexer.wq_b.weight");
  ASSERT_TRUE(wq);
  EXPECT_EQ(wq->shape, (Shape{32, 48}));
  EXPECT_EQ(wq->role, WeightRole::Indexer);
  EXPECT_EQ(wq->layer, 2);
  EXPECT_EQ(find(specs, "model.layers.1.self_attn.kv_b_proj.weight")->shape, (Shape{4 * 32, 32}));
  EXPECT_EQ(find(specs, "model.layers.1.mlp.gate.e_score_correction_bias")->dtype, DType::F32);
  const WeightSpec* e = find(specs, "model.layers.3.mlp.experts.5.gate_proj.weight");
  EXPECT_EQ(e->expert, 5);
  EXPECT_EQ(e->role, WeightRole::Expert);
  EXPECT_EQ(e->shape, (Shape{32, 64}));
  EXPECT_TRUE(find(specs, "model.layers.4.eh_proj.weight")->mtp);
  EXPECT_FALSE(find(specs, "lm_head.weight")->mtp);
  EXPECT_EQ(find(specs, "model.layers.4.eh_proj.weight")->shape, (Shape{64, 128}));
  EXPECT_GT(mtp_params(specs), 0);
}

TEST(WeightSpec, QLoraNullUsesQProj) {
  json j = json::parse(std::ifstream(std::string(MS_TEST_DATA) + "/configs/deepseek_v3_config.json"));
  j["q_lora_rank"] = nullptr;
  j["num_hidden_layers"] = 4;
  io::ModelConfig c = io::parse_model_config(j);
  auto specs = model_weight_specs(c, io::QuantConfig{});
  ASSERT_TRUE(find(specs, "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(find(specs, "model.layers.0.self_attn.q_proj.weight")->shape, (Shape{128 * 192, 7168}));
  EXPECT_FALSE(find(specs, "model.layers.0.self_attn.q_a_proj.weight"));
}

TEST(WeightSpec, Nvfp4Layout) {
  io::ModelConfig c = config("tiny_glm_config.json");
  auto specs = model_weight_specs(c, nvfp4_experts_only(1));
  const std::string m = "model.layers.2.mlp.experts.3.down_proj";  // [64, 32]
  ASSERT_TRUE(find(specs, m + ".weight"));
  EXPECT_EQ(find(specs, m + ".weight")->dtype, DType::U8);
  EXPECT_EQ(find(specs, m + ".weight")->shape, (Shape{64, 16}));
  EXPECT_EQ(find(specs, m + ".weight")->params, 64 * 32);
  EXPECT_EQ(find(specs, m + ".weight_scale")->dtype, DType::F8_E4M3);
  EXPECT_EQ(find(specs, m + ".weight_scale")->shape, (Shape{64, 2}));
  EXPECT_EQ(find(specs, m + ".weight_scale_2")->shape, Shape{});
  EXPECT_EQ(find(specs, m + ".input_scale")->dtype, DType::F32);
  EXPECT_TRUE(find(specs, m + ".weight")->quantized);
  // Excluded: attention, dense layer, lm_head; never quantized: router, norms, embedding.
  EXPECT_EQ(find(specs, "model.layers.2.self_attn.o_proj.weight")->dtype, DType::BF16);
  EXPECT_FALSE(find(specs, "model.layers.2.self_attn.o_proj.weight_scale"));
  EXPECT_EQ(find(specs, "model.layers.2.mlp.shared_experts.up_proj.weight")->dtype, DType::U8);
  EXPECT_EQ(find(specs, "model.layers.0.mlp.up_proj.weight")->dtype, DType::BF16);
  EXPECT_EQ(find(specs, "model.layers.2.mlp.gate.weight")->dtype, DType::BF16);
  EXPECT_EQ(find(specs, "lm_head.weight")->dtype, DType::BF16);
  // Quantization does not change parameter counts.
  EXPECT_EQ(params_total(specs), kTinyTotal);
  EXPECT_EQ(params_active_per_token(c, specs), kTinyActive);
  // Each expert linear [o, i]: o*i/2 + o*i/16 + 8 bytes; an expert is 3 such of 2048 elements.
  uint64_t expert_bytes = 3 * (1024 + 128 + 8);
  // BF16: the non-expert params less the shared experts (3 * 6144), f32 biases, one embedding row; NVFP4: the
  // shared expert and 2 routed experts per MoE layer.
  uint64_t bf16_floor = (162840u - 24 - 3 * 6144) * 2 + 24 * 4 + 128;
  EXPECT_EQ(decode_floor_bytes(c, specs), bf16_floor + 3 * 3 * expert_bytes);
}

TEST(WeightSpec, Fp8BlockLayout) {
  json j = json::parse(std::ifstream(std::string(MS_TEST_DATA) + "/configs/deepseek_v3_config.json"));
  io::ModelConfig c = io::parse_model_config(j);
  io::QuantConfig q = io::parse_quant_config(j, nullptr, "config.json");
  auto specs = model_weight_specs(c, q);
  auto* w = find(specs, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->dtype, DType::F8_E4M3);
  EXPECT_EQ(w->shape, (Shape{576, 7168}));
  auto* s = find(specs, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shape, (Shape{5, 56}));  // ceil(576/128), 7168/128
  EXPECT_EQ(s->dtype, DType::F32);
  EXPECT_EQ(find(specs, "lm_head.weight")->dtype, DType::BF16);
  EXPECT_EQ(find(specs, "model.embed_tokens.weight")->dtype, DType::BF16);
  EXPECT_EQ(find(specs, "model.layers.5.mlp.gate.weight")->dtype, DType::BF16);
  EXPECT_EQ(find(specs, "model.layers.5.mlp.experts.255.down_proj.weight_scale_inv")->shape, (Shape{56, 16}));
}

TEST(WeightSpec, Nvfp4RejectsOddWidth) {
  io::ModelConfig c = config("tiny_glm_config.json");
  c.moe_intermediate_size = 40;  // down_proj input 40 is not a multiple of 16
  try {
    model_weight_specs(c, nvfp4_experts_only(1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("mlp.experts.0.down_proj"), std::string::npos) << e.message();
  }
}

// Published totals: GLM-5 744B / 40B active; DeepSeek-V3 671B / 37B (MTP not counted); Kimi K2 "1T" / 32B.
TEST(WeightSpec, PublishedTotals) {
  struct Case {
    const char* file;
    double total, active;
  };
  for (const auto& k : {Case{"glm5_config.json", 744e9, 40e9}, Case{"deepseek_v3_config.json", 671e9, 37e9},
                        Case{"kimi_k2_config.json", 1.0e12, 32e9}}) {
    io::ModelConfig c = config(k.file);
    auto specs = model_weight_specs(c, io::QuantConfig{});
    double total = static_cast<double>(params_total(specs));
    double active = static_cast<double>(params_active_per_token(c, specs));
    EXPECT_NEAR(total / k.total, 1.0, 0.03) << k.file << " total " << total;
    EXPECT_NEAR(active / k.active, 1.0, 0.03) << k.file << " active " << active;
  }
}

TEST(WeightSpec, Glm5DecodeFloorAndKv) {
  io::ModelConfig c = config("glm5_config.json");
  auto specs = model_weight_specs(c, nvfp4_experts_only(3));
  // DESIGN.md: about 45 GB per token for GLM-5-NVFP4 at batch 1 (BF16 attention + indexer ~0.35 GB and 9
  // NVFP4 experts ~0.19 GB per MoE layer, dense layers and lm_head).
  double floor_gb = static_cast<double>(decode_floor_bytes(c, specs)) / 1e9;
  EXPECT_NEAR(floor_gb, 45.0, 1.0);
  // 78 layers * 576 values + 78 indexer keys * 128, one byte each in FP8.
  EXPECT_EQ(kv_bytes_per_token(c, DType::F8_E4M3), 78u * 576 + 78u * 128);
  EXPECT_EQ(kv_bytes_per_token(c, DType::BF16), 2 * (78u * 576 + 78u * 128));
}

}  // namespace
}  // namespace ms::model
