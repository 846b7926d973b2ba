// Every activation of one forward step, allocated once on the executor's device for the largest step it will
// run (max_tokens tokens of max_seqs sequences, max_logit_rows rows of logits). The forward takes views of
// the first m rows; nothing is allocated per op or per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "io/model_config.h"
#include "moe/route_step.h"
#include "ops/moe_experts.h"

namespace ms::model {

struct WorkspaceLimits {
  int64_t max_tokens = 0;      // tokens per step (decodes + prefill chunks)
  int64_t max_seqs = 0;        // sequences per step
  int64_t max_logit_rows = 0;  // rows of logits per step (0: max_seqs)
  int64_t max_context = 0;     // tokens per sequence: the most keys attention or the indexer sees per query
  int64_t debug_pool_floats = 0;  // ModelOptions::debug_cast_whole_pool only: layer slots x width, else 0
};

struct Workspace {
  WorkspaceLimits limits;
  Device device = Device::CPU;
  // [max_tokens, ...] f32 unless said; the forward uses rows [0, m).
  Tensor h, xn;  // [., hidden] residual stream, normed input of the next block
  Tensor qa;     // [., q_lora_rank] (q_lora models)
  Tensor q;      // [., heads * (qk_nope + qk_rope)]
  Tensor kv;     // [., kv_lora_rank + qk_rope] the row stored into the cache
  Tensor qkv;    // CUDA, q_lora models: [., q_lora_rank + kv_lora_rank + qk_rope (+ index_dim)] a fused qkv_a
  Tensor iq, ik, iw;     // indexer: [., index_heads * index_dim], [., index_dim], [., index_heads]
  Tensor topk;           // i32 [., index_topk] the last full indexer layer's selection
  Tensor q_cat;          // [., heads, kv_lora_rank + qk_rope]
  Tensor lat;            // [., heads, kv_lora_rank]
  Tensor o;              // [., heads * v_head_dim]
  Tensor attn_out, ffn;  // [., hidden]
  Tensor shared;         // [., hidden] shared experts' output
  Tensor gate_up, act;   // [., 2 * inter], [., inter]; inter = max(dense, shared experts) intermediate
  Tensor router_logits;  // [., n_routed_experts]
  Tensor topk_ids;       // i32 [., top_k]
  Tensor topk_weights;   // f32 [., top_k]
  Tensor topk_ids_ext, topk_weights_ext;  // [., top_k + 1] with the shared expert (shared experts only)
  Tensor plain_ids;                       // i32 [., top_k] plain routing, the expert-stats baseline
  Tensor local_ids;  // i32 [., top_k] EP: topk_ids as this rank's expert slots, -1 for other ranks' experts
  Tensor last;       // [max_logit_rows, hidden] rows that produce logits
  Tensor logits;     // [max_logit_rows, vocab]
  // Scratch, sized by the worst case: attention and indexer over max_context keys (or index_topk selected
  // keys) per query; MoE groups of up to max_tokens rows per expert; routing with every row a decode row.
  Tensor attn_scratch, indexer_scratch;  // f32 flat
  Tensor pool_cast;                      // f32 flat, debug_pool_floats
  ops::MoeScratch moe;
  // The rank's group when the model is sharded (set by the executor that owns this workspace); null: one
  // rank.
  dist::Communicator* comm = nullptr;
  moe::RouteScratch route;
  // Host staging for what must be read on the host (expert stats, router probes, cost of moe.experts): each
  // read copies back and so forces a sync on a device.
  std::vector<int32_t> host_ids, host_plain_ids, host_dec;
  std::vector<uint8_t> host_mask;

  // All tensors through `alloc` on `device`; throws on limits that are not positive.
  static Workspace make(const io::ModelConfig& cfg, const WorkspaceLimits& limits, Device device,
                        const TensorAlloc& alloc);
  // Bytes of device memory held (host staging excluded).
  size_t bytes() const;
};

}  // namespace ms::model
