// Routed experts, grouped by expert: each expert gathers its tokens, runs gate/up -> SiLU-and-mul -> down on
// them as one small GEMM, and adds the routing-weighted result back to each token's row. On the CPU all
// touched experts run in one parallel region (kernels/cpu/moe.h).
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "ops/ctx.h"
#include "ops/linear_weight.h"

namespace ms::ops {

struct ExpertWeights {
  LinearWeight gate, up;  // [intermediate, hidden]
  LinearWeight down;      // [hidden, intermediate]
};

// Preallocated scratch on the op's device, sized for the worst case of a step of up to max_tokens tokens:
// an expert serves each token at most once, so one expert's group holds at most max_tokens rows.
struct MoeScratch {
  Tensor offsets;  // i32 [n_experts + 1] group starts
  Tensor cursor;   // i32 [n_experts] fill position while grouping
  Tensor order;    // i32 [max_tokens * top_k] (token, k) slots grouped by expert
  Tensor x;        // f32 [max_tokens * hidden] one expert's gathered rows
  Tensor gate_up;  // f32 [max_tokens * 2 * intermediate]
  Tensor act;      // f32 [max_tokens * intermediate]
  Tensor y;        // f32 [max_tokens * hidden]

  static MoeScratch make(const TensorAlloc& alloc, int64_t max_tokens, int top_k, int n_experts,
                         int64_t hidden, int64_t intermediate);
};

// out [m, hidden] += sum_k topk_weights[t, k] * expert[topk_ids[t, k]](x[t]); ids < 0 are skipped.
// topk_ids i32 [m, top_k], topk_weights f32 [m, top_k], on the op's device.
void moe_experts(const Ctx& ctx, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                 std::span<const ExpertWeights> experts, const Tensor& out, const MoeScratch& scratch);

}  // namespace ms::ops
