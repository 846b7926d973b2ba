// The NVFP4 decode math the decode paths of the routed experts share (moe_experts_decode.cu: register and
// cp.async ring variants): one 32-k step of a 16-row mma tile in f16, the e2m1 codes turned into f16 by
// integer operations and the hardware's e4m3 conversion (no table), times the e4m3 block scales in f16
// (exact). The k order of a lane's 32 values and the fragment layout are described
// in moe_experts_decode.cu.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe/moe_device_common.cuh"

namespace ms::cuda::moe_decode_dev {

using dev::word_of;

// Every e2m1 value w (s e1 e0 m) is the e4m3 byte s << 7 | e1 e0 m << 2 times 2^6: the e2m1 exponent field
// lands in the low bits of e4m3's (bias 7 instead of 1) and the subnormal code (0.5) in e4m3's subnormals,
// so w x 2^-6 is exact and a normal f16 after the conversion. kCodeScale undoes the 2^-6 in the epilogues.
constexpr float kCodeScale = 64.f;

// The eight e2m1 codes of a weight word (code i in bits 4 i .. 4 i + 3) -> e4m3 bytes: lo holds codes 0, 2,
// 4, 6 (the low nibbles) in bytes 0..3, hi codes 1, 3, 5, 7. Seven integer operations a word.
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
  hi = (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu);
  lo = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1c1c1c1cu);
}

// Two e4m3 scale bytes (scale group h in byte h) -> (s0, s1) as f16x2 (exact: every e4m3 value is an f16).
__device__ __forceinline__ uint32_t scales_f16x2(uint32_t two) {
  return tc::fp8x2_to_f16x2(two);
}

// a x (s_h, s_h), s_h the f16 of half h (compile-time after inlining) of s: the product's operand selector
// broadcasts the half, so no permute builds (s_h, s_h) first.
__device__ __forceinline__ uint32_t f16x2_mul_half(uint32_t a, uint32_t s, int h) {
  uint32_t d;
  if (h == 0)
    asm("{\n.reg .b16 lo, hi;\n.reg .b32 b;\nmov.b32 {lo, hi}, %2;\nmov.b32 b, {lo, lo};\n"
        "mul.rn.f16x2 %0, %1, b;\n}\n"
        : "=r"(d)
        : "r"(a), "r"(s));
  else
    asm("{\n.reg .b16 lo, hi;\n.reg .b32 b;\nmov.b32 {lo, hi}, %2;\nmov.b32 b, {hi, hi};\n"
        "mul.rn.f16x2 %0, %1, b;\n}\n"
        : "=r"(d)
        : "r"(a), "r"(s));
  return d;
}

// The two mmas of word j2 of tile_step_split, with that word's B piece bj and its rows' two scales s0, s1
// (scales_f16x2: the word's scale group is j2 / 2).
__device__ __forceinline__ void word_mmas(float (&acc0)[4], float (&acc1)[4], const uint4& w0,
                                          const uint4& w1, uint32_t s0, uint32_t s1, int j2,
                                          const uint4& bj) {
  const int h = j2 >> 1;
  uint32_t lo0, hi0, lo1, hi1;
  e2m1x8_to_e4m3(word_of(w0, j2), lo0, hi0);
  e2m1x8_to_e4m3(word_of(w1, j2), lo1, hi1);
  const uint32_t a[4] = {
      f16x2_mul_half(tc::fp8x2_to_f16x2(lo0), s0, h), f16x2_mul_half(tc::fp8x2_to_f16x2(lo1), s1, h),
      f16x2_mul_half(tc::fp8x2_to_f16x2(hi0), s0, h), f16x2_mul_half(tc::fp8x2_to_f16x2(hi1), s1, h)};
  tc::mma_f16(acc0, a, bj.x, bj.y);
  const uint32_t a2[4] = {
      f16x2_mul_half(tc::fp8x2_hi_to_f16x2(lo0), s0, h), f16x2_mul_half(tc::fp8x2_hi_to_f16x2(lo1), s1, h),
      f16x2_mul_half(tc::fp8x2_hi_to_f16x2(hi0), s0, h), f16x2_mul_half(tc::fp8x2_hi_to_f16x2(hi1), s1, h)};
  tc::mma_f16(acc1, a2, bj.z, bj.w);
}

