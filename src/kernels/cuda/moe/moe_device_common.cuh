// Device pieces the two NVFP4 decode paths of the routed experts share (moe_experts_decode.cu,
// moe_experts_stream.cu): the e2m1 byte -> bf16x2 table replicated per lane, the (expert, chunk) work list
// each block builds from the plan's expert counts, bf16x2 bit access (the mma: tc::mma_bf16, mma_sm80.cuh),
// the shared-memory tiles in which the decode kernels (NVFP4 and FP8) meet their warps' partial sums; and the
// eight-code E2M1 -> bf16 expansion the tensor-core prefill kernels share (moe_experts_mma.cu,
// moe_experts_wgmma.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe/moe_decode_common.h"
#include "kernels/cuda/moe/moe_experts.h"

namespace ms::cuda::moe_dev {

constexpr unsigned kFull = 0xffffffffu;

// Signed E2M1 value of a 4-bit code (bit 3 = sign).
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t m = code & 7u;
  const float mag = m < 4u ? 0.5f * static_cast<float>(m)
                           : (m == 4u   ? 2.f
                              : m == 5u ? 3.f
                              : m == 6u ? 4.f
                                        : 6.f);
  return (code & 8u) ? -mag : mag;
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

using tc::mma_bf16;  // m16n8k16, bf16 operands, f32 accumulation

// A warp's m16n8 C fragment (acc: rows g / g + 8, positions 2t / 2t + 1) into a [position][16 rows] f32 tile:
// the layout in which the decode kernels meet their warps' partial sums.
__device__ __forceinline__ void store_c_tile(float* tile, const float (&acc)[4], int g, int t) {
  tile[(2 * t) * 16 + g] = acc[0];
  tile[(2 * t + 1) * 16 + g] = acc[1];
  tile[(2 * t) * 16 + g + 8] = acc[2];
  tile[(2 * t + 1) * 16 + g + 8] = acc[3];
}

// The gate / up sums of (position r, row i) over the warps' tiles red [warp][gate / up][chunk][16], in warp
// order.
template <int kWarps, int kChunk>
__device__ __forceinline__ float2 sum_gate_up_tiles(const float* red, int r, int i) {
  float gs = 0.f, us = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    gs += red[(w * 2 * kChunk + r) * 16 + i];
    us += red[((w * 2 + 1) * kChunk + r) * 16 + i];
  }
  return make_float2(gs, us);
}

// lut [256][32] u32: entry e of lane l at word e * 32 + l (a warp's lookups are conflict-free): the bf16 pair
// (low nibble, high nibble) of byte e, each value times `scale` (a power of two the paths pick so the product
// with their scale encoding is exact). Every thread of the block (kThreads) takes part; the caller syncs.
template <int kThreads>
__device__ __forceinline__ void build_e2m1_lut(uint32_t* lut, float scale) {
  uint4* l4 = reinterpret_cast<uint4*>(lut);
  for (int i = threadIdx.x; i < 256 * 8; i += kThreads) {
    const uint32_t e = static_cast<uint32_t>(i) >> 3;
    const uint32_t v =
        bf16x2_bits(__floats2bfloat162_rn(e2m1_value(e & 15u) * scale, e2m1_value(e >> 4) * scale));
    l4[i] = make_uint4(v, v, v, v);
  }
}

