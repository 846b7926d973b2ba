// Routing of one MoE layer for one step, as an op on the step's device: plain routing for prefill rows, OEA
// for the decode rows (the base set over the step's decode rows only, so a prefill chunk never widens it).
// CPU: moe::route_cpu; a CUDA backend (scores, group-limited top-k, OEA base set and fill) slots in beside
// it.
#pragma once

#include "core/tensor.h"
#include "moe/router.h"
#include "ops/ctx.h"

namespace ms::moe {

// Preallocated scratch on the op's device for steps of up to max_tokens tokens (worst case: every token a
// decode token scattered among prefill rows, gathered into one block).
struct RouteScratch {
  Tensor decode_rows;     // i32 [max_tokens] indices of the decode rows
  Tensor decode_logits;   // f32 [max_tokens * n_experts] their router logits, gathered
  Tensor decode_ids;      // i32 [max_tokens * top_k]
  Tensor decode_weights;  // f32 [max_tokens * top_k]; on CUDA the plain-routing weights of the stats baseline
  Tensor base_set;        // u8 [n_experts] the OEA base set (CUDA)

  static RouteScratch make(const ops::TensorAlloc& alloc, int64_t max_tokens, int n_experts, int top_k);
};

// logits f32 [m, n_experts]; correction_bias f32 [n_experts] or undefined (then the config's bias is off);
// decode_mask u8 [m] (1: a decode token) or undefined (no decode token). Writes topk_ids i32 [m, top_k] and
// topk_weights f32 [m, top_k]. When plain_ids (i32 [m, top_k]) is defined it also receives the plain routing
// of every row, the baseline expert statistics compare OEA with. Exactly the choices of route_cpu: plain rows
// as route_cpu without OEA, decode rows as route_cpu with `oea` over those rows alone.
void route_step(const ops::Ctx& ctx, const RouterConfig& cfg, const OeaConfig& oea, const Tensor& logits,
                const Tensor& correction_bias, const Tensor& decode_mask, const Tensor& topk_ids,
                const Tensor& topk_weights, const Tensor& plain_ids, const RouteScratch& scratch);

}  // namespace ms::moe
