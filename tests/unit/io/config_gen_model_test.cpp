// `moeserve gen-model` then `moeserve inspect --json` on what it wrote: the checkpoint holds exactly the
// tensors model_weight_specs lists, and inspect's counts equal both the spec's and a count by hand.
#include <gtest/gtest.h>

#include <unistd.h>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "model/weight_spec.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

namespace ms {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct CmdResult {
  int status;
  std::string out;
};

CmdResult run(const std::string& args) {
  std::string cmd = std::string(MS_BINARY) + " " + args + " 2>&1";
  CmdResult r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = pclose(p);
  return r;
}

fs::path scratch_root() {
  return fs::temp_directory_path() / ("moeserve_genmodel_test_" + std::to_string(getpid()));
}

// Removes this process's scratch directory when the binary exits.
struct ScratchCleanup {
  ~ScratchCleanup() {
    std::error_code ec;
    fs::remove_all(scratch_root(), ec);
  }
} scratch_cleanup;

fs::path scratch(const std::string& name) {
  fs::path d = scratch_root() / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  return d;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

double stddev(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  double m = s / v.size();
  return std::sqrt(s2 / v.size() - m * m);
}

// Tiny presets by hand (see tests/unit/model/weight_spec_test.cpp for the GLM derivation): the GLM tiny model
// has 343064 parameters, 199768 active; DeepSeek-V3 tiny is the same without the 4 layers' indexers (2720
// each).
struct Expect {
  const char* arch;
  int64_t total, active;
  uint64_t kv_bf16;
};
constexpr Expect kGlm{"glm5", 343064, 199768, 4 * 40 * 2 + 2 * 16 * 2};
constexpr Expect kDsv3{"deepseek_v3", 343064 - 4 * 2720, 199768 - 4 * 2720, 4 * 40 * 2};

class GenModel : public ::testing::TestWithParam<std::tuple<Expect, const char*>> {};

TEST_P(GenModel, InspectMatchesSpecAndHandCount) {
  auto [e, weights] = GetParam();
  fs::path dir = scratch(std::string(e.arch) + "_" + weights);
  CmdResult g =
      run(fmt::format("gen-model --arch {} --preset tiny --weights {} --out {} --seed 7 --shard-mb 0.1",
                      e.arch, weights, dir.string()));
  ASSERT_EQ(g.status, 0) << g.out;
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(fs::exists(dir / "hf_quant_config.json"), std::string(weights) == "nvfp4");

  CmdResult i = run("inspect --json " + dir.string());
  ASSERT_EQ(i.status, 0) << i.out;
  json r = json::parse(i.out);

  io::ModelConfig cfg = io::load_model_config(dir);
  io::QuantConfig q = io::load_quant_config(dir);
  auto specs = model::model_weight_specs(cfg, q);
  EXPECT_EQ(r["params_total"].get<int64_t>(), e.total);
  EXPECT_EQ(r["params_active"].get<int64_t>(), e.active);
  EXPECT_EQ(r["params_total"].get<int64_t>(), model::params_total(specs));
  EXPECT_EQ(r["params_active"].get<int64_t>(), model::params_active_per_token(cfg, specs));
  EXPECT_EQ(r["kv_bytes_per_token"].get<uint64_t>(), e.kv_bf16);
  EXPECT_EQ(r["decode_floor_bytes"].get<uint64_t>(), model::decode_floor_bytes(cfg, specs));
  EXPECT_EQ(r["weight_format"].get<std::string>(), std::string(weights) == "fp8" ? "fp8_block" : weights);
  EXPECT_EQ(r["bytes_source"].get<std::string>(), "checkpoint");
  EXPECT_EQ(r["checkpoint"]["tensors"].get<size_t>(), specs.size());
  EXPECT_TRUE(r["checkpoint"]["missing"].empty()) << r["checkpoint"]["missing"].dump();
  EXPECT_TRUE(r["checkpoint"]["unexpected"].empty()) << r["checkpoint"]["unexpected"].dump();
  EXPECT_TRUE(r["checkpoint"]["mismatched"].empty()) << r["checkpoint"]["mismatched"].dump();
  auto by = model::bytes_by_dtype(specs, true);
  for (auto& [k, v] : by) EXPECT_EQ(r["bytes_by_dtype"][k].get<uint64_t>(), v) << k;
  EXPECT_EQ(r["bytes_by_dtype"].size(), by.size());
  // --shard-mb 0.1 splits the tiny model (0.6-0.9 MB) into several shards; every one is in the index.
  json index = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  std::set<std::string> shards;
  for (auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 4u);
  for (const auto& s : shards) EXPECT_TRUE(fs::exists(dir / s)) << s;
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), r["bytes_total"].get<uint64_t>());

