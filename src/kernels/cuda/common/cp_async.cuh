// cp.async (sm_80+): per-thread asynchronous copies global -> shared, grouped by commit, waited for by
// count. A thread sees its own copies after its wait; other threads need a barrier after it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda::dev {

// 16 bytes through L2 only (.cg). src_bytes < 16 fills the rest with zeros; 0 reads nothing from src (a
// row that must not be read, e.g. past a sequence or a tile edge). dst: shared-window address.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// 4 bytes (.ca: the only cache mode sizes below 16 allow).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// Closes this thread's copies since the last commit into one group.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Until at most N of this thread's groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The same with a run-time count (ring depths chosen at launch): n in 0 .. 7; a larger n waits until 7 are
// pending (stricter than asked, never looser).
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  switch (n) {
    case 0:
      cp_async_wait<0>();
      break;
    case 1:
      cp_async_wait<1>();
      break;
    case 2:
      cp_async_wait<2>();
      break;
    case 3:
      cp_async_wait<3>();
      break;
    case 4:
      cp_async_wait<4>();
      break;
    case 5:
      cp_async_wait<5>();
      break;
    case 6:
      cp_async_wait<6>();
      break;
    default:
      cp_async_wait<7>();
      break;
  }
}

}  // namespace ms::cuda::dev
