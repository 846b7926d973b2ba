// moeserve quantize on the tiny GLM-5 golden checkpoint: the written NVFP4 / FP8-block checkpoints load
// through the normal path, keep the excluded modules in BF16, and their logits stay close to the BF16
// model's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "io/quantize_checkpoint.h"
#include "io/safetensors.h"
#include "kv/forward_batch.h"
#include "model/load_model.h"
#include "test_executor.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

const fs::path kSrc = fs::path(MS_TEST_DATA) / "golden" / "glm5_tiny";

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("ms_quantize_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<float> logits(const fs::path& dir, const std::vector<int32_t>& ids) {
  model::LoadedModel lm = model::load_model(dir);
  test::ExecPool pool(*lm.model, 1, 64, kv::KvCacheDType::F32);
  std::vector<int32_t> pages;
  EXPECT_TRUE(pool.allocator().allocate(1, pages));
  kv::ForwardBatchBuilder bb(64);
  bb.add_sequence(pages, 0, ids.data(), static_cast<int32_t>(ids.size()), false);
  kv::ForwardBatch b = bb.finish();
  for (int32_t i = 0; i < b.n_tokens(); ++i) b.logit_rows.push_back(i);
  Tensor t = pool.forward(b);
  return {t.data<float>(), t.data<float>() + t.numel()};
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return num / den;
}

const std::vector<int32_t> kIds = {5, 17, 99, 3, 250, 41, 8, 77, 123, 9, 300, 12};

TEST(QuantizeCheckpoint, Nvfp4LoadsKeepsExclusionsAndStaysClose) {
  const fs::path out = temp_dir("nvfp4");
  io::QuantizeOptions o;
  o.to = io::WeightFormat::NVFP4;
  o.exclude = io::default_quantize_excludes();
  o.exclude.push_back("*shared_experts*");
  const io::QuantizeReport r = io::quantize_checkpoint(kSrc, out, o);
  EXPECT_GT(r.tensors_quantized, 0);
  EXPECT_LT(r.bytes_out, r.bytes_in);
  ASSERT_TRUE(fs::exists(out / "hf_quant_config.json"));
  io::Checkpoint ck = io::Checkpoint::open(out);
  EXPECT_EQ(ck.tensor("model.layers.1.mlp.experts.3.down_proj.weight").dtype(), DType::U8);
  EXPECT_EQ(ck.tensor("model.layers.1.mlp.experts.3.down_proj.weight_scale").dtype(), DType::F8_E4M3);
  EXPECT_EQ(ck.tensor("model.layers.1.mlp.experts.3.down_proj.weight_scale_2").dtype(), DType::F32);
  EXPECT_EQ(ck.tensor("model.layers.0.mlp.gate_proj.weight").dtype(), DType::U8);  // dense MLP too
  EXPECT_EQ(ck.tensor("model.layers.1.self_attn.kv_b_proj.weight").dtype(), DType::BF16);
  EXPECT_EQ(ck.tensor("model.layers.1.mlp.gate.weight").dtype(), DType::BF16);
  EXPECT_EQ(ck.tensor("model.layers.1.mlp.shared_experts.up_proj.weight").dtype(), DType::BF16);
  EXPECT_EQ(ck.tensor("lm_head.weight").dtype(), DType::BF16);
  EXPECT_EQ(ck.tensor("model.embed_tokens.weight").dtype(), DType::BF16);
  EXPECT_EQ(ck.tensor("model.layers.1.mlp.gate.e_score_correction_bias").dtype(), DType::F32);
  const double e = rel_err(logits(out, kIds), logits(kSrc, kIds));
  EXPECT_GT(e, 1e-4) << "nvfp4 changed nothing";
  EXPECT_LT(e, 0.6) << "within the golden test's NVFP4 budget for this model";
  fs::remove_all(out);
}

TEST(QuantizeCheckpoint, Fp8BlockLoadsAndStaysClose) {
  const fs::path out = temp_dir("fp8");
  io::QuantizeOptions o;
  o.to = io::WeightFormat::FP8Block;
  io::quantize_checkpoint(kSrc, out, o);
  EXPECT_FALSE(fs::exists(out / "hf_quant_config.json"));
  io::Checkpoint ck = io::Checkpoint::open(out);
  EXPECT_EQ(ck.tensor("model.layers.2.mlp.experts.0.up_proj.weight").dtype(), DType::F8_E4M3);
  const Tensor s = ck.tensor("model.layers.2.mlp.experts.0.up_proj.weight_scale_inv");
  EXPECT_EQ(s.dtype(), DType::F32);
  EXPECT_EQ(s.shape(), (Shape{1, 1}));  // [32, 64] in one 128x128 block
  EXPECT_EQ(ck.tensor("model.layers.2.self_attn.q_a_proj.weight").dtype(), DType::BF16);
  const double e = rel_err(logits(out, kIds), logits(kSrc, kIds));
  EXPECT_GT(e, 1e-5);
  EXPECT_LT(e, 0.2);  // e4m3 per 128x128 block: finer than NVFP4
  fs::remove_all(out);
}

TEST(QuantizeCheckpoint, RefusesQuantizedInputAndAnEmptyResult) {
  const fs::path a = temp_dir("a"), b = temp_dir("b");
  io::QuantizeOptions o;
  io::quantize_checkpoint(kSrc, a, o);
  EXPECT_THROW(io::quantize_checkpoint(a, b, o), Error);  // already NVFP4
  o.exclude = {"*"};
  EXPECT_THROW(io::quantize_checkpoint(kSrc, b, o), Error);  // nothing left to quantize
  EXPECT_THROW(io::quantize_checkpoint(kSrc, kSrc, io::QuantizeOptions{}), Error);
  fs::remove_all(a);
  fs::remove_all(b);
}

}  // namespace
}  // namespace ms
