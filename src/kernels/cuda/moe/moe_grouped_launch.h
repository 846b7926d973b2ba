// Host side the grouped expert GEMM launchers share (moe_experts_mma.cu, moe_experts_wgmma.cu): how many
// blocks of a kernel stay resident per multiprocessor, and the persistent grid that covers the work items.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe/moe_experts.h"

namespace ms::cuda::moe_launch {

// Blocks of `kernel` (with `threads` threads and `smem` bytes of dynamic shared memory, which this also
// allows) resident on one multiprocessor of `device`; read once per (kernel, smem, device). A kernel of which
// not one block fits is refused with its name. The allowance only grows: one kernel launched with several
// sizes (the per-expert table makes the size depend on the expert count) keeps the largest, so a launch with
// a size seen before never exceeds what the kernel was last allowed.
inline int resident_blocks(const char* name, const void* kernel, int threads, size_t smem, int device) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, size_t, int>, int> cache;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  std::lock_guard<std::mutex> lock(mu);
  size_t& allow = allowed[std::make_pair(kernel, device)];
  if (smem > allow) {
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    allow = smem;
  }
  const auto key = std::make_tuple(kernel, smem, device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  MS_CHECK(blocks >= 1, "{}: no block of {} threads and {} bytes of shared memory fits a multiprocessor",
           name, threads, smem);
  cache.emplace(key, blocks);
  return blocks;
}

// The persistent grid: the work items' upper bound (every expert may add one partial M tile of bm rows, times
// the n_tiles weight tiles), at most what stays resident on the whole device, at least one block.
inline unsigned grid(const MoeExpertsParams& p, int bm, int n_tiles, int per_sm, int multiprocessors) {
  const int64_t slots = static_cast<int64_t>(p.m) * p.top_k;
  const int64_t items = (slots / bm + std::min<int64_t>(slots, p.n_experts)) * n_tiles;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(items, static_cast<int64_t>(per_sm) * multiprocessors)));
}

}  // namespace ms::cuda::moe_launch