// word_mmas with the rows' two scale bytes sc0, sc1 (scale group h in byte h).
__device__ __forceinline__ void word_step_split(float (&acc0)[4], float (&acc1)[4], const uint4& w0,
                                                const uint4& w1, uint32_t sc0, uint32_t sc1, int j2,
                                                const uint4& bj) {
  word_mmas(acc0, acc1, w0, w1, scales_f16x2(sc0), scales_f16x2(sc1), j2, bj);
}

// tile_step with the two mmas of every word in two accumulator sets (mma 2 j2 into acc0, 2 j2 + 1 into
// acc1): two dependent chains of 4 mmas a step instead of one of 8. The caller adds the sets in a fixed
// order.
__device__ __forceinline__ void tile_step_split(float (&acc0)[4], float (&acc1)[4], const uint4& w0,
                                                const uint4& w1, uint32_t sc0, uint32_t sc1,
                                                const uint4 (&b)[4]) {
  const uint32_t s0 = scales_f16x2(sc0), s1 = scales_f16x2(sc1);
#pragma unroll
  for (int j2 = 0; j2 < 4; ++j2) word_mmas(acc0, acc1, w0, w1, s0, s1, j2, b[j2]);
}

// One 32-k step of one 16-row tile: weights w0 (row g), w1 (row g + 8), the rows' two e4m3 scale bytes sc0,
// sc1 (scale group h in byte h), B pieces b[4] (16 bytes each: mma 2 j2 and 2 j2 + 1, f16 in the order
// x0 x2 x1 x3 x4 x6 x5 x7 of their 8 k). Word j2 of a row gives mma 2 j2 (codes 0, 2 | 1, 3) and 2 j2 + 1
// (codes 4, 6 | 5, 7). The scale multiplies A before the mma (the four lanes of a quad hold different
// 16-k groups, so an mma's sum spans four scales): code x 2^-6 (two significant bits, exponent >= -7) times
// an e4m3 scale (four bits, exponent >= -9) has its lowest bit at or above 2^-20 and stays below 43, so the
// f16 product is exact, subnormal scales included (values x 2^-6, see kCodeScale). tile_step_split with one
// accumulator set: the same mmas in the same order.
__device__ __forceinline__ void tile_step(float (&acc)[4], const uint4& w0, const uint4& w1, uint32_t sc0,
                                          uint32_t sc1, const uint4 (&b)[4]) {
  tile_step_split(acc, acc, w0, w1, sc0, sc1, b);
}

// The sc8 scale exchange of one row inside a quad (lanes t = 0..3 of a warp, all 32 lanes calling): lane t
// holds `raw`, the quad's 8 scale bytes of step 4 b + t (lane u's 2 bytes in 16-bit element u; zero where
// that step does not exist); returns lane t's 2 bytes of steps 4 b + 0..3 in 16-bit elements 0..3 (x: steps
// 0, 1; y: 2, 3). A 4 x 4 transpose of 16-bit elements in two xor shuffles: across lanes t ^ 2 the 2 x 2
// blocks trade places, across t ^ 1 the elements inside them.
__device__ __forceinline__ uint2 quad_scales(uint2 raw, int t) {
  const int h = t >> 1, l = t & 1;
  const uint32_t keep = h ? raw.y : raw.x;                                  // steps t, elements 2 h, 2 h + 1
  const uint32_t got = __shfl_xor_sync(0xffffffffu, h ? raw.x : raw.y, 2);  // step t ^ 2, same elements
  const uint32_t mine = __byte_perm(keep, got, l ? 0x7632u : 0x5410u);      // element t of steps t, t ^ 2
  const uint32_t other = __shfl_xor_sync(0xffffffffu, __byte_perm(keep, got, l ? 0x5410u : 0x7632u), 1);
  const uint32_t a = l ? other : mine, c = l ? mine : other;  // steps (2 h, 2 h ^ 2), (2 h + 1, 2 h + 1 ^ 2)
  const uint32_t lo = __byte_perm(a, c, 0x5410u), hi = __byte_perm(a, c, 0x7632u);
  return h ? make_uint2(hi, lo) : make_uint2(lo, hi);
}