// ec [kMaxEc]: (expert | chunk << 10) for every touched expert in ascending id, chunks of `chunk` positions
// (an expert with more positions than a pass holds takes several). Warp 0 writes the list and its length *n
// (at most kMaxEc); the caller syncs. Lane l takes the contiguous experts [l per, (l + 1) per) and loads all
// their counts at once (one memory latency for the whole list, not one per 32 experts: this runs before
// any weight load of the decode kernels).
template <int kMaxEc>
__device__ __forceinline__ void build_ec(const MoeExpertsParams& p, int chunk, int32_t* ec, int* n) {
  if (threadIdx.x >= 32) return;
  constexpr int kPer =
      moe_decode_common::kMaxExperts / 32;  // experts a lane may hold (n_experts <= kMaxExperts)
  const int lane = threadIdx.x;
  const int per = (p.n_experts + 31) / 32;
  const int e0 = lane * per;
  int ch[kPer];
  int run = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = e0 + i;
    const int cnt = i < per && e < p.n_experts ? p.expert_counts[e] : 0;
    ch[i] = cnt > 0 ? (cnt + chunk - 1) / chunk : 0;
    run += ch[i];
  }
  int incl = run;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += v;
  }
  int start = incl - run;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    for (int c = 0; c < ch[i]; ++c, ++start)
      if (start < kMaxEc) ec[start] = (e0 + i) | (c << 10);
  if (lane == 31) *n = min(incl, kMaxEc);
}

// The B row (grouped position of a chunk of `rows`) lane (g, t) reads: its own, g, where the chunk has it,
// else row 0's. The mma columns of positions past the chunk then repeat position 0's sums, which no epilogue
// reads, and every lane loads: a zero fill for the lanes past the chunk compiles to a divergent branch around
// each B load (at one position a chunk, 28 of 32 lanes on the other side of it).
__device__ __forceinline__ int b_row(int g, int rows) {
  return g < rows ? g : 0;
}

// Work-list entry `want` of build_ec's list (same order), without keeping the list: its code into *code
// (unwritten when the list is shorter) and the list's length into *n. One warp (threads 0..31) calls it.
__device__ __forceinline__ void find_ec(const MoeExpertsParams& p, int chunk, int want, int* code, int* n) {
  constexpr int kPer = moe_decode_common::kMaxExperts / 32;
  const int lane = threadIdx.x;
  const int per = (p.n_experts + 31) / 32;
  const int e0 = lane * per;
  int ch[kPer];
  int run = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = e0 + i;
    const int cnt = i < per && e < p.n_experts ? p.expert_counts[e] : 0;
    ch[i] = cnt > 0 ? (cnt + chunk - 1) / chunk : 0;
    run += ch[i];
  }
  int incl = run;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += v;
  }
  if (want >= incl - run && want < incl) {
    int start = incl - run;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (want >= start && want < start + ch[i]) *code = (e0 + i) | ((want - start) << 10);
      start += ch[i];
    }
  }
  if (lane == 31) *n = min(incl, moe_decode_common::kMaxEc);
}

// ---- the register-streamed decode kernels (moe_experts_decode.cu: NVFP4, moe_experts_decode_fp8.cu: FP8) --
// Their work split and shared-memory layouts (moe_decode_common.h); they differ in how a weight step is
// loaded and decoded, not in how items, pieces and positions are found.

// The first of part i of [0, n) cut into `parts` contiguous runs (part `parts`: n): a block's run of work
// items over the grid (i = blockIdx.x, parts = gridDim.x) or a warp's run of down pieces.
template <typename I, typename P>
__device__ __forceinline__ int run_start(int n, I i, P parts) {
  return static_cast<int>(static_cast<int64_t>(n) * i / parts);
}

// Work-list entry `code` (build_ec's expert | chunk << 10, chunks of `chunk` positions): its expert, its
// positions (1 .. chunk) and its first grouped position.
struct EcEntry {
  int e, rows, pos0;
};
__device__ __forceinline__ EcEntry ec_entry(const MoeExpertsParams& p, int code, int chunk) {
  EcEntry r;
  r.e = code & 1023;
  const int c = code >> 10;
  const int count = p.expert_counts[r.e], off = p.expert_offsets[r.e];
  r.rows = min(chunk, count - c * chunk);
  r.pos0 = off + c * chunk;
  return r;
}

// gate_up's shared memory (moe_decode_common.h: gate_up_smem_ld): xs [x_rows][xld] f16 | red [8 warps][2
// gate/up][8 positions][16 rows] f32 | ec [kMaxEc] (| the NVFP4 ring's slots after ec).
__device__ __forceinline__ void carve_gate_up(uint8_t* smem, int x_rows, int64_t xld, __half*& xs,
                                              float*& red, int32_t*& ec) {
  using namespace moe_decode_common;
  xs = reinterpret_cast<__half*>(smem);
  red = reinterpret_cast<float*>(smem + static_cast<size_t>(x_rows) * xld * 2);
  ec = reinterpret_cast<int32_t*>(red + kWarps * 2 * kChunk * 16);
}

