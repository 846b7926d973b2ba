// Per-rank memory plan under tensor / expert parallelism, printed before anything is allocated; a set-up
// that cannot fit is refused with what to change. The model's stored bytes by role come from the model room
// (model::parallel_weight_bytes, the same per-tensor bytes `moeserve inspect` counts); this room only
// splits them over ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ms::dist {

// Stored bytes of the whole main model (MTP layers excluded: they are not run), by how they split.
struct WeightBytes {
  std::string label;              // "glm_moe_dsa nvfp4": names the model in messages
  uint64_t embedding = 0;         // replicated
  uint64_t lm_head = 0;           // replicated
  uint64_t attention_heads = 0;   // split over TP by heads: q_b, kv_b, o_proj
  uint64_t attention_shared = 0;  // every rank: q_a, kv_a, their norms, the whole DSA indexer, biases
  uint64_t norms = 0;             // layer and final RMSNorms, replicated
  uint64_t router = 0;            // gate weight and correction bias, replicated
  uint64_t dense_mlp = 0;         // dense layers' MLPs: split over TP (replicated under DP attention)
  uint64_t shared_expert = 0;     // replicated
  uint64_t routed_experts = 0;    // all routed experts of all MoE layers
  int n_routed_experts = 0;
  int num_attention_heads = 0;
  int64_t hidden_size = 0, vocab_size = 0;
  uint64_t kv_bytes_per_token = 0;  // all layers, at the KV cache dtype
  uint64_t total() const;
};

struct MemoryOptions {
  int tp_size = 1, ep_size = 1;
  bool dp_attention = false;          // attention replicated, each rank serving its own requests
  int num_redundant_experts = 0;      // extra routed-expert slots over all EP ranks (multiple of ep_size)
  uint64_t gpu_memory_bytes = 0;      // per GPU
  double mem_fraction_static = 0.88;  // share of GPU memory for weights, KV pages and workspace
  int page_size = 64;                 // tokens per KV page
  int64_t max_num_tokens = 8192;      // largest prefill chunk (activation workspace)
  int64_t max_decode_batch = 256;     // logits, graph-safe EP buffers
  int64_t min_kv_tokens = 4096;       // fewer KV tokens than this per rank is refused
};

struct RoleBytes {
  std::string role;
  uint64_t bytes = 0;
};

struct MemoryPlan {
  int world_size = 1;              // GPUs: max(tp_size, ep_size)
  std::vector<RoleBytes> weights;  // per rank, by role
  uint64_t weight_bytes = 0;       // per rank
  uint64_t workspace_bytes = 0;    // per rank, estimate
  uint64_t budget_bytes = 0;       // gpu_memory * mem_fraction_static
  uint64_t kv_bytes = 0;           // what is left for KV pages
  int64_t kv_pages = 0, kv_tokens = 0;
  bool fits = false;
  std::string message;  // the refusal (what to change) when !fits
};

// Throws ms::Error for inconsistent options (tp or ep not dividing heads / experts / each other); an
// oversize set-up is not an error here: fits = false with a message.
MemoryPlan plan_memory(const WeightBytes& w, const MemoryOptions& o);
// Throws ms::Error carrying plan.message when it does not fit.
void require_fits(const MemoryPlan& plan);
// The lines each rank prints before allocating.
std::string format_memory_plan(const MemoryPlan& plan, const MemoryOptions& o);

}  // namespace ms::dist