  // Values: norms ~1, weights ~N(0, 0.02) after dequantization.
  io::Checkpoint ck = io::Checkpoint::open(dir);
  Tensor norm = ck.tensor("model.layers.1.input_layernorm.weight");
  double mean = 0;
  for (int64_t k = 0; k < norm.numel(); ++k) mean += quant::bf16_to_f32(norm.data<uint16_t>()[k]);
  EXPECT_NEAR(mean / norm.numel(), 1.0, 0.02);
  const std::string m = "model.layers.2.mlp.experts.5.up_proj";  // [32, 64]
  std::vector<float> w(32 * 64);
  if (std::string(weights) == "bf16") {
    Tensor t = ck.tensor(m + ".weight");
    for (size_t k = 0; k < w.size(); ++k) w[k] = quant::bf16_to_f32(t.data<uint16_t>()[k]);
  } else if (std::string(weights) == "fp8") {
    Tensor t = ck.tensor(m + ".weight"), s = ck.tensor(m + ".weight_scale_inv");
    EXPECT_EQ(t.dtype(), DType::F8_E4M3);
    for (int r0 = 0; r0 < 32; ++r0)
      quant::fp8_block_dequantize_row(t.data<uint8_t>() + r0 * 64, s.data<float>(), 64, w.data() + r0 * 64);
  } else {
    Tensor t = ck.tensor(m + ".weight"), s = ck.tensor(m + ".weight_scale");
    float s2 = *ck.tensor(m + ".weight_scale_2").data<float>();
    // gate_proj and up_proj of one expert share weight_scale_2, as ModelOpt exports fused layers.
    EXPECT_EQ(s2, *ck.tensor("model.layers.2.mlp.experts.5.gate_proj.weight_scale_2").data<float>());
    EXPECT_GT(*ck.tensor(m + ".input_scale").data<float>(), 0.0f);
    for (int r0 = 0; r0 < 32; ++r0)
      quant::nvfp4_dequantize_row(t.data<uint8_t>() + r0 * 32, s.data<uint8_t>() + r0 * 4, s2, 64,
                                  w.data() + r0 * 64);
  }
  EXPECT_NEAR(stddev(w), 0.02, 0.004);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, GenModel,
                         ::testing::Combine(::testing::Values(kGlm, kDsv3),
                                            ::testing::Values("bf16", "fp8", "nvfp4")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).arch) + "_" + std::get<1>(info.param);
                         });

// The config fields transformers (and llama.cpp's converter) read and would otherwise default wrongly:
// num_key_value_heads (MLA: one per query head; the default of 128 sizes kv_b_proj for 128 heads) and a YaRN
// factor equal to max_position_embeddings / original_max_position_embeddings. The weights must agree with
// num_key_value_heads, and our own loader must read the same factor back.
TEST(GenModelCli, ConfigHasTheFieldsTransformersNeeds) {
  for (const char* arch : {"deepseek_v3", "glm5"}) {
    fs::path dir = scratch(std::string("hf_fields_") + arch);
    CmdResult g = run(fmt::format("gen-model --arch {} --preset tiny --out {}", arch, dir.string()));
    ASSERT_EQ(g.status, 0) << g.out;
    json c = json::parse(std::ifstream(dir / "config.json"));
    ASSERT_TRUE(c.contains("num_key_value_heads")) << arch;
    const int64_t heads = c["num_attention_heads"].get<int64_t>();
    EXPECT_EQ(c["num_key_value_heads"].get<int64_t>(), heads) << arch;
    io::Checkpoint ck = io::Checkpoint::open(dir);
    Tensor kvb = ck.tensor("model.layers.0.self_attn.kv_b_proj.weight");
    EXPECT_EQ(kvb.size(0), c["num_key_value_heads"].get<int64_t>() *
                               (c["qk_nope_head_dim"].get<int64_t>() + c["v_head_dim"].get<int64_t>()))
        << arch;
    EXPECT_EQ(kvb.size(1), c["kv_lora_rank"].get<int64_t>()) << arch;
    if (std::string(arch) == "deepseek_v3") {
      ASSERT_TRUE(c.contains("rope_scaling")) << arch;
      const json& rs = c["rope_scaling"];
      EXPECT_EQ(rs.value("rope_type", rs.value("type", "")), "yarn");
      const double max_pos = c["max_position_embeddings"].get<double>();
      const double orig = rs["original_max_position_embeddings"].get<double>();
      EXPECT_LT(orig, max_pos) << "a YaRN factor of 1 would not exercise the scaling";
      EXPECT_DOUBLE_EQ(rs["factor"].get<double>(), max_pos / orig);
      io::ModelConfig cfg = io::load_model_config(dir);
      EXPECT_DOUBLE_EQ(cfg.rope.factor, max_pos / orig);
    }
    fs::remove_all(dir);
  }
}

