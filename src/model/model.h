// One DeepSeek-V3-family model: its config, its weights and its forward pass, a sequence of named ops
// (`layer.12.attn.mla`, `layer.12.moe.experts`, ...) each reported to the profiler with its cost. The model
// reads a ForwardBatch and one KvPool; it owns no per-request state.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"
#include "kv/forward_batch.h"
#include "kv/kv_pool.h"
#include "model/model_weights.h"
#include "model/rope_setup.h"
#include "moe/expert_stats.h"
#include "moe/router.h"
#include "ops/moe_experts.h"
#include "profiler/op_record.h"

namespace ms::model {

// What a full DSA indexer layer saw and chose in one forward, for tests and debugging (scores can be
// recomputed from q, w and the pool's index keys of `layer`).
struct IndexerProbe {
  int layer = 0;
  const Tensor* q = nullptr;     // f32 [m, index_n_heads, index_head_dim], rotated
  const Tensor* w = nullptr;     // f32 [m, index_n_heads], already times index_n_heads^-0.5
  const Tensor* topk = nullptr;  // i32 [m, index_topk] selected positions, ascending, -1 padded
  const kv::ForwardBatch* batch = nullptr;
};

// A MoE layer's router input and choice in one forward, for tests and debugging.
struct RouterProbe {
  int layer = 0;
  const Tensor* logits = nullptr;     // f32 [m, n_routed_experts], before scoring
  const int32_t* topk_ids = nullptr;  // [m, num_experts_per_tok]
};

struct ModelOptions {
  std::optional<bool> indexer_rope_interleaved;            // default: default_indexer_interleaved(config)
  std::function<void(const IndexerProbe&)> indexer_probe;  // called after each full indexer layer
  std::function<void(const RouterProbe&)> router_probe;    // called after each MoE layer's routing
  // Test switch, off in normal use: on every layer of every step, read the layer's whole KV pool and cast it
  // to an f32 scratch buffer (op `attn.debug_pool_cast`), the needless work the profiler must catch. Also
  // turned on by the environment variable MOESERVE_DEBUG_PLANT_POOL_CAST=1.
  bool debug_cast_whole_pool = false;
};

// MoE routing choices of one step. Decode tokens may use Opportunistic Expert Activation, with the base set
// over all decode tokens of the step; every other token (prefill) routes plainly.
struct StepRouting {
  std::vector<uint8_t> decode_tokens;  // [n_tokens] 1 marks a decode token; empty: none is
  moe::OeaConfig oea;                  // for the decode tokens; disabled: plain routing
  // When set, each MoE layer records the distinct experts of the step's decode tokens (nothing for a step
  // without any): RoutingKind::Baseline = what plain routing picks (a second routing call when OEA is on),
  // RoutingKind::Oea = what OEA picked (only when on). Layers are indexed as in the model.
  moe::ExpertStats* expert_stats = nullptr;
};

class Model {
 public:
  Model(io::ModelConfig cfg, ModelWeights weights, ModelOptions opt = {});

  const io::ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const AttentionScales& scales() const { return scales_; }

  // The KvPool layout this model needs.
  kv::KvPoolConfig kv_pool_config(int32_t num_pages, int32_t page_size, kv::KvCacheDType dtype) const;

  // The routing of this model's MoE layers (layers without a correction bias drop it).
  const moe::RouterConfig& router_config() const { return router_; }

  // Runs one step: writes the new tokens' keys into `pool` and returns logits f32 [b.logit_rows.size(),
  // vocab].
  Tensor forward(const kv::ForwardBatch& b, kv::KvPool& pool, profiler::OpSink* sink = nullptr,
                 const StepRouting& routing = {});

 private:
  struct Scratch {
    std::vector<float> attn, indexer;
    ops::MoeScratch moe;
    std::vector<int32_t> topk_ids;
    std::vector<float> topk_weights, router_logits;
    std::vector<float> pool_cast;                  // debug_cast_whole_pool only
    std::vector<int32_t> decode_rows, decode_ids;  // OEA: decode token indices, their routed ids
    std::vector<float> decode_weights;
  };
  void check_batch(const kv::ForwardBatch& b, const kv::KvPool& pool, const StepRouting& routing) const;
  void route(int layer, const MoeWeights& mw, const Tensor& logits, const StepRouting& routing);

  io::ModelConfig cfg_;
  ModelWeights w_;
  ModelOptions opt_;
  AttentionScales scales_;
  moe::RouterConfig router_;
  Scratch scratch_;
};

}  // namespace ms::model
