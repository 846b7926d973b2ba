// Global loads of bytes a kernel reads once (streamed weights): through the non-coherent (read-only) path and
// not kept in L1 (L1::no_allocate), so they do not push out what the block does reuse. The data must not be
// written while the kernel runs. Pointers must be aligned to the load's size.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda::dev {

// Word i (0..3) of a 16-byte load (i known at compile time after unrolling: no local-memory array).
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 16 bytes.
__device__ __forceinline__ uint4 ld_stream16(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// 16 bytes; a miss fetches the whole 256-byte L2 window around them, which neighbouring warps reading the
// next bytes of the same rows then find in L2: more bytes in flight per load.
__device__ __forceinline__ uint4 ld_stream16_l2_256(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// 8 bytes.
__device__ __forceinline__ uint2 ld_stream8(const void* ptr) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(ptr));
  return v;
}

// 2 bytes, zero-extended.
__device__ __forceinline__ uint32_t ld_stream2(const void* ptr) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];\n" : "=h"(v) : "l"(ptr));
  return v;
}

}  // namespace ms::cuda::dev