TEST(GenModelCli, DeterministicInSeed) {
  fs::path a = scratch("seed_a"), b = scratch("seed_b"), c = scratch("seed_c");
  ASSERT_EQ(run("gen-model --arch glm5 --preset tiny --weights nvfp4 --seed 5 --out " + a.string()).status,
            0);
  ASSERT_EQ(run("gen-model --arch glm5 --preset tiny --weights nvfp4 --seed 5 --out " + b.string()).status,
            0);
  ASSERT_EQ(run("gen-model --arch glm5 --preset tiny --weights nvfp4 --seed 6 --out " + c.string()).status,
            0);
  const char* shard = "model-00001-of-00001.safetensors";
  EXPECT_EQ(file_bytes(a / shard), file_bytes(b / shard));
  EXPECT_NE(file_bytes(a / shard), file_bytes(c / shard));
  for (auto& d : {a, b, c}) fs::remove_all(d);
}

TEST(GenModelCli, InspectConfigOnlyGlm5) {
  fs::path d = scratch("glm5_config_only");
  fs::create_directories(d);
  fs::copy_file(std::string(MS_TEST_DATA) + "/configs/glm5_config.json", d / "config.json");
  CmdResult i = run("inspect --json --bandwidth-gbs 8000 " + d.string());
  ASSERT_EQ(i.status, 0) << i.out;
  json r = json::parse(i.out);
  EXPECT_NEAR(r["params_total"].get<double>() / 744e9, 1.0, 0.01);
  EXPECT_NEAR(r["params_active"].get<double>() / 40e9, 1.0, 0.03);
  EXPECT_EQ(r["bytes_source"].get<std::string>(), "config");
  EXPECT_FALSE(r.contains("checkpoint"));
  EXPECT_EQ(r["moe_layers"].get<int>(), 75);
  EXPECT_EQ(r["kv_bytes_per_token"].get<uint64_t>(), 2u * 78 * (576 + 128));
  EXPECT_NEAR(r["decode_floor_ms"].get<double>(), r["decode_floor_bytes"].get<double>() / 8000e9 * 1e3, 1e-9);
  CmdResult text = run("inspect " + d.string());
  EXPECT_EQ(text.status, 0);
  EXPECT_NE(text.out.find("decode floor"), std::string::npos) << text.out;
  fs::remove_all(d);
}

TEST(GenModelCli, BadInputsFailWithReasons) {
  fs::path d = scratch("bad");
  CmdResult g = run("gen-model --arch llama --out " + d.string());
  EXPECT_NE(g.status, 0);
  EXPECT_NE(g.out.find("--arch 'llama'"), std::string::npos) << g.out;
  g = run("gen-model --weights int4 --out " + d.string());
  EXPECT_NE(g.out.find("--weights 'int4'"), std::string::npos) << g.out;
  fs::create_directories(d);
  json cfg = json::parse(std::ifstream(std::string(MS_TEST_DATA) + "/configs/glm5_config.json"));
  cfg.erase("kv_lora_rank");
  std::ofstream(d / "config.json") << cfg.dump();
  CmdResult i = run("inspect " + d.string());
  EXPECT_NE(i.status, 0);
  EXPECT_NE(i.out.find("'kv_lora_rank' is missing"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("config.json"), std::string::npos) << i.out;
  fs::remove_all(d);
}

}  // namespace
}  // namespace ms
