// The NVFP4 decode math the decode paths of the routed experts share (moe_experts_decode.cu: register and
// cp.async ring variants; moe_experts_decode_bulk.cu: the bulk-copy ring): one 32-k step of a 16-row mma
// tile, e2m1 codes looked up in the per-lane table (moe_dev::build_e2m1_lut with kLutScale) and multiplied by
// the e4m3 block scales as bf16. The k order of a lane's 32 values and the fragment layout are described in
// moe_experts_decode.cu.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/moe/moe_device_common.cuh"

namespace ms::cuda::moe_decode_dev {

using moe_dev::mma_bf16;

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two e4m3 scale bytes (s0 | s1 << 8) -> (s_h, s_h) as bf16 bits x 2^-120 for h = 0, 1 (sign ignored).
__device__ __forceinline__ uint32_t scale_pair(uint32_t two, int h) {
  const uint32_t z = __byte_perm(two, 0u, h == 0 ? 0x4040u : 0x4141u);  // b | b << 16
  return (z & 0x007f007fu) << 4;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The e2m1 table (moe_dev::build_e2m1_lut) holds values x 2^120 (exact: the largest, 6 x 2^120, is far below
// bf16's range); one bf16 multiply by scale_pair's e4m3 x 2^-120 then gives the weight.
constexpr float kLutScale = 1.329227995784916e36f;  // 2^120

// lane_addr: shared-space address of the lane's column of the table (table base + 4 lane). PRMT + LEA + LDS.
__device__ __forceinline__ uint32_t lut_at(uint32_t lane_addr, uint32_t word, int byte) {
  const uint32_t a = lane_addr + (__byte_perm(word, 0u, 0x4440u + byte) << 7);
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}

// One 32-k step of one 16-row tile: weights w0 (row g), w1 (row g + 8), scale pairs s0, s1, B pieces b[4]
// (16 bytes each: mma 2 j2 and 2 j2 + 1).
__device__ __forceinline__ void tile_step(float (&acc)[4], const uint4& w0, const uint4& w1, uint32_t sc0,
                                          uint32_t sc1, const uint4 (&b)[4], uint32_t lut_lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // scale group: mma 0..3, 4..7
    const uint32_t s0 = scale_pair(sc0, h), s1 = scale_pair(sc1, h);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * h + jj, j2 = j >> 1, sub = j & 1;
      const uint32_t r0 = word_of(w0, j2), r1 = word_of(w1, j2);
      const uint32_t a0 = bf16x2_mul(lut_at(lut_lane, r0, 2 * sub), s0);
      const uint32_t a2 = bf16x2_mul(lut_at(lut_lane, r0, 2 * sub + 1), s0);
      const uint32_t a1 = bf16x2_mul(lut_at(lut_lane, r1, 2 * sub), s1);
      const uint32_t a3 = bf16x2_mul(lut_at(lut_lane, r1, 2 * sub + 1), s1);
      mma_bf16(acc, a0, a1, a2, a3, sub == 0 ? b[j2].x : b[j2].z, sub == 0 ? b[j2].y : b[j2].w);
    }
  }
}

// Stages `rows` x rows of one expert chunk (grouped positions pos0 ..) as bf16 in shared memory, rows xld
// elements apart, in k order with the 16-byte pieces of every 64-byte group g in the order
// q ^ ((g >> 1) & 1) (moe_decode_config.h: xs_ld); threads tid = 0 .. nthreads - 1 take 4 k each a pass.
__device__ __forceinline__ void stage_x_rows(const MoeExpertsParams& p, int pos0, int rows, __nv_bfloat16* xs,
                                             int64_t xld, int tid, int nthreads) {
  const int row_quads = p.hidden / 4;
  for (int i = tid; i < rows * row_quads; i += nthreads) {
    const int r = i / row_quads, k = (i - r * row_quads) * 4;
    const int grp = k >> 5, q = ((k >> 3) & 3) ^ ((grp >> 1) & 1);
    const int64_t token = p.sorted_slots[pos0 + r] / p.top_k;
    const float4 v = __ldg(reinterpret_cast<const float4*>(p.x + token * p.ldx + k));
    __nv_bfloat162 pr[2] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
    *reinterpret_cast<uint2*>(xs + r * xld + grp * 32 + q * 8 + (k & 7)) =
        *reinterpret_cast<const uint2*>(pr);
  }
}

}  // namespace ms::cuda::moe_decode_dev
