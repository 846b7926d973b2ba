// Per-rank memory plans for GLM-5's published config (NVFP4 experts, BF16 attention, FP8 KV) on H200s.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/memory_plan.h"
#include "model/weight_spec.h"

namespace ms::dist {
namespace {

constexpr uint64_t kH200 = 141'000'000'000ull;

io::ModelConfig glm5() {
  std::ifstream in(std::string(MS_TEST_DATA) + "/configs/glm5_config.json");
  return io::parse_model_config(nlohmann::json::parse(in), "glm5_config.json");
}

// The published NVFP4 layout: routed and shared experts in NVFP4, attention, dense layers and lm_head BF16.
io::QuantConfig nvfp4(const io::ModelConfig& c) {
  io::QuantConfig q;
  q.format = io::WeightFormat::NVFP4;
  q.kv_cache_fp8 = true;
  q.exclude_modules = {"lm_head", "*self_attn*"};
  for (int i = 0; i < c.num_hidden_layers; ++i)
    if (!c.layer_is_moe[i]) q.exclude_modules.push_back("model.layers." + std::to_string(i) + ".mlp*");
  return q;
}

WeightBytes glm5_bytes() {
  auto c = glm5();
  return model::parallel_weight_bytes(c, nvfp4(c), DType::F8_E4M3);
}

MemoryOptions h200(int tp, int ep) {
  MemoryOptions o;
  o.tp_size = tp, o.ep_size = ep, o.gpu_memory_bytes = kH200;
  return o;
}

TEST(MemoryPlan, WeightBytesAgreeWithTheTensorList) {
  auto c = glm5();
  auto q = nvfp4(c);
  WeightBytes w = model::parallel_weight_bytes(c, q, DType::F8_E4M3);
  uint64_t total = 0;
  for (auto& [dtype, b] : model::bytes_by_dtype(model::model_weight_specs(c, q), false)) total += b;
  EXPECT_EQ(w.total(), total);
  EXPECT_GT(w.total(), 440'000'000'000ull);  // ~454 GB
  EXPECT_LT(w.total(), 470'000'000'000ull);
  EXPECT_GT(w.routed_experts, w.total() * 8 / 10);
  EXPECT_EQ(w.kv_bytes_per_token, model::kv_bytes_per_token(c, DType::F8_E4M3));
  EXPECT_EQ(w.n_routed_experts, 256);
  EXPECT_EQ(w.label, "glm_moe_dsa nvfp4");
}

TEST(MemoryPlan, Glm5RefusedOnOneH200NamingTheGpuCount) {
  auto w = glm5_bytes();
  MemoryPlan p = plan_memory(w, h200(1, 1));
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.weight_bytes, w.total());
  EXPECT_NE(p.message.find("glm_moe_dsa nvfp4 on 1 x 141.0 GB: weights need"), std::string::npos)
      << p.message;
  EXPECT_NE(p.message.find("use --tp-size/--ep-size 4 or more"), std::string::npos) << p.message;
  EXPECT_THROW(require_fits(p), Error);
  // Two are not enough either, and say the same.
  p = plan_memory(w, h200(2, 2));
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.message.find("use --tp-size/--ep-size 4 or more"), std::string::npos) << p.message;
}

TEST(MemoryPlan, Glm5FitsOnFourAndEightH200s) {
  auto w = glm5_bytes();
  MemoryPlan p4 = plan_memory(w, h200(4, 4));
  ASSERT_TRUE(p4.fits) << p4.message;
  EXPECT_NO_THROW(require_fits(p4));
  EXPECT_EQ(p4.world_size, 4);
  auto role = [](const MemoryPlan& p, const std::string& r) {
    for (const auto& x : p.weights)
      if (x.role == r) return x.bytes;
    ADD_FAILURE() << r;
    return uint64_t{0};
  };
  EXPECT_EQ(role(p4, "routed_experts"), w.routed_experts / 4);
  EXPECT_EQ(role(p4, "shared_expert"), w.shared_expert);  // replicated
  EXPECT_EQ(role(p4, "attention"), w.attention_heads / 4 + w.attention_shared);
  EXPECT_EQ(p4.weight_bytes + p4.workspace_bytes + p4.kv_bytes, p4.budget_bytes);
  EXPECT_EQ(p4.kv_pages, static_cast<int64_t>(p4.kv_bytes / (w.kv_bytes_per_token * 64)));
  EXPECT_GE(p4.kv_tokens, 50'000);  // room for real contexts, not just the floor

  MemoryPlan p8 = plan_memory(w, h200(8, 8));
  ASSERT_TRUE(p8.fits);
  EXPECT_LT(p8.weight_bytes, p4.weight_bytes);
  EXPECT_GT(p8.kv_pages, p4.kv_pages);

  // DP attention keeps attention whole on each rank: more weight bytes per rank than TP4.
  MemoryOptions dp = h200(4, 4);
  dp.dp_attention = true;
  MemoryPlan pd = plan_memory(w, dp);
  EXPECT_EQ(role(pd, "attention"), w.attention_heads + w.attention_shared);
  EXPECT_GT(pd.weight_bytes, p4.weight_bytes);

  // 32 redundant expert slots over 4 ranks: 64 + 8 experts per rank and layer.
  MemoryOptions red = h200(4, 4);
  red.num_redundant_experts = 32;
  MemoryPlan pr = plan_memory(w, red);
  EXPECT_EQ(role(pr, "routed_experts"), w.routed_experts / 256 * 72);

  const std::string text = format_memory_plan(p4, h200(4, 4));
  EXPECT_NE(text.find("routed_experts"), std::string::npos);
  EXPECT_NE(text.find("kv cache"), std::string::npos);
}

TEST(MemoryPlan, TooSmallAFractionIsRefused) {
  MemoryOptions o = h200(4, 4);
  o.mem_fraction_static = 0.5;
  MemoryPlan p = plan_memory(glm5_bytes(), o);
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.message.find("--mem-fraction-static 0.5"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("use --tp-size/--ep-size 8 or more"), std::string::npos) << p.message;
}

TEST(MemoryPlan, InconsistentOptionsNameTheFlag) {
  auto w = glm5_bytes();
  auto msg = [&](MemoryOptions o) {
    try {
      plan_memory(w, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg(h200(3, 1)).find("--tp-size 3 does not divide the 64 attention heads"), std::string::npos);
  EXPECT_NE(msg(h200(1, 3)).find("--ep-size 3 does not divide the 256 routed experts"), std::string::npos);
  EXPECT_NE(msg(h200(4, 8)).find(""), std::string::npos);  // 4 divides 8: allowed
  MemoryOptions o = h200(4, 4);
  o.num_redundant_experts = 6;
  EXPECT_NE(msg(o).find("--ep-num-redundant-experts 6"), std::string::npos);
  o = h200(4, 4);
  o.mem_fraction_static = 1.5;
  EXPECT_NE(msg(o).find("--mem-fraction-static"), std::string::npos);
}

}  // namespace
}  // namespace ms::dist
