// Routed experts of one step on the CPU, all experts in one parallel region: the tokens are already grouped
// by expert (offsets / order); threads split every touched expert's gate and up tiles together (contiguous
// ranges of about equal weight bytes; an expert's gate, then its up, each read as one sequential run), then
// SiLU-and-mul, then every expert's down tiles, then each token's weighted sum.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_view.h"

namespace ms::kernels::cpu {

constexpr int kMoeMaxTopK = 64;

struct MoeExpertsParams {
  const float* __restrict__ x = nullptr;             // [m, hidden] contiguous
  const int32_t* __restrict__ topk_ids = nullptr;    // [m, top_k]; < 0: slot unused
  const float* __restrict__ topk_weights = nullptr;  // [m, top_k]
  const int32_t* __restrict__ offsets = nullptr;     // [n_experts + 1] group starts in order
  const int32_t* __restrict__ order = nullptr;  // [offsets[n_experts]] slots (token * top_k + k) by expert
  const WeightView* gate = nullptr;             // [n_experts], each [inter, hidden]
  const WeightView* up = nullptr;               // [n_experts], each [inter, hidden]
  const WeightView* down = nullptr;             // [n_experts], each [hidden, inter]
  int64_t m = 0, hidden = 0, inter = 0;
  int top_k = 0, n_experts = 0;  // top_k <= kMoeMaxTopK
  // Scratch, scratch_rows rows each: experts whose groups together exceed it run in several passes.
  float* __restrict__ xs = nullptr;       // [scratch_rows, hidden] gathered token rows
  float* __restrict__ gate_up = nullptr;  // [scratch_rows, 2 * inter]
  float* __restrict__ act = nullptr;      // [scratch_rows, inter]
  float* __restrict__ ys = nullptr;       // [scratch_rows, hidden]
  int64_t scratch_rows = 0;
  float* __restrict__ out = nullptr;  // [m, hidden] += sum over slots, in ascending expert order per token
};

// Every expert's rows use the linear kernels (linear_tile) with that expert's token count, and each token's
// slots are added in ascending expert order, so a token's result does not depend on the batch around it.
void moe_experts(const MoeExpertsParams& p);

}  // namespace ms::kernels::cpu
