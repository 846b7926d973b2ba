// One DeepSeek-V3-family model: its config, its weights (on the device of the executor that built it) and its
// forward pass, a sequence of named ops (`layer.12.attn.mla`, `layer.12.moe.experts`, ...) over a
// preallocated Workspace, each reported to the profiler with its cost (model/op_costs). The model reads one
// step's StepInputs and one KvPool; it owns no per-request or per-step state and launches no kernel itself.
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
#include "model/step_inputs.h"
#include "model/workspace.h"
#include "moe/expert_distribution.h"
#include "moe/expert_stats.h"
#include "moe/router.h"
#include "ops/ctx.h"
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
  // Run each MoE layer's shared expert as one more expert of the grouped op (every token routed to it with
  // weight 1: one launch reads it once for all tokens, instead of a dense MLP of its own) where it has the
  // routed experts' width and storage format and the experts are not split over EP ranks. The GPU executor
  // turns it on; the CPU reference keeps the separate MLP.
  bool fuse_shared_expert = false;
  // DSA models: a step whose every query sees at most index_topk keys (position + 1 <= index_topk) would
  // have the indexer select all of them, so it attends densely over the visible keys and skips the indexer's
  // query side (wq_b, weights_proj, scores, top-k); the index keys are still written for later steps. Same
  // attention up to summation order. The GPU executor turns it on (keying its graphs by it); the CPU
  // reference keeps the indexer on every step.
  bool dsa_dense_when_short = false;
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
  // When set, each MoE layer adds the step's routed ids (every token, as the experts run them) to the
  // per-expert counts (--expert-distribution-out). A sync on a device; steps run eagerly.
  moe::ExpertDistribution* expert_distribution = nullptr;
};

class Model {
 public:
  Model(io::ModelConfig cfg, ModelWeights weights, ModelOptions opt = {});

  // The config as this rank computes it: under TP, num_attention_heads and intermediate_size are the rank's
  // share (model/weight_loader: shard_config); otherwise the checkpoint's.
  const io::ModelConfig& config() const { return cfg_; }
  // How the weights are split; a sharded model's forward needs Workspace::comm (all ranks of the group).
  const dist::ShardSpec& shard() const { return w_.shard; }
  const ModelWeights& weights() const { return w_; }
  const AttentionScales& scales() const { return scales_; }

  // The KvPool layout this model needs.
  kv::KvPoolConfig kv_pool_config(int32_t num_pages, int32_t page_size, kv::KvCacheDType dtype) const;

  // The routing of this model's MoE layers (layers without a correction bias drop it).
  const moe::RouterConfig& router_config() const { return router_; }

  const ModelOptions& options() const { return opt_; }
  // Whether forward(b) attends densely instead of through the DSA indexer's selection
  // (ModelOptions::dsa_dense_when_short): a DSA model, the option on, no indexer probe, every token of b at a
  // position below index_topk.
  bool dsa_dense_step(const kv::ForwardBatch& b) const;
  // Moves the RoPE frequency tables to memory from `alloc` through ctx (the CUDA executor's copy of a model,
  // whose weights are already on the device).
  void place_tables(const ops::Ctx& ctx, const TensorAlloc& alloc);

  // Throws ms::Error naming what in a batch cannot run on `pool` (host checks, before the batch is copied to
  // a device).
  void check_batch(const kv::ForwardBatch& b, const kv::KvPool& pool, const StepRouting& routing) const;

  // Runs one step on ctx.device: every activation lives in `ws` (same device), the new tokens' keys go into
  // `pool`. Returns logits f32 [in.n_logit_rows, vocab], a view of ws.logits (valid until the next step).
  // Reads device data on the host only for expert stats, probes and a listening profiler (each a sync).
  Tensor forward(const ops::Ctx& ctx, const StepInputs& in, kv::KvPool& pool, Workspace& ws,
                 const StepRouting& routing = {}, profiler::OpSink* sink = nullptr) const;

 private:
  void build_expert_routes();  // EP: expert_route_ from each MoE layer's expert ids and copy ranks
  void record_stats(const ops::Ctx& ctx, int layer, const StepInputs& in, Workspace& ws, const Tensor& plain,
                    const StepRouting& routing) const;

  io::ModelConfig cfg_;
  ModelWeights w_;
  ModelOptions opt_;
  AttentionScales scales_;
  moe::RouterConfig router_;
  // EP, one per layer (undefined tensors for dense layers): where this rank runs each routed assignment.
  struct ExpertRoute {
    Tensor slot;    // i32 [E] logical expert -> local slot, -1 elsewhere (every expert has one copy)
    Tensor copies;  // i32 [E] copies over all ranks (some expert has several; slot is then undefined)
    Tensor slots;   // i32 [E, max copies] this rank's slot of copy c of expert e, -1 elsewhere
  };
  std::vector<ExpertRoute> expert_route_;
  // fuse_shared_expert, one per layer (empty where the layer's shared expert runs as its own MLP): the routed
  // experts followed by the shared one, as the grouped op takes them.
  std::vector<std::vector<ops::ExpertWeights>> fused_experts_;
  void build_fused_experts();
};

}  // namespace ms::model
