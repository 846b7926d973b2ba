// One DeepSeek-V3-family model: its config, its weights and its forward pass, a sequence of named ops
// (`layer.12.attn.mla`, `layer.12.moe.experts`, ...) each reported to the profiler with its cost. The model
// reads a ForwardBatch and one KvPool; it owns no per-request state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"
#include "kv/forward_batch.h"
#include "kv/kv_pool.h"
#include "model/model_weights.h"
#include "model/rope_setup.h"
#include "ops/moe_experts.h"
#include "profiler/op_record.h"

namespace ms::model {

struct ModelOptions {
  bool indexer_rope_interleaved = false;  // see make_attention_scales
};

class Model {
 public:
  Model(io::ModelConfig cfg, ModelWeights weights, ModelOptions opt = {});

  const io::ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const AttentionScales& scales() const { return scales_; }

  // The KvPool layout this model needs.
  kv::KvPoolConfig kv_pool_config(int32_t num_pages, int32_t page_size, kv::KvCacheDType dtype) const;

  // Runs one step: writes the new tokens' keys into `pool` and returns logits f32 [b.logit_rows.size(),
  // vocab].
  Tensor forward(const kv::ForwardBatch& b, kv::KvPool& pool, profiler::OpSink* sink = nullptr);

 private:
  struct Scratch {
    std::vector<float> attn, indexer;
    ops::MoeScratch moe;
    std::vector<int32_t> topk_ids;
    std::vector<float> topk_weights, router_logits;
  };
  void check_batch(const kv::ForwardBatch& b, const kv::KvPool& pool) const;

  io::ModelConfig cfg_;
  ModelWeights w_;
  ModelOptions opt_;
  AttentionScales scales_;
  Scratch scratch_;
};

}  // namespace ms::model
