// RoPE tables and softmax scales of a config, computed as Hugging Face's DeepseekV3 / GlmMoeDsa modeling code
// does (fp32 inverse frequencies; YaRN ramp between interpolated and extrapolated frequencies; YaRN's
// attention factor multiplies cos and sin).
#pragma once

#include "io/model_config.h"
#include "ops/ops.h"

namespace ms::model {

struct AttentionScales {
  ops::RopeTable rope;          // main attention, qk_rope_head_dim channels
  ops::RopeTable indexer_rope;  // DSA indexer (its rope channels come first in each head)
  float softmax_scale = 1.0f;   // MLA
  float indexer_softmax_scale = 1.0f;
};

// YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1).
double yarn_get_mscale(double factor, double mscale);

// Whether the DSA indexer rotates pairs (2i, 2i+1): Hugging Face's GlmMoeDsa (transformers 5.17, checked
// against its logits) rotates indexer and attention alike; DeepSeek-V3.2's indexer rotates halves.
bool default_indexer_interleaved(const io::ModelConfig& c);

// indexer_interleaved: see default_indexer_interleaved.
AttentionScales make_attention_scales(const io::ModelConfig& c, bool indexer_interleaved);

}  // namespace ms::model
