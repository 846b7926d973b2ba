// Routed experts, grouped by expert: each expert gathers its tokens, runs gate/up -> SiLU-and-mul -> down on
// them as one small GEMM, and adds the routing-weighted result back to each token's row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/linear_weight.h"

namespace ms::ops {

struct ExpertWeights {
  LinearWeight gate, up;  // [intermediate, hidden]
  LinearWeight down;      // [hidden, intermediate]
};

struct MoeScratch {
  std::vector<int32_t> offsets, order;  // tokens grouped by expert
  std::vector<float> x, gate_up, act, y;
};

// out [m, hidden] += sum_k topk_weights[t, k] * expert[topk_ids[t, k]](x[t]); ids < 0 are skipped.
// Returns the number of distinct experts run (their weights are the bytes this op must read).
int moe_experts(const Tensor& x, std::span<const int32_t> topk_ids, std::span<const float> topk_weights,
                int top_k, std::span<const ExpertWeights> experts, const Tensor& out, MoeScratch& scratch);

}  // namespace ms::ops
