// The expert grouping plan on the GPU: from topk_ids, the token slots of each expert, grouped by expert in a
// stable order (by slot index = token * top_k + k, i.e. by token, then slot), in preallocated buffers sized
// by m * top_k and n_experts. Deterministic (no order depends on atomics) and graph-capturable (two kernels,
// no host read). Ids < 0 are empty slots; ids >= n_experts are treated as empty too (a kernel cannot throw).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda {

constexpr int kMoePlanMaxExperts = 1024;

struct MoePlanParams {
  const int32_t* __restrict__ topk_ids;  // [m, top_k] routed expert per slot, -1 for an empty slot
  int32_t* __restrict__ expert_counts;   // [n_experts] out: slots routed to each expert
  int32_t* __restrict__ expert_offsets;  // [n_experts + 1] out: exclusive prefix of counts; [n_experts] =
                                         // total
  int32_t* __restrict__ sorted_slots;    // [m * top_k] out: slots grouped by expert, expert e's at
                                         // [offsets[e], offsets[e+1]); entries past the total are -1
  int m = 0, top_k = 0, n_experts = 0;
};

void moe_plan(const MoePlanParams& p, cudaStream_t stream);

}  // namespace ms::cuda
