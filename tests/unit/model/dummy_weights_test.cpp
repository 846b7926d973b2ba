// --load-format dummy (model::load_dummy): random weights from config.json alone. A dummy model is the
// gen-model checkpoint of the same seed, value for value, in each format; the checkpoint's own quantisation
// config is ignored for --quantization; loads are deterministic in the seed; a bad value names the flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/model_config.h"
#include "model/checkpoint_source.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "model/weight_loader.h"
#include "model_test_util.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

fs::path gen_model(const std::string& preset, const std::string& weights, int seed, int layers = 0) {
  const fs::path dir = fs::temp_directory_path() / ("moeserve_dummy_" + preset + "_" + weights + "_" +
                                                    std::to_string(seed) + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::string cmd = std::string(MS_BINARY) + " gen-model --arch glm5 --preset " + preset + " --weights " +
                    weights + " --seed " + std::to_string(seed) + " --out '" + dir.string() + "'";
  if (layers > 0) cmd += " --layers " + std::to_string(layers);
  cmd += " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

// 12 tokens: longer than the tiny preset's index_topk (8), so the DSA selection runs too.
std::vector<float> logits(const model::Model& m) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back((i * 97 + 13) % static_cast<int32_t>(m.config().vocab_size));
  test::Runner r(const_cast<model::Model&>(m), kv::KvCacheDType::F32);
  return r.run(ids);
}

class DummyFormat : public ::testing::TestWithParam<std::string> {};

// Same seed, same values: the dummy model and the gen-model checkpoint give bit-identical logits; another
// seed gives other logits; two loads with one seed agree exactly.
TEST_P(DummyFormat, EqualsTheGenModelCheckpointOfTheSameSeed) {
  const std::string q = GetParam();
  const fs::path dir = gen_model("tiny", q, 3);
  io::ModelConfig cfg = io::load_model_config(dir);
  model::CheckpointSource ck(dir);
  model::Model from_ckpt(cfg, model::load_weights(cfg, ck));

  model::LoadedModel a = model::load_dummy(dir, q, 3), b = model::load_dummy(dir / "config.json", q, 3);
  model::LoadedModel other = model::load_dummy(dir, q, 4);
  ASSERT_TRUE(a.model && b.model && other.model);
  EXPECT_FALSE(a.device_weights) << "host weights were asked for";
  EXPECT_NE(a.description.find("glm_moe_dsa"), std::string::npos) << a.description;
  EXPECT_NE(a.description.find(q), std::string::npos) << a.description;
  EXPECT_NE(a.description.find("params"), std::string::npos) << a.description;
  EXPECT_NE(a.description.find(" active per token), "), std::string::npos) << a.description;

  const auto want = q == "nvfp4" ? ops::WeightFormat::NVFP4
                    : q == "fp8" ? ops::WeightFormat::FP8Block
                                 : ops::WeightFormat::BF16;
  EXPECT_EQ(a.model->weights().layers[1].moe.experts[0].down.format, want);

  const auto la = logits(*a.model), lb = logits(*b.model), lc = logits(from_ckpt), lo = logits(*other.model);
  ASSERT_EQ(la.size(), lc.size());
  double amax = 0;
  size_t differ_seed = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    ASSERT_TRUE(std::isfinite(la[i])) << i;
    amax = std::max(amax, static_cast<double>(std::fabs(la[i])));
    ASSERT_EQ(la[i], lb[i]) << "two loads with one seed differ at " << i;
    ASSERT_EQ(la[i], lc[i]) << "dummy and gen-model checkpoint differ at " << i;
    differ_seed += la[i] != lo[i];
  }
  EXPECT_GT(amax, 1e-3) << "logits are (near) zero";
  EXPECT_GT(differ_seed, la.size() / 2) << "another seed gave (mostly) the same logits";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(LoadFormat, DummyFormat, ::testing::Values("bf16", "fp8", "nvfp4"));

TEST(DummyWeights, QuantizationOverridesTheCheckpointsConfig) {
  const fs::path dir = gen_model("tiny", "nvfp4", 1);  // config + hf_quant_config.json say nvfp4
  model::LoadedModel bf = model::load_dummy(dir, "bf16", 0);
  EXPECT_EQ(bf.model->weights().layers[1].moe.experts[0].gate.format, ops::WeightFormat::BF16);
  model::LoadedModel fp8 = model::load_dummy(dir, "fp8", 0);
  EXPECT_EQ(fp8.model->weights().layers[1].moe.experts[0].gate.format, ops::WeightFormat::FP8Block);
  EXPECT_EQ(fp8.model->weights().layers[0].attn.o_proj.format, ops::WeightFormat::FP8Block);
  // NVFP4 keeps attention and the dense layer in BF16, as the published checkpoints do.
  model::LoadedModel nv = model::load_dummy(dir, "nvfp4", 0);
  EXPECT_EQ(nv.model->weights().layers[1].moe.experts[0].gate.format, ops::WeightFormat::NVFP4);
  EXPECT_EQ(nv.model->weights().layers[1].moe.shared.down.format, ops::WeightFormat::NVFP4);
  EXPECT_EQ(nv.model->weights().layers[0].attn.o_proj.format, ops::WeightFormat::BF16);
  EXPECT_EQ(nv.model->weights().layers[0].mlp.up.format, ops::WeightFormat::BF16);
  fs::remove_all(dir);
}

TEST(DummyWeights, BadQuantizationIsRefusedNamingTheFlag) {
  const fs::path dir = gen_model("tiny", "bf16", 1);
  try {
    model::load_dummy(dir, "int4", 0);
    FAIL() << "int4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--quantization 'int4'"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Without host weights the model holds the config alone and the source makes every tensor on request.
TEST(DummyWeights, DeviceModeKeepsNoHostWeights) {
  const fs::path dir = gen_model("tiny", "bf16", 1);
  model::LoadedModel lm = model::load_dummy(dir, "nvfp4", 2, /*host_weights=*/false);
  ASSERT_TRUE(lm.device_weights);
  EXPECT_EQ(static_cast<int>(lm.model->weights().layers.size()), lm.model->config().num_hidden_layers);
  EXPECT_EQ(lm.model->weights().embed.weight.raw(), nullptr);
  EXPECT_GT(lm.device_weight_bytes, 0.0);
  // The same tensors as the host-weight load, by name.
  model::LoadedModel host = model::load_dummy(dir, "nvfp4", 2);
  const Tensor d = lm.device_weights->tensor("model.layers.1.mlp.experts.3.down_proj.weight");
  const Tensor& h = host.model->weights().layers[1].moe.experts[3].down.weight;
  ASSERT_EQ(d.nbytes(), h.nbytes());
  EXPECT_EQ(std::memcmp(d.raw(), h.raw(), d.nbytes()), 0);
  EXPECT_THROW(lm.device_weights->tensor("model.layers.99.mlp.gate.weight"), Error);
  fs::remove_all(dir);
}

// The small preset (hidden 1024, 64 experts), two layers, NVFP4: loads and runs a forward with finite logits.
TEST(DummyWeights, SmallPresetLoadsAndRuns) {
  const fs::path dir = gen_model("small", "bf16", 1, 2);
  model::LoadedModel lm = model::load_dummy(dir, "nvfp4", 0);
  const auto l = logits(*lm.model);
  ASSERT_EQ(l.size(), 12u * static_cast<size_t>(lm.model->config().vocab_size));
  double amax = 0;
  for (float x : l) {
    ASSERT_TRUE(std::isfinite(x));
    amax = std::max(amax, static_cast<double>(std::fabs(x)));
  }
  EXPECT_GT(amax, 1e-3);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ms
