// Grouping plan in two kernels:
//   1. one block: a shared-memory histogram of the slots (integer atomics: the counts do not depend on their
//      order), then an exclusive scan by one warp (each lane owns a run of consecutive experts);
//   2. one warp per expert: walks the slots 128 at a time in index order and places its matches by ballot
//   rank,
//      so each expert's list is in slot order with no atomics. Experts with no slot return at once; the
//      others stop after their last match. Threads also fill the unused tail of sorted_slots with -1.
#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/moe/moe_plan.h"

namespace ms::cuda {
namespace {

constexpr int kCountThreads = 1024;
constexpr int kScatterWarps = 4;  // small blocks: the experts' warps spread over more SMs
constexpr unsigned kFull = 0xffffffffu;

__global__ void __launch_bounds__(kCountThreads) moe_plan_count_kernel(const MoePlanParams p) {
  dev::grid_dep_enter();
  __shared__ int32_t s_count[kMoePlanMaxExperts];
  const int n = p.n_experts;
  for (int e = threadIdx.x; e < n; e += kCountThreads) s_count[e] = 0;
  __syncthreads();
  const int64_t slots = static_cast<int64_t>(p.m) * p.top_k;
  for (int64_t s = threadIdx.x; s < slots; s += kCountThreads) {
    const int32_t e = p.topk_ids[s];
    if (e >= 0 && e < n) atomicAdd(&s_count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int per = (n + 31) / 32;  // experts [lane * per, lane * per + per)
    const int e0 = min(lane * per, n), e1 = min(e0 + per, n);
    int run = 0;
    for (int e = e0; e < e1; ++e) run += s_count[e];
    int incl = run;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += v;
    }
    int off = incl - run;
    for (int e = e0; e < e1; ++e) {
      p.expert_counts[e] = s_count[e];
      p.expert_offsets[e] = off;
      off += s_count[e];
    }
    if (lane == 31) p.expert_offsets[n] = incl;
  }
}

__global__ void __launch_bounds__(kScatterWarps * 32) moe_plan_scatter_kernel(const MoePlanParams p) {
  dev::grid_dep_enter();
  const int64_t slots = static_cast<int64_t>(p.m) * p.top_k;
  const int32_t total = p.expert_offsets[p.n_experts];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t s = total + tid; s < slots; s += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p.sorted_slots[s] = -1;

  const int lane = threadIdx.x & 31;
  const int e = blockIdx.x * kScatterWarps + (threadIdx.x >> 5);
  if (e >= p.n_experts) return;
  const int32_t count = p.expert_counts[e];
  if (count == 0) return;
  int32_t* out = p.sorted_slots + p.expert_offsets[e];
  const unsigned lower = (1u << lane) - 1u;
  int32_t placed = 0;
  // Four chunks of 32 slots per round: their loads are in flight together; chunks are ranked in slot order.
  for (int64_t base = 0; base < slots && placed < count; base += 4 * 32) {
    int32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t s = base + 32 * j + lane;
      v[j] = s < slots ? p.topk_ids[s] : -1;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool hit = v[j] == e;
      const unsigned mask = __ballot_sync(kFull, hit);
      if (hit) out[placed + __popc(mask & lower)] = static_cast<int32_t>(base + 32 * j + lane);
      placed += __popc(mask);
    }
  }
}

}  // namespace

void moe_plan(const MoePlanParams& p, cudaStream_t stream) {
  MS_CHECK(p.n_experts >= 1 && p.n_experts <= kMoePlanMaxExperts, "moe_plan: n_experts {} is outside [1, {}]",
           p.n_experts, kMoePlanMaxExperts);
  MS_CHECK(p.m >= 0 && p.top_k >= 1, "moe_plan: m {} top_k {}", p.m, p.top_k);
  MS_CHECK(static_cast<int64_t>(p.m) * p.top_k < (int64_t{1} << 31),
           "moe_plan: m * top_k = {} slots overflow", static_cast<int64_t>(p.m) * p.top_k);
  MS_CHECK(p.expert_counts != nullptr && p.expert_offsets != nullptr,
           "moe_plan: expert_counts / expert_offsets is null");
  MS_CHECK(p.m == 0 || (p.topk_ids != nullptr && p.sorted_slots != nullptr),
           "moe_plan: topk_ids / sorted_slots is null");
  // Static shared memory: the histogram.
  check_smem(current_device_caps(), "moe_plan_count", kMoePlanMaxExperts * sizeof(int32_t));
  launch_kernel("moe_plan_count", moe_plan_count_kernel, 1, kCountThreads, 0, stream, p);
  if (p.m == 0) return;
  const int blocks = (p.n_experts + kScatterWarps - 1) / kScatterWarps;
  launch_kernel("moe_plan_scatter", moe_plan_scatter_kernel, blocks, kScatterWarps * 32, 0, stream, p);
}

}  // namespace ms::cuda