// Lane's 2 scale bytes of step j (0..3) of a quad_scales result, in bits 0..15.
__device__ __forceinline__ uint32_t quad_scale_of(const uint2& q, int j) {
  return ((j & 2) ? q.y : q.x) >> ((j & 1) * 16);
}

// Index of element i of a k range in the B order of tile_step: within every 4 elements, 1 and 2 trade places
// (an involution: the same function maps back).
__host__ __device__ constexpr int b_order(int i) {
  return (i & ~3) | ((i & 1) << 1) | ((i >> 1) & 1);
}

// Stages `rows` x rows of one expert chunk (grouped positions pos0 ..) as f16 (saturated) in shared memory,
// rows xld elements apart; threads tid = 0 .. nthreads - 1 take 4 k each a pass. kBOrder: in B order
// (b_order) with the 16-byte pieces of every 64-byte group g in the order q ^ ((g >> 1) & 1)
// (moe_decode_config.h: xs_ld), else in natural k order (moe_decode_fp8_config.h). kBatch > 1 (kernels with
// registers to spare while their first weight loads are in flight): a row's token is loaded once (the next
// row's while this one is staged), and a thread's pieces of a row go kBatch at a time, every load of a batch
// issued before its first store; kBatch 1: a piece at a time, its token and then its x. (With a token load
// and then an x load for every piece, one piece after another behind those weight loads, a one-token gate/up
// block of the tile variant spent 7.5 us before its k loop, H200.)
template <bool kBOrder, int kBatch>
__device__ __forceinline__ void stage_x_chunk(const MoeExpertsParams& p, int pos0, int rows, __half* xs,
                                              int64_t xld, int tid, int nthreads) {
  const int row_quads = p.hidden / 4;
  auto put = [&](__half* xsr, int k, const float4& v) {
    if constexpr (kBOrder) {
      const int grp = k >> 5, qq = ((k >> 3) & 3) ^ ((grp >> 1) & 1);
      *reinterpret_cast<uint2*>(xsr + grp * 32 + qq * 8 + (k & 7)) =
          make_uint2(tc::pack_f16_sat(v.x, v.z), tc::pack_f16_sat(v.y, v.w));  // x0 x2 x1 x3
    } else {
      *reinterpret_cast<uint2*>(xsr + k) = make_uint2(tc::pack_f16_sat(v.x, v.y), tc::pack_f16_sat(v.z, v.w));
    }
  };
  if constexpr (kBatch == 1) {  // one piece at a time (kernels with no register to spare)
    for (int i = tid; i < rows * row_quads; i += nthreads) {
      const int r = i / row_quads, k = (i - r * row_quads) * 4;
      const int64_t token = p.sorted_slots[pos0 + r] / p.top_k;
      put(xs + r * xld, k, __ldg(reinterpret_cast<const float4*>(p.x + token * p.ldx + k)));
    }
    return;
  }
  int tok = rows > 0 ? p.sorted_slots[pos0] / p.top_k : 0;
  for (int r = 0; r < rows; ++r) {
    const int tok_next = r + 1 < rows ? p.sorted_slots[pos0 + r + 1] / p.top_k : 0;
    const float* xr = p.x + static_cast<int64_t>(tok) * p.ldx;
    __half* xsr = xs + r * xld;
    for (int q0 = tid; q0 < row_quads; q0 += kBatch * nthreads) {
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int q = q0 + j * nthreads;
        if (q < row_quads) v[j] = __ldg(reinterpret_cast<const float4*>(xr + 4 * q));
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int q = q0 + j * nthreads;
        if (q < row_quads) put(xsr, 4 * q, v[j]);
      }
    }
    tok = tok_next;
  }
}

// The register kernels' x rows in B order (see stage_x_chunk).
template <int kBatch = 1>
__device__ __forceinline__ void stage_x_rows(const MoeExpertsParams& p, int pos0, int rows, __half* xs,
                                             int64_t xld, int tid, int nthreads) {
  stage_x_chunk<true, kBatch>(p, pos0, rows, xs, xld, tid, nthreads);
}

}  // namespace ms::cuda::moe_decode_dev
