// FP8-block and NVFP4 checkpoints written by `moeserve gen-model` load and run as stored, and give the logits
// of the same model with every quantized weight dequantised to f32 up front: the kernels' block-by-block
// dequantisation is exact, so the two differ only by accumulation order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "io/model_config.h"
#include "model/checkpoint_source.h"
#include "model/model.h"
#include "model/tensor_source.h"
#include "model/weight_loader.h"
#include "model_test_util.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

fs::path gen_model(const std::string& weights, const std::string& arch) {
  const fs::path dir = fs::temp_directory_path() /
                       ("moeserve_quant_ckpt_" + weights + "_" + arch + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string cmd = std::string(MS_BINARY) + " gen-model --preset tiny --arch " + arch + " --weights " +
                          weights + " --seed 3 --out '" + dir.string() + "' > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

// The checkpoint with every fp8-block and nvfp4 linear replaced by its f32 dequantisation (same names, so
// the loader sees an f32 linear); counts what it converted.
std::unique_ptr<model::MemorySource> dequantised(const model::CheckpointSource& src, int& fp8, int& nvfp4) {
  auto out = std::make_unique<model::MemorySource>("dequantised");
  const auto& ck = src.checkpoint();
  for (const auto& name : ck.names()) {
    if (name.ends_with("_scale_inv") || name.ends_with(".weight_scale") ||
        name.ends_with(".weight_scale_2") || name.ends_with(".input_scale"))
      continue;
    Tensor t = src.tensor(name);
    const std::string prefix = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : "";
    if (t.dtype() == DType::F8_E4M3 && ck.contains(prefix + ".weight_scale_inv")) {
      const int64_t rows = t.size(0), cols = t.size(1);
      Tensor s = src.tensor(prefix + ".weight_scale_inv");
      Tensor f = Tensor::empty({rows, cols}, DType::F32);
      for (int64_t r = 0; r < rows; ++r)
        quant::fp8_block_dequantize_row(t.data<uint8_t>() + r * cols,
                                        s.data<float>() + (r / quant::kFp8Block) * s.size(1), cols,
                                        f.data<float>() + r * cols);
      out->put(name, f);
      ++fp8;
    } else if (t.dtype() == DType::U8 && ck.contains(prefix + ".weight_scale")) {
      const int64_t rows = t.size(0), cols = t.size(1) * 2;
      Tensor s = src.tensor(prefix + ".weight_scale");
      const float s2 = src.tensor(prefix + ".weight_scale_2").data<float>()[0];
      Tensor f = Tensor::empty({rows, cols}, DType::F32);
      for (int64_t r = 0; r < rows; ++r)
        quant::nvfp4_dequantize_row(t.data<uint8_t>() + r * cols / 2, s.data<uint8_t>() + r * cols / 16, s2,
                                    cols, f.data<float>() + r * cols);
      out->put(name, f);
      ++nvfp4;
    } else {
      out->put(name, t);
    }
  }
  return out;
}

class QuantizedCheckpoint : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(QuantizedCheckpoint, LogitsEqualTheDequantisedModel) {
  const auto& [weights, arch] = GetParam();
  const fs::path dir = gen_model(weights, arch);
  io::ModelConfig cfg = io::load_model_config(dir);
  model::CheckpointSource src(dir);
  model::Model mq(cfg, model::load_weights(cfg, src));
  int fp8 = 0, nv = 0;
  auto deq = dequantised(src, fp8, nv);
  model::Model mf(cfg, model::load_weights(cfg, *deq));
  const auto want = weights == "fp8" ? ops::WeightFormat::FP8Block : ops::WeightFormat::NVFP4;
  EXPECT_EQ(mq.weights().layers[1].moe.experts[0].down.format, want) << "the experts did not load as stored";
  EXPECT_EQ(mf.weights().layers[1].moe.experts[0].down.format, ops::WeightFormat::F32);
  EXPECT_GT(weights == "fp8" ? fp8 : nv, 3 * cfg.n_routed_experts) << "too few quantized linears";

  // 12 tokens: longer than index_topk (8) for GLM-5, so the DSA selection runs too.
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back((i * 97 + 13) % static_cast<int32_t>(cfg.vocab_size));
  test::Runner rq(mq, kv::KvCacheDType::F32), rf(mf, kv::KvCacheDType::F32);
  const auto a = rq.run(ids), b = rf.run(ids);
  ASSERT_EQ(a.size(), b.size());
  std::vector<double> bd(b.begin(), b.end());
  const double err = test::rel_error(a.data(), bd.data(), a.size());
  std::printf("%s %s: rel err vs dequantised %.3g\n", weights.c_str(), arch.c_str(), err);
  EXPECT_LT(err, 1e-5) << weights << " " << arch;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(GenModel, QuantizedCheckpoint,
                         ::testing::Combine(::testing::Values("fp8", "nvfp4"),
                                            ::testing::Values("glm5", "deepseek_v3")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace ms
