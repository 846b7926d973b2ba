#include "model/rope_setup.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace ms::model {

double yarn_get_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

namespace {

ops::RopeTable make_table(const io::RopeConfig& rc, int64_t dim, bool interleaved) {
  MS_CHECK(dim > 0 && dim % 2 == 0, "rope dimension {} must be positive and even", dim);
  ops::RopeTable t;
  t.interleaved = interleaved;
  t.inv_freq = Tensor::empty({dim / 2}, DType::F32);
  float* f = t.inv_freq.data<float>();
  const float base = static_cast<float>(rc.theta);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    f[i] = 1.0f / pos_freq;
  }
  if (rc.type == io::RopeType::Yarn) {
    const double factor = rc.factor;
    const double orig = static_cast<double>(rc.original_max_position_embeddings);
    auto correction_dim = [&](double rotations) {
      return (static_cast<double>(dim) * std::log(orig / (rotations * 2 * std::numbers::pi))) /
             (2 * std::log(rc.theta));
    };
    double low = std::floor(correction_dim(rc.beta_fast));
    double high = std::ceil(correction_dim(rc.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < dim / 2; ++i) {
      const float ramp =
          std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
      const float extrap_factor = 1.0f - ramp;
      const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
      const float extrap = 1.0f / pos_freq;
      const float interp = 1.0f / (static_cast<float>(factor) * pos_freq);
      f[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
    if (rc.mscale != 0.0 && rc.mscale_all_dim != 0.0)
      t.attention_scaling =
          static_cast<float>(yarn_get_mscale(factor, rc.mscale) / yarn_get_mscale(factor, rc.mscale_all_dim));
    else
      t.attention_scaling = static_cast<float>(yarn_get_mscale(factor, 1.0));
  }
  return t;
}

}  // namespace

bool default_indexer_interleaved(const io::ModelConfig& c) {
  return c.arch == io::ModelArch::GlmMoeDsa ? c.rope.interleaved : false;
}

AttentionScales make_attention_scales(const io::ModelConfig& c, bool indexer_interleaved) {
  AttentionScales s;
  s.rope = make_table(c.rope, c.qk_rope_head_dim, c.rope.interleaved);
  s.indexer_rope = make_table(c.rope, c.qk_rope_head_dim, indexer_interleaved);
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
  // DeepSeek-V3's attention multiplies its softmax scale by mscale(factor, mscale_all_dim)^2 under YaRN; the
  // Hugging Face GlmMoeDsa attention keeps 1/sqrt(qk_head_dim).
  if (c.rope.type == io::RopeType::Yarn && c.rope.mscale_all_dim != 0.0 &&
      c.arch != io::ModelArch::GlmMoeDsa) {
    const double m = yarn_get_mscale(c.rope.factor, c.rope.mscale_all_dim);
    scale *= m * m;
  }
  s.softmax_scale = static_cast<float>(scale);
  if (c.has_indexer)
    s.indexer_softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.index_head_dim)));
  return s;
}

}  // namespace ms::model