// down's shared memory (moe_decode_common.h: down_smem): out_w [4 warps][m][16] f32 | scr [4 warps][8
// positions][16] f32 | ec [kMaxEc] (| the NVFP4 ring's slots after ec).
__device__ __forceinline__ void carve_down(uint8_t* smem, int m, float*& out_w, float*& scr, int32_t*& ec) {
  using namespace moe_decode_common;
  out_w = reinterpret_cast<float*>(smem);
  scr = out_w + kDownWarps * m * kDownRows;
  ec = reinterpret_cast<int32_t*>(scr + kDownWarps * kChunk * kDownRows);
}

// down, at a chunk change of a warp: its sum acc (C fragment of rows g / g + 8, positions 2t / 2t + 1; times
// s when kScaled) into its tile out_ww [m][16] through its scratch tile scr_w [8 positions][16]. Positions in
// order: a token met twice (a repeated expert in its top-k) adds in a fixed order.
template <bool kScaled>
__device__ __forceinline__ void flush_down_chunk(const MoeExpertsParams& p, const float (&acc)[4],
                                                 float* scr_w, float* out_ww, int rows, int pos0, float s,
                                                 int lane, int g, int t) {
  constexpr int kDownRows = moe_decode_common::kDownRows;
  store_c_tile(scr_w, acc, g, t);
  __syncwarp();
  if (lane < kDownRows) {
    for (int q = 0; q < rows; ++q) {
      const int tok = p.sorted_slots[pos0 + q] / p.top_k;
      if constexpr (kScaled)
        out_ww[tok * kDownRows + lane] += scr_w[q * 16 + lane] * s;
      else
        out_ww[tok * kDownRows + lane] += scr_w[q * 16 + lane];
    }
  }
  __syncwarp();
}

// down, after the block's barrier: out rows row0 .. + 15 of every token += the sum of the warps' tiles
// out_w [kW warps][m][16], in warp order. Thread tid of the block's 32 kW.
template <int kW = moe_decode_common::kDownWarps>
__device__ __forceinline__ void add_down_tiles(const MoeExpertsParams& p, const float* out_w, int m, int row0,
                                               int tid) {
  using namespace moe_decode_common;
  for (int i = tid; i < m * kDownRows; i += 32 * kW) {
    float sum = 0.f;
#pragma unroll
    for (int w2 = 0; w2 < kW; ++w2) sum += out_w[w2 * m * kDownRows + i];
    float* o = p.out + static_cast<int64_t>(i / kDownRows) * p.ldo + row0 + (i % kDownRows);
    *o += sum;
  }
}

__device__ __forceinline__ float fp8_e4m3_value(uint32_t byte) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  return __half2float(__half(h));
}

