// A checkpoint's FP8 KV cache scales (self_attn.k_proj.k_scale, self_attn.attn.k_scale, v_scale when no
// k_scale): loaded per layer, refused when not one positive finite f32, given to an fp8 pool only, and used
// when the engine stores and reads the cache.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/builtin_model.h"
#include "model/weight_loader.h"
#include "model_test_util.h"
#include "reference_model.h"

namespace ms {
namespace {

Tensor scalar(float v, Shape shape = {}) {
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
  return t;
}

std::string attn(int l) {
  return "model.layers." + std::to_string(l) + ".self_attn";
}

// Each layer names its scale differently; layer 2 has only v_scale, layer 0 both (k wins).
std::unique_ptr<model::MemorySource> with_scales(const io::ModelConfig& cfg) {
  auto src = model::builtin_model_weights(cfg);
  src->put(attn(0) + ".k_proj.k_scale", scalar(0.25f));
  src->put(attn(0) + ".v_proj.v_scale", scalar(8.0f));
  src->put(attn(1) + ".attn.k_scale", scalar(0.5f, {1}));
  src->put(attn(2) + ".v_proj.v_scale", scalar(3.0f));
  return src;
}

void expect_load_error(model::MemorySource& src, const std::string& needle) {
  try {
    model::load_weights(model::builtin_model_config(), src);
    ADD_FAILURE() << "loaded; expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
  }
}

TEST(KvScales, CheckpointScalesReachAnFp8PoolOnly) {
  const io::ModelConfig cfg = model::builtin_model_config();
  ASSERT_EQ(cfg.num_hidden_layers, 3);
  auto src = with_scales(cfg);
  model::Model m(cfg, model::load_weights(cfg, *src));
  EXPECT_EQ(m.weights().kv_scales, (std::vector<float>{0.25f, 0.5f, 3.0f}));
  const kv::KvPool pool(m.kv_pool_config(2, 16, kv::KvCacheDType::FP8E4M3));
  EXPECT_EQ(pool.scale(0), 0.25f);
  EXPECT_EQ(pool.scale(1), 0.5f);
  EXPECT_EQ(pool.scale(2), 3.0f);
  for (kv::KvCacheDType dt : {kv::KvCacheDType::BF16, kv::KvCacheDType::F32, kv::KvCacheDType::Auto})
    EXPECT_TRUE(m.kv_pool_config(2, 16, dt).scales.empty()) << kv::kv_cache_dtype_name(dt);
  // Without scales in the checkpoint an fp8 pool reads with scale 1.
  auto plain = model::builtin_model_weights(cfg);
  model::Model p(cfg, model::load_weights(cfg, *plain));
  EXPECT_TRUE(p.weights().kv_scales.empty());
  EXPECT_EQ(kv::KvPool(p.kv_pool_config(2, 16, kv::KvCacheDType::FP8E4M3)).scale(1), 1.0f);
}

TEST(KvScales, BadScaleIsRefusedByName) {
  const io::ModelConfig cfg = model::builtin_model_config();
  const std::string k1 = attn(1) + ".k_proj.k_scale";
  for (float bad :
       {0.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto src = with_scales(cfg);
    src->put(k1, scalar(bad));
    expect_load_error(*src, "tensor '" + k1 + "' is ");
  }
  auto shape = with_scales(cfg);
  shape->put(k1, scalar(1.0f, {2}));
  expect_load_error(*shape, "tensor '" + k1 + "' has shape [2], expected a scalar");
  auto dtype = with_scales(cfg);
  dtype->put(k1, Tensor::zeros({}, DType::BF16));
  expect_load_error(*dtype, "tensor '" + k1 + "' has dtype bf16");
  // Scales on some layers only: the first layer without one is named.
  auto partial = model::builtin_model_weights(cfg);
  partial->put(attn(0) + ".k_proj.k_scale", scalar(0.5f));
  expect_load_error(*partial, "tensor '" + attn(1) + ".k_proj.k_scale' is missing");
}

float g_scale = 1.0f;
double round_fp8_scaled(double v) {
  const float inv = 1.0f / g_scale;
  return test::round_fp8(static_cast<double>(static_cast<float>(v) * inv)) * static_cast<double>(g_scale);
}

// With one checkpoint scale s on every layer, the engine's fp8 cache matches the reference that stores each
// row as e4m3(x / s) * s, at the fp32 tolerance; the reference with s = 1 differs from it by more than that,
// so the comparison sees whether the scale was used.
TEST(KvScales, Fp8CacheStoresAndReadsWithTheCheckpointScale) {
  const io::ModelConfig cfg = model::builtin_model_config();
  const float s = 0.37f;  // not a power of two: every row rounds on a different grid than with scale 1
  auto src = model::builtin_model_weights(cfg);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) src->put(attn(l) + ".k_proj.k_scale", scalar(s));
  model::Model m(cfg, model::load_weights(cfg, *src));
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 37 + 11) % model::kBuiltinVocab);

  g_scale = s;
  const test::Mat scaled = test::reference_forward(cfg, *src, ids, -1, round_fp8_scaled, test::round_bf16);
  g_scale = 1.0f;
  const test::Mat unit = test::reference_forward(cfg, *src, ids, -1, round_fp8_scaled, test::round_bf16);
  test::Runner run(m, kv::KvCacheDType::FP8E4M3);
  const std::vector<float> got = run.run(ids, 1);
  const int64_t V = cfg.vocab_size;
  ASSERT_EQ(got.size(), scaled.size());
  double worst = 0, vs_unit = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const size_t o = t * static_cast<size_t>(V);
    worst = std::max(worst, test::rel_error(got.data() + o, scaled.data() + o, static_cast<size_t>(V)));
    vs_unit = std::max(vs_unit, test::rel_error(got.data() + o, unit.data() + o, static_cast<size_t>(V)));
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_GT(vs_unit, 1e-3) << "the checkpoint's scale made no difference";
}

}  // namespace
}  // namespace ms
