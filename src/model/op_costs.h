// Cost models of the forward's ops (bytes they must move, bytes they do move, FLOPs), for the profiler's
// roofline. Pure host arithmetic over the config, weights and the step's host batch; the forward evaluates
// them only when a profiler listens, and they never read device tensors.
#pragma once

#include <cstdint>
#include <span>

#include "io/model_config.h"
#include "kv/forward_batch.h"
#include "ops/linear_weight.h"
#include "ops/moe_experts.h"
#include "profiler/op_record.h"

namespace ms::model::costs {

// What the attention cost models need from the host batch.
struct StepShape {
  int64_t m = 0, n_seqs = 0;
  int64_t keys_total = 0;  // sum over tokens of position + 1
  int64_t ctx_total = 0;   // sum over sequences of their length
  const kv::ForwardBatch* batch = nullptr;
  static StepShape of(const kv::ForwardBatch& b);
};

profiler::OpCost linear(const ops::LinearWeight& w, int64_t m);
profiler::OpCost sum(profiler::OpCost a, const profiler::OpCost& b);
// An elementwise f32 op over n values reading `reads` and writing `writes` arrays of n, plus `extra` bytes.
profiler::OpCost elementwise(double n, double reads, double writes, double flops_per, double extra = 0);
// RMSNorm of m rows of n (reads x and the weight, writes the output).
profiler::OpCost rms_norm(int64_t m, int64_t n);
// Residual add fused with the next RMSNorm: h += delta, xn = norm(h).
profiler::OpCost add_rms_norm(int64_t m, int64_t n);

profiler::OpCost embed(const ops::LinearWeight& table, int64_t m, int64_t hidden);
profiler::OpCost silu_mul(int64_t m, int64_t inter);
// kv_a_norm over the latent channels, then rope on the query heads and the key.
profiler::OpCost attn_rope(const io::ModelConfig& c, int64_t m);
profiler::OpCost kv_store(const io::ModelConfig& c, int64_t m, double cache_elem_bytes);
profiler::OpCost debug_pool_cast(const io::ModelConfig& c, int64_t ctx_rows, int64_t pool_slots,
                                 double cache_elem_bytes);
profiler::OpCost indexer_k_norm_rope(const io::ModelConfig& c, int64_t m, double key_elem_bytes);
profiler::OpCost indexer_topk(const io::ModelConfig& c, const StepShape& s, double key_elem_bytes);
profiler::OpCost absorb_q(const io::ModelConfig& c, const ops::LinearWeight& kv_b, int64_t m);
profiler::OpCost mla(const io::ModelConfig& c, const StepShape& s, double cache_elem_bytes);
profiler::OpCost out_v(const io::ModelConfig& c, const ops::LinearWeight& kv_b, int64_t m);
profiler::OpCost route(const io::ModelConfig& c, int64_t m);
// `distinct` experts routed to (their weights are the floor), m tokens x top_k slots.
// `distinct` of `experts` run, each token taking `slots_per_token` of them.
profiler::OpCost moe_experts(const io::ModelConfig& c, std::span<const ops::ExpertWeights> experts, int64_t m,
                             int distinct, int slots_per_token);

}  // namespace ms::model::costs