// Eight E2M1 codes (element 2i in the low nibble of byte i) -> four bf16x2 (elements 0,1 | 2,3 | 4,5 | 6,7),
// each times `s`. The magnitude (code & 7) is looked up by byte permutes in two 8-byte tables (bf16 of 0,
// 0.5, 1, 1.5, 2, 3, 4, 6 split into its high and low byte; every low byte's low 6 bits are 0), the pair is
// interleaved, then the sign bit (code bit 3) is moved to bit 15 / 31. Selector nibbles never have bit 3
// set (byte_perm reads the low 3 bits).
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t w, __nv_bfloat162 s) {
  constexpr uint32_t kHiA = 0x3F3F3F00u, kHiB = 0x40404040u;  // high bytes of codes 0..3, 4..7
  constexpr uint32_t kLoA = 0xC0800000u, kLoB = 0xC0804000u;  // low bytes
  const uint32_t w4 = w << 4;  // byte i bit 7 = sign of element 2i (bit 3 of byte i of w)
  uint32_t out[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t sel = (w >> (16 * h)) & 0x7777u;  // magnitudes of elements 4h .. 4h + 3
    const uint32_t hi = __byte_perm(kHiA, kHiB, sel);
    const uint32_t lo = __byte_perm(kLoA, kLoB, sel);
    out[2 * h] = __byte_perm(lo, hi, 0x5140);      // [lo0, hi0, lo1, hi1]
    out[2 * h + 1] = __byte_perm(lo, hi, 0x7362);  // [lo2, hi2, lo3, hi3]
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // byte 1 <- byte i of w4 (sign of element 2i at bit 15), byte 3 <- byte i of w (element 2i + 1, bit 31)
    const uint32_t sign = __byte_perm(w4, w, static_cast<uint32_t>(((4 + i) << 12) | (i << 4)));
    out[i] |= sign & 0x80008000u;
  }
  uint4 r;
  uint32_t* rp = &r.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&out[i]);
    v = __hmul2(v, s);
    rp[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return r;
}

// Eight e4m3 values (element i in byte i of w0 for i < 4, of w1 for i >= 4) -> four bf16x2, each bf16(value *
// s). e4m3 -> f16 is exact (the hardware pair conversion), f16 -> f32 exact, so the only rounding is the
// f32 product's and then bf16's: the CPU dequantiser's value (e4m3 * scale in f32), rounded once to bf16.
__device__ __forceinline__ uint4 e4m3x8_to_bf16(uint32_t w0, uint32_t w1, float s) {
  uint4 r;
  uint32_t* rp = &r.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = i < 2 ? w0 : w1;
    const auto pair = static_cast<__nv_fp8x2_storage_t>((w >> (16 * (i & 1))) & 0xffffu);
    const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));  // .x = the low byte's value
    const float2 f = __half22float2(h);
    rp[i] = bf16x2_bits(__floats2bfloat162_rn(f.x * s, f.y * s));
  }
  return r;
}

// Where 16-byte piece i (0 .. 3) of row r of a raw FP8Block stage ([rows][64] e4m3) lies: rows of 64 bytes,
// pieces rotated by (r / 2) % 4, so the 8 rows one quarter warp reads (rows r .. r + 7, one piece each) hit
// 8 different 16-byte bank groups (unrotated, row stride 64 puts them on 2).
__device__ __forceinline__ int fp8_raw_offset(int r, int i) {
  return r * 64 + ((i ^ ((r >> 1) & 3)) << 4);
}

// The grouped GEMMs' work list (moe_experts_mma.cu, moe_experts_wgmma.cu): expert e has ceil(counts[e] / BM)
// M tiles; s_mt[e] = the M tiles of experts before e, s_mt[n_experts] = all of them. Block-wide (kThreads
// threads, each summing a contiguous run of experts); s_warp: kThreads / 32 ints of scratch. Ends with a
// barrier, after which s_mt is visible to the whole block.
template <int kThreads, int BM>
__device__ __forceinline__ void m_tile_prefix(const int32_t* counts, int n_experts, int32_t* s_mt,
                                              int32_t* s_warp) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (n_experts + kThreads - 1) / kThreads;
  const int e0 = min(tid * per, n_experts), e1 = min(e0 + per, n_experts);
  int run = 0;
  for (int e = e0; e < e1; ++e) run += (counts[e] + BM - 1) / BM;
  int incl = run;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += s_warp[w];
  int off = before + incl - run;
  for (int e = e0; e < e1; ++e) {
    s_mt[e] = off;
    off += (counts[e] + BM - 1) / BM;
  }
  if (tid == kThreads - 1) s_mt[n_experts] = off;
  __syncthreads();
}

// The expert of M-tile index q (the largest e with s_mt[e] <= q), by binary search over m_tile_prefix's list.
__device__ __forceinline__ int expert_of_m_tile(int q, const int32_t* s_mt, int n_experts) {
  int lo = 0, hi = n_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (s_mt[mid] <= q)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace ms::cuda::moe_dev
