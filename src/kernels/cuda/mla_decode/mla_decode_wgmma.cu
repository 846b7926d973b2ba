// Warpgroup-MMA MLA decode (see mla_decode_wgmma.h): split pass and log-sum-exp combine pass.
//
// Split pass, one block = (split, head group, sequence), 384 threads: warp 8 is the producer (warps 9-11
// only lend it its warpgroup for setmaxnreg), warps 0-7 are two consumer warpgroups (WG 0, WG 1) that take
// alternate 64-key tiles of the split, each in a tile buffer of its own (the seesaw schedule, described at
// mla_wgmma_split_seesaw). Rows r = j * hb + local head (query token j), padded to 64.
//   producer: per tile of 64 keys, waits until the owner warpgroup's buffer region is free, then
//     bulk-copies the tile's raw fp8 rows (one copy of the whole tile when pages hold a multiple of 64
//     tokens, else one 576-byte copy per row, page looked up per key) into it, completing on the buffer's
//     mbarrier `full` with the byte count of the rows that exist. Rows past the sequence are not copied.
//   consumers, per tile: widen the raw tile to f16 in place (exact: e4m3 is a subset of f16; rows past the
//     sequence are written as zeros, so NaN bytes of page tails or stale rows never reach the math); S = Q
//     K^T over the whole tile (wgmma m64n64k16, Q and K from shared memory); online softmax in registers
//     (scores pre-scaled by softmax_scale * kv_scale * log2 e, masked by the row's position and the tile's
//     valid rows), P = exp2(s - m) packed to f16 straight into A fragments; the row maxima and P exchanged
//     between the warpgroups so that both hold the same running maximum; each warpgroup accumulates its 256
//     output columns of O = corr * O + P V over both warpgroups' tiles (4 x wgmma m64n256k16, P from
//     registers, V the first 512 columns of the widened tiles as an MN-major B operand). O is 64 x 256 f32
//     per warpgroup = 128 registers a thread.
// Every mbarrier wait is bounded (wg::mbar_wait_bounded, common/wgmma_sm90.cuh): one that has not completed
// after about 4 s records the block, thread, barrier and parity in mapped host memory and traps;
// mla_decode_wgmma_hang_report() (and stderr at exit) names it.
// (A first schedule, with both warpgroups widening every tile and S split over the keys by m64n32k16, was
// 1.07-1.17x slower on an H200 with identical outputs and is gone; docs/PERFORMANCE.md has the figures.)
#include "kernels/cuda/mla_decode/mla_decode_wgmma.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/mla_decode/mla_split.cuh"
#include "kernels/cuda/mla_decode/mla_wgmma.cuh"

namespace ms::cuda {
namespace {

using namespace mla_wgmma;
using namespace mla_wgmma_ptx;
using bf16 = __nv_bfloat16;
MbarTimeout* host_hang = nullptr;  // the host view of hang_record(), once allocated

[[maybe_unused]] constexpr float kLog2e = 1.4426950408889634f;
[[maybe_unused]] constexpr uint32_t kBlockBytes = 64 * 128;  // one swizzled block: 64 lines x 64 f16
// The named barriers (1 is the consumers' 256-thread barrier): WG 0's
// maxima and P published (WG 0 arrives, WG 1 waits), WG 1's (the reverse), and one per warpgroup (128).
constexpr int kSeesawBarPub0 = 2, kSeesawBarPub1 = 3, kSeesawBarWg = 4;
// The mbarriers in hang records: full[w] = 8 + w, land_free[w] = 10 + w, other_free[w] = 12 + w.
constexpr uint32_t kSeesawBarBase = 8;
// Its key tile buffers (see mla_decode_wgmma_split_seesaw): the owner region, 8 groups of 8 keys x 5 atoms
// (rope, then the owner's four 64-column blocks), then the other region's four dense 64-column blocks.
constexpr uint32_t kAtomBytes = 1024;  // 8 lines x 128 bytes
constexpr uint32_t kSwGroupBytes = 5 * kAtomBytes;
constexpr uint32_t kSwOtherOff = 8 * kSwGroupBytes;
static_assert(kSwOtherOff >= kRawBytes && kSwOtherOff + 4 * kBlockBytes == kKBytes,
              "the raw tile lands in the owner region; the two regions fill the buffer");
// Registers a thread: 2 x 128 x 232 + 128 x 40 = 64512 of the 65536. A consumer holds O (128), S (16), the P
// fragments (16) and addressing.
[[maybe_unused]] constexpr int kConsumerRegs = 232;
[[maybe_unused]] constexpr int kProducerRegs = 40;
// setmaxnreg moves registers between the warpgroups of the block: every warpgroup must be complete (a partial
// one never finishes its setmaxnreg), and the budgets must fit in what the block is launched with (ptxas
// gives the kernel 65536 / 384 = 168 a thread); an .inc that cannot be served waits for ever.
static_assert(kThreads == 384, "two consumer warpgroups and one producer warpgroup");
static_assert(2 * 128 * kConsumerRegs + 128 * kProducerRegs <= (65536 / kThreads) / 8 * 8 * kThreads,
              "the register budgets exceed what a block of kThreads threads can be given");

__device__ __forceinline__ int unit_keys(const MlaDecodeSm90Params& p, int u) {
  return min(max(p.seq_lens[u], 0), p.block_table_stride * p.page_size);
}

// Tiles per split, the same in every block of both passes: the longest sequence's tiles over max_splits, at
// least min_tiles. `red` holds one int per warp; contains a __syncthreads.
__device__ int tiles_per_split(const MlaDecodeSm90Params& p, int max_splits, int min_tiles, int* red) {
  int mk = 0;
  for (int b = threadIdx.x; b < p.n_seqs; b += blockDim.x) mk = max(mk, unit_keys(p, b));
  mk = __reduce_max_sync(0xffffffffu, mk);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mk;
  __syncthreads();
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) mk = max(mk, red[w]);
  const int tiles = (mk + kTileKeys - 1) / kTileKeys;
  return max(min_tiles, (tiles + max_splits - 1) / max_splits);
}

__device__ __forceinline__ int unit_splits(int keys, int tps) {
  return mla_split::unit_splits<kTileKeys>(keys, tps);
}

#if MS_MLA_WGMMA_ENABLED
// Eight values (f32 or bf16) -> eight f16, saturated, as one 16-byte store's worth.
__device__ __forceinline__ uint4 load_q8(const MlaDecodeSm90Params& p, int64_t off) {
  if (p.q_bf16) {
    const uint4 r = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.q) + off));
    auto cv = [](uint32_t x) {
      return tc::pack_f16_sat(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    };
    return make_uint4(cv(r.x), cv(r.y), cv(r.z), cv(r.w));
  }
  const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + off);
  const float4 a = __ldg(f), b = __ldg(f + 1);
  return make_uint4(tc::pack_f16_sat(a.x, a.y), tc::pack_f16_sat(a.z, a.w), tc::pack_f16_sat(b.x, b.y),
                    tc::pack_f16_sat(b.z, b.w));
}
#endif

#if MS_MLA_WGMMA_ENABLED
// The end of the split pass: row sums over the quad and over the two warpgroups (through `scratch`, [2][64]
// f32, free once named barrier 1 has been passed), then this warpgroup's 256 output columns of rows row0 and
// row0 + 8, to the output (one split) or to the split's partial row and log-sum-exp.
__device__ __forceinline__ void write_rows(const MlaDecodeSm90Params& p, int hb, int hg, int u, int split,
                                           int nsplit, int max_splits, int wg, const float (&o)[128],
                                           float l0, float l1, float m_run0, float m_run1, float* scratch,
                                           float* __restrict__ part, float* __restrict__ lse) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
  const int row0 = 16 * (warp & 3) + (lane >> 2), row1 = row0 + 8;
  const int qu = p.q_per_seq;
  auto row_token = [&](int r, int& token, int& head) {
    head = hg * hb + r % hb;
    token = u * qu + r / hb;
    return r < hb * qu && head < p.heads;
  };
  float* rowmax_s = scratch;
  // Over the quad, then over the two warpgroups.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  named_barrier(1, 256);  // the last tile's maxima have been read
  if (t == 0) {
    rowmax_s[wg * kRows + row0] = l0;
    rowmax_s[wg * kRows + row1] = l1;
  }
  named_barrier(1, 256);
  l0 += rowmax_s[(1 - wg) * kRows + row0];
  l1 += rowmax_s[(1 - wg) * kRows + row1];

  const int rows_per_unit = qu * p.heads;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = hf ? row1 : row0;
    const float l = hf ? l1 : l0, m = hf ? m_run1 : m_run0;
    int token, head;
    if (!row_token(r, token, head)) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (nsplit == 1) {
      const int64_t base =
          token * p.out_token_stride + static_cast<int64_t>(head) * kLatent + 256 * wg + 2 * t;
      const float f = inv * p.kv_scale;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float x = o[4 * j + 2 * hf] * f, y = o[4 * j + 2 * hf + 1] * f;
        if (p.out_bf16)
          *reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.out) + base + 8 * j) = tc::pack_bf16(x, y);
        else
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + base + 8 * j) = make_float2(x, y);
      }
    } else {
      const int row_id = (r / hb) * p.heads + head;
      const size_t slot = (static_cast<size_t>(u) * max_splits + split) * rows_per_unit + row_id;
      float* dst = part + slot * kLatent + 256 * wg + 2 * t;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
      if (wg == 0 && t == 0) lse[slot] = l > 0.f ? m + log2f(l) : -INFINITY;
    }
  }
}
#endif

#if MS_MLA_WGMMA_ENABLED
// 2^(from - to) for running maxima from <= to; 1 while the row has seen no key (to = -inf: O and l are 0).
__device__ __forceinline__ float rescale(float from, float to) {
  return to == -INFINITY ? 1.f : exp2f(from - to);
}

// Widens 16 fp8 e4m3 to 16 f16 (exact) and stores them as two swizzled 16-byte chunks of block `blk`.
__device__ __forceinline__ void widen_store(unsigned char* blk, int line, int e0, uint4 v) {
  const uint4 lo = make_uint4(tc::fp8x2_to_f16x2(v.x), tc::fp8x2_to_f16x2(v.x >> 16), tc::fp8x2_to_f16x2(v.y),
                              tc::fp8x2_to_f16x2(v.y >> 16));
  const uint4 hi = make_uint4(tc::fp8x2_to_f16x2(v.z), tc::fp8x2_to_f16x2(v.z >> 16), tc::fp8x2_to_f16x2(v.w),
                              tc::fp8x2_to_f16x2(v.w >> 16));
  *reinterpret_cast<uint4*>(blk + swizzle128_offset(line, e0)) = lo;
  *reinterpret_cast<uint4*>(blk + swizzle128_offset(line, e0 + 8)) = hi;
}

// Masks and scales a 64-key S accumulator (s[4 j + e]: row0, key 8 j + 2 t + e; s[4 j + 2 + e]: row1) and
// returns the rows' maxima over the quad.
__device__ __forceinline__ void mask_scores(float (&s)[32], int t, int valid, int k0, int rp0, int rp1,
                                            float scale, float& mx0, float& mx1) {
  mx0 = -INFINITY;
  mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = 8 * j + 2 * t + e;
      const bool in = key < valid;
      const float a = in && k0 + key <= rp0 ? s[4 * j + e] * scale : -INFINITY;
      const float b = in && k0 + key <= rp1 ? s[4 * j + 2 + e] * scale : -INFINITY;
      s[4 * j + e] = a;
      s[4 * j + 2 + e] = b;
      mx0 = fmaxf(mx0, a);
      mx1 = fmaxf(mx1, b);
    }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// P = 2^(s - m) in place (m = -inf: no key yet, P = 0), its row sums over this thread's keys, and the A
// fragments of the four k steps of P V (step kk: keys 16 kk..16 kk + 15).
__device__ __forceinline__ void exp_pack(float (&s)[32], float m0, float m1, float& sum0, float& sum1,
                                         uint32_t (&a)[4][4]) {
  const float mu0 = m0 == -INFINITY ? 0.f : m0, mu1 = m1 == -INFINITY ? 0.f : m1;
  sum0 = 0.f;
  sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[4 * j + e] = exp2f(s[4 * j + e] - mu0);
      s[4 * j + 2 + e] = exp2f(s[4 * j + 2 + e] - mu1);
      sum0 += s[4 * j + e];
      sum1 += s[4 * j + 2 + e];
    }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const int j0 = 2 * kk, j1 = 2 * kk + 1;
    a[kk][0] = tc::pack_f16_sat(s[4 * j0], s[4 * j0 + 1]);
    a[kk][1] = tc::pack_f16_sat(s[4 * j0 + 2], s[4 * j0 + 3]);
    a[kk][2] = tc::pack_f16_sat(s[4 * j1], s[4 * j1 + 1]);
    a[kk][3] = tc::pack_f16_sat(s[4 * j1 + 2], s[4 * j1 + 3]);
  }
}

// Multiplies an f16x2 A fragment's row0 halves (a[.][0], a[.][2]) by c0 and its row1 halves by c1.
__device__ __forceinline__ void scale_frag(uint32_t (&a)[4][4], float c0, float c1) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float c = (x & 1) ? c1 : c0;
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&a[kk][x]));
      a[kk][x] = tc::pack_f16_sat(f.x * c, f.y * c);
    }
}

__device__ __forceinline__ void scale_o(float (&o)[128], float c0, float c1) {
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] *= (j & 2) ? c1 : c0;
}

// O[64, 256 columns] += P[64, 64 keys] V[64 keys, 256 columns]: four k steps of 16 keys (two groups of 8
// key lines, `group_bytes` apart), V MN-major from `v_desc`.
__device__ __forceinline__ void pv_tile(float (&o)[128], const uint32_t (&a)[4][4], uint64_t v_desc,
                                        uint32_t group_bytes) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_rs_m64n256k16_f16<1>(o, a[kk], v_desc + ((kk * 2 * group_bytes) >> 4), 1);
}
#endif

// The seesaw schedule: the consumer warpgroups take alternate tiles of the split (WG w: local tiles 2 n + w,
// round n), each tile in its own buffer B_w, so that one warpgroup's softmax and widening run while the
// other's MMAs do.
//   Buffer (73,728 bytes, 128-byte swizzle, 1,024-byte atoms of 8 key lines x 64 columns): the owner
//   region (bytes 0..40,959: 8 groups of 8 keys, each 5 atoms: rope columns 512-575, then the owner's 256
//   output columns 256 w..) and the other region (40,960..: four dense blocks of 64 keys x 64 columns, the
//   other warpgroup's 256). The producer copies the raw fp8 tile (36,864 bytes) into the owner region as
//   soon as the owner has finished its S and its own half of P V (mbarrier land_free[w]), while the other
//   warpgroup may still read the other region (released by mbarrier other_free[w]). The owner widens in
//   place: first the other half's columns into the other region, then the owner region in two halves of
//   four 8-key groups, the last half first (see the widening below).
//   Per round, with m the common running row maximum before it:
//     WG 0: S0 = Q K0^T (m64n64k16, Q and K0 from shared memory, 36 steps); m_a = max(m, rowmax S0);
//           P0 = 2^(S0 - m_a); publishes m_a and P0 (f16 fragments, 8 KB) and signals (named barrier 2);
//           O_L = O_L 2^(m - m_a) + P0 V0[:, 0:256]; waits for WG 1's m_b and P1 (named barrier 3);
//           O_L = O_L 2^(m_a - m_b) + P1 V1[:, 0:256]; m = m_b.
//     WG 1: S1 = Q K1^T; waits for m_a, P0; m_b = max(m_a, rowmax S1); P1 = 2^(S1 - m_b); publishes m_b, P1;
//           O_R = O_R 2^(m - m_b) + (P0 2^(m_a - m_b)) V0[:, 256:512] + P1 V1[:, 256:512]; m = m_b.
//   Both warpgroups thus hold the same m after each round; their row sums (WG 0 of the even tiles, WG 1 of
//   the odd ones, both relative to m) are added at the end. A round without an odd tile (odd tile count):
//   WG 1 has no S, P1 = 0, and nobody multiplies B1's stale contents.
// Shared-memory reads per 64-key tile: Q 72 KB once (N = 64), K 72 KB, V 64 KB (each half once).
__global__ void __launch_bounds__(kThreads, 1)
    mla_wgmma_split_seesaw(MlaDecodeSm90Params p, int hb, int max_splits, int min_tiles,
                           float* __restrict__ part, float* __restrict__ lse,
                           MbarTimeout* __restrict__ hang) {
  dev::grid_dep_enter();
#if MS_MLA_WGMMA_ENABLED
  extern __shared__ uint4 smem_dyn[];
  unsigned char* sm =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_dyn) + 1023) / 1024 * 1024);
  unsigned char* q_s = sm;                                        // [9 blocks][64 rows][64] f16, swizzled
  unsigned char* bufs = sm + kSwOffB0;                            // B_w = bufs + w * kKBytes
  uint32_t* px = reinterpret_cast<uint32_t*>(sm + kSwOffPx);      // [4][128 threads][4] f16x2
  float* rowmax_s = reinterpret_cast<float*>(sm + kSwOffRowMax);  // [2][64]: m_a, m_b
  int* rowpos_s = reinterpret_cast<int*>(sm + kSwOffRowPos);      // [64]
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + kSwOffBars);  // [2]: B_w's raw tile has landed
  uint64_t* land_free = full + 2;                                 // [2]: B_w owner region free
  uint64_t* other_free = full + 4;                                // [2]: B_w other region free (other WG)
  int* red = reinterpret_cast<int*>(sm + kSwOffRed);              // [16]

  const int split = blockIdx.x, hg = blockIdx.y, u = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tps = tiles_per_split(p, max_splits, min_tiles, red);
  const int keys = unit_keys(p, u);
  const int nsplit = unit_splits(keys, tps);
  if (split >= nsplit) return;
  const int total_tiles = (keys + kTileKeys - 1) / kTileKeys;
  const int tile_begin = split * tps;
  const int ntiles = max(0, min(total_tiles, tile_begin + tps) - tile_begin);
  const int qu = p.q_per_seq;
  const int32_t* table = p.block_table + static_cast<int64_t>(u) * p.block_table_stride;

  auto row_token = [&](int r, int& token, int& head) {
    head = hg * hb + r % hb;
    token = u * qu + r / hb;
    return r < hb * qu && head < p.heads;
  };
  if (tid < kRows) {
    int token, head;
    rowpos_s[tid] = row_token(tid, token, head) ? p.positions[token] : -1;
  }
  for (int i = tid; i < kRows * (kDim / 8); i += kThreads) {
    const int r = i / (kDim / 8), c8 = i % (kDim / 8);
    int token, head;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row_token(r, token, head))
      v = load_q8(p, token * p.q_token_stride + static_cast<int64_t>(head) * kDim + c8 * 8);
    *reinterpret_cast<uint4*>(q_s + (c8 / 8) * kBlockBytes + swizzle128_offset(r, (c8 % 8) * 8)) = v;
  }
  if (tid == 0) {
    for (int w = 0; w < 2; ++w) {
      mbar_init(full + w, 1);
      mbar_init(land_free + w, 4);   // one arrival per warp of the owner
      mbar_init(other_free + w, 4);  // one arrival per warp of the other warpgroup
    }
    mbar_init_fence();
  }
  fence_proxy_async();  // Q's stores, for the wgmma reads
  __syncthreads();

  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  if (warp >= 8) {  // the producer warpgroup: warp 8 copies, warps 9-11 only give their registers up
    regs_dealloc<kProducerRegs>();
    if (warp > 8) return;
    const bool whole_tiles = p.page_size % kTileKeys == 0;
    for (int T = 0; T < ntiles; ++T) {
      const int w = T & 1, n = T >> 1;
      if (n > 0) mbar_wait_bounded(land_free + w, (n - 1) & 1, kSeesawBarBase + 2 + w, hang);
      const int k0 = (tile_begin + T) * kTileKeys;
      const int valid = min(kTileKeys, keys - k0);
      unsigned char* dst = bufs + w * kKBytes;
      if (lane == 0) mbar_arrive_expect_tx(full + w, static_cast<uint32_t>(valid * kDim));
      __syncwarp();
      if (whole_tiles) {
        if (lane == 0) {
          const int page = min(max(__ldg(table + k0 / p.page_size), 0), p.num_pages - 1);
          const int64_t row = static_cast<int64_t>(page) * p.page_size + k0 % p.page_size;
          bulk_copy_g2s(dst, kv + row * kDim, static_cast<uint32_t>(valid * kDim), full + w);
        }
      } else {
        for (int r = lane; r < valid; r += 32) {
          const int pos = k0 + r;
          const int page = min(max(__ldg(table + pos / p.page_size), 0), p.num_pages - 1);
          const int64_t row = static_cast<int64_t>(page) * p.page_size + pos % p.page_size;
          bulk_copy_g2s(dst + r * kDim, kv + row * kDim, kDim, full + w);
        }
      }
    }
    return;
  }

  // Consumers.
  regs_alloc<kConsumerRegs>();
  const int wg = tid >> 7, ltid = tid & 127, t = lane & 3;
  const int row0 = 16 * (warp & 3) + (lane >> 2), row1 = row0 + 8;
  const int rp0 = rowpos_s[row0], rp1 = rowpos_s[row1];
  const float score_scale = p.softmax_scale * p.kv_scale * kLog2e;
  unsigned char* own = bufs + wg * kKBytes;
  const unsigned char* other = bufs + (1 - wg) * kKBytes;
  // This warpgroup's 256 V columns (MN-major: keys x dims): atoms 1-4 of its own buffer's owner region
  // (next 64 dims one atom on, next 8 keys one group on), the other buffer's dense blocks (next 64 dims
  // one block on, next 8 keys 1,024 bytes on).
  const uint64_t v_own = desc_sw128(own + kAtomBytes, kAtomBytes, kSwGroupBytes);
  const uint64_t v_oth = desc_sw128(other + kSwOtherOff, kBlockBytes, 1024);
  uint4* px4 = reinterpret_cast<uint4*>(px);  // [4 k steps][128 threads]: conflict-free 16-byte accesses

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run0 = -INFINITY, m_run1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  const int rounds = (ntiles + 1) / 2;
  for (int n = 0; n < rounds; ++n) {
    const int tile = 2 * n + wg;  // the own tile of this round
    const bool has_own = tile < ntiles, has_other = 2 * n + 1 - wg < ntiles;
    const int k0 = (tile_begin + tile) * kTileKeys;
    const int valid = has_own ? min(kTileKeys, keys - k0) : 0;

    float sacc[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) sacc[j] = 0.f;
    if (has_own) {
      mbar_wait_bounded(full + wg, n & 1, kSeesawBarBase + wg, hang);
      if (n > 0) mbar_wait_bounded(other_free + wg, (n - 1) & 1, kSeesawBarBase + 4 + wg, hang);
        // Widen in place. Raw row r: bytes r * 576.., 36 pieces of 16 fp8 (piece c: columns 16 c..16 c + 15).
        // 1. The other warpgroup's half (pieces 16 (1 - wg)..) into the other region, which the raw bytes do
        //    not reach; rows past the sequence as zeros.
#pragma unroll 4
      for (int k = 0; k < 8; ++k) {
        const int c = ltid + 128 * k, r = c >> 4, x = c & 15;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < valid) v = *reinterpret_cast<const uint4*>(own + r * kDim + (16 * (1 - wg) + x) * 16);
        widen_store(own + kSwOtherOff + (x >> 2) * kBlockBytes, r, (x & 3) * 16, v);
      }
      // 2. The rope (pieces 32-35) and the own half (pieces 16 wg..) into the owner region, over the raw
      //    bytes, in two halves of four groups of 8 keys, the last half first: group g's 5,120 widened bytes
      //    start at 5,120 g, past the raw rows of the groups before it (which end at 4,608 g), so the
      //    widened groups 4-7 cover only raw rows of groups 4-7, all read before the half's barrier. 160
      //    pieces a group, 2 a thread at most, 8 a thread in flight a half.
#pragma unroll 1
      for (int half = 1; half >= 0; --half) {
        uint4 v[4][2];
#pragma unroll
        for (int gi = 0; gi < 4; ++gi)
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const int c = ltid + 128 * k, r = 8 * (4 * half + gi) + c / 20, x = c % 20;
            v[gi][k] = make_uint4(0, 0, 0, 0);
            if (c < 160 && r < valid)
              v[gi][k] =
                  *reinterpret_cast<const uint4*>(own + r * kDim + (x < 16 ? 16 * wg + x : 16 + x) * 16);
          }
        named_barrier(kSeesawBarWg + wg, 128);
#pragma unroll
        for (int gi = 0; gi < 4; ++gi)
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const int c = ltid + 128 * k, x = c % 20;
            if (c < 160)
              widen_store(own + (4 * half + gi) * kSwGroupBytes + (x < 16 ? 1 + (x >> 2) : 0) * kAtomBytes,
                          c / 20, x < 16 ? (x & 3) * 16 : (x - 16) * 16, v[gi][k]);
          }
      }
      fence_proxy_async();
      named_barrier(kSeesawBarWg + wg, 128);

      // S[64, 64 keys] over k = 0..575, block by block of the own buffer against Q's matching column block
      // (rope, own half, other half; the k sum does not care about the order). The descriptors are made
      // here from an opaque base: hoisted out of the round loop they would hold 36 x 2 registers.
      uint32_t base = smem_u32(sm);
      asm volatile("" : "+r"(base));
      const uint32_t own_at = base + static_cast<uint32_t>(kSwOffB0 + wg * kKBytes);
      const uint64_t k_owner = desc_sw128_at(own_at, 16, kSwGroupBytes);       // atoms 8 keys apart
      const uint64_t k_other = desc_sw128_at(own_at + kSwOtherOff, 16, 1024);  // dense blocks
      const uint64_t q_rope = desc_sw128_at(base + 8 * kBlockBytes, 16, 1024);
      const uint64_t q_own = desc_sw128_at(base + 4 * wg * kBlockBytes, 16, 1024);
      const uint64_t q_oth = desc_sw128_at(base + 4 * (1 - wg) * kBlockBytes, 16, 1024);
      wgmma_fence();
#pragma unroll
      for (int b = 0; b < 9; ++b) {
        const uint64_t qd = b == 0  ? q_rope
                            : b < 5 ? q_own + (b - 1) * (kBlockBytes >> 4)
                                    : q_oth + (b - 5) * (kBlockBytes >> 4);
        const uint64_t kd = b < 5 ? k_owner + b * (kAtomBytes >> 4) : k_other + (b - 5) * (kBlockBytes >> 4);
#pragma unroll
        for (int kq = 0; kq < 4; ++kq)
          wgmma_ss_m64n64k16_f16<0>(sacc, qd + kq * 2, kd + kq * 2, (b | kq) ? 1 : 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < 32; ++j) fence_operand(sacc[j]);
    }
    float mx0, mx1;
    mask_scores(sacc, t, valid, k0, rp0, rp1, score_scale, mx0, mx1);

    uint32_t pown[4][4], poth[4][4];
    float sum0, sum1;
    if (wg == 0) {
      const float ma0 = fmaxf(m_run0, mx0), ma1 = fmaxf(m_run1, mx1);
      exp_pack(sacc, ma0, ma1, sum0, sum1, pown);
      const float c0 = rescale(m_run0, ma0), c1 = rescale(m_run1, ma1);
      l0 = l0 * c0 + sum0;
      l1 = l1 * c1 + sum1;
      if (t == 0) {
        rowmax_s[row0] = ma0;
        rowmax_s[row1] = ma1;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        px4[kk * 128 + ltid] = make_uint4(pown[kk][0], pown[kk][1], pown[kk][2], pown[kk][3]);
      named_barrier_arrive(kSeesawBarPub0, 256);
      scale_o(o, c0, c1);
      wgmma_fence();
      pv_tile(o, pown, v_own, kSwGroupBytes);
      wgmma_commit();
      // Done with the owner region before waiting for WG 1 (whose softmax this P V overlaps): the producer
      // can start the next tile's copy into it.
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < 128; ++j) fence_operand(o[j]);
      __syncwarp();
      if (lane == 0) mbar_arrive(land_free + 0);
      named_barrier(kSeesawBarPub1, 256);  // WG 1's m_b and P1
      const float mb0 = rowmax_s[kRows + row0], mb1 = rowmax_s[kRows + row1];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint4 v = px4[kk * 128 + ltid];
        poth[kk][0] = v.x;
        poth[kk][1] = v.y;
        poth[kk][2] = v.z;
        poth[kk][3] = v.w;
      }
      const float d0 = rescale(ma0, mb0), d1 = rescale(ma1, mb1);
      l0 *= d0;
      l1 *= d1;
      m_run0 = mb0;
      m_run1 = mb1;
      scale_o(o, d0, d1);
      if (has_other) {
        wgmma_fence();
        pv_tile(o, poth, v_oth, 1024);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 128; ++j) fence_operand(o[j]);
        __syncwarp();
        if (lane == 0) mbar_arrive(other_free + 1);  // done with B1's other region
      }
    } else {
      named_barrier(kSeesawBarPub0, 256);  // WG 0's m_a and P0
      const float ma0 = rowmax_s[row0], ma1 = rowmax_s[row1];
      const float mb0 = fmaxf(ma0, mx0), mb1 = fmaxf(ma1, mx1);  // m_a >= m already
      exp_pack(sacc, mb0, mb1, sum0, sum1, pown);
      // P0 from this thread's slot, read before P1 is stored there (S is dead by now: fewer live registers).
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint4 v = px4[kk * 128 + ltid];
        poth[kk][0] = v.x;
        poth[kk][1] = v.y;
        poth[kk][2] = v.z;
        poth[kk][3] = v.w;
      }
      const float c0 = rescale(m_run0, mb0), c1 = rescale(m_run1, mb1);
      l0 = l0 * c0 + sum0;
      l1 = l1 * c1 + sum1;
      if (t == 0) {
        rowmax_s[kRows + row0] = mb0;
        rowmax_s[kRows + row1] = mb1;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        px4[kk * 128 + ltid] = make_uint4(pown[kk][0], pown[kk][1], pown[kk][2], pown[kk][3]);
      named_barrier_arrive(kSeesawBarPub1, 256);
      scale_frag(poth, rescale(ma0, mb0), rescale(ma1, mb1));
      m_run0 = mb0;
      m_run1 = mb1;
      scale_o(o, c0, c1);
      if (has_own) {  // the own tile first: its release lets the producer start the next copy sooner
        wgmma_fence();
        pv_tile(o, pown, v_own, kSwGroupBytes);
        wgmma_commit();
      }
      wgmma_fence();
      pv_tile(o, poth, v_oth, 1024);  // WG 0's tile, columns 256..511, from B0's other region
      wgmma_commit();
      if (has_own) {
        wgmma_wait<1>();
        __syncwarp();
        if (lane == 0) mbar_arrive(land_free + 1);  // S1 and P1 V1[:, 256:512] done with B1's owner region
      }
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < 128; ++j) fence_operand(o[j]);
      __syncwarp();
      if (lane == 0) mbar_arrive(other_free + 0);  // done with B0's other region
    }
  }

  write_rows(p, hb, hg, u, split, nsplit, max_splits, wg, o, l0, l1, m_run0, m_run1, rowmax_s, part, lse);
#else
  (void)p;
  (void)hb;
  (void)max_splits;
  (void)min_tiles;
  (void)part;
  (void)lse;
  (void)hang;
#endif
}

// One block per (sequence, row of the sequence): weights 2^(lse_s - max) over its splits, in split order.
// kB, kG: mla_split::combine_batch and combine_groups of the plan (blocks of kG x kLatent / 4 threads).
template <int kB, int kG>
__global__ void __launch_bounds__(kG* kLatent / 4, kG > 1    ? 2
                                                   : kB == 4 ? 12
                                                             : 8)
    mla_wgmma_combine(MlaDecodeSm90Params p, int max_splits, int min_tiles, const float* __restrict__ lse,
                      const float* __restrict__ part) {
  dev::grid_dep_enter();
  __shared__ int red[32];
  __shared__ float scratch[kG > 1 ? kG * kLatent / 4 * 6 : 1];
  const int u = blockIdx.x, row_id = blockIdx.y;
  const int token = u * p.q_per_seq + row_id / p.heads, head = row_id % p.heads;
  const int rows_per_unit = p.q_per_seq * p.heads;
  const size_t first = static_cast<size_t>(u) * max_splits * rows_per_unit + row_id;
  // The sequence's splits (1: the split pass wrote its output), found while the first partial rows load.
  auto nsplit_of = [&]() {
    return unit_splits(unit_keys(p, u), tiles_per_split(p, max_splits, min_tiles, red));
  };
  mla_split::combine_row<kLatent, true, kB, kG>(p, lse, part, first, rows_per_unit, max_splits, nsplit_of,
                                                token, head, scratch);
}

// The record of a timed-out mbarrier wait (mla_wgmma.cuh): host memory mapped into the device, allocated at
// the first launch, printed to stderr at exit when a wait timed out (the launch itself only fails with an
// unspecified launch failure). Null when it cannot be allocated: the wait still traps.
MbarTimeout* hang_record() {
  static MbarTimeout* const rec = [] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // allocating is not captured work
    cudaThreadExchangeStreamCaptureMode(&mode);
    void* h = nullptr;
    void* d = nullptr;
    if (cudaHostAlloc(&h, sizeof(MbarTimeout), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
      cudaGetLastError();
      d = nullptr;
    } else {
      std::memset(h, 0, sizeof(MbarTimeout));
      host_hang = static_cast<MbarTimeout*>(h);
      std::atexit([] {
        const std::string msg = mla_decode_wgmma_hang_report();
        if (!msg.empty()) std::fprintf(stderr, "%s\n", msg.c_str());
      });
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    return static_cast<MbarTimeout*>(d);
  }();
  return rec;
}

// Registers the split kernel is launched with, against the setmaxnreg budgets (read once).
void check_registers() {
  static const int r = [] {
    cudaFuncAttributes a{};
    CUDA_CHECK(cudaFuncGetAttributes(&a, mla_wgmma_split_seesaw));
    return a.numRegs;
  }();
  MS_CHECK(
      r * kThreads >= 2 * 128 * kConsumerRegs + 128 * kProducerRegs,
      "mla_decode_wgmma: the split kernel was built with {} registers a thread, {} x {} do not cover the "
      "setmaxnreg budgets (2 x 128 x {} + 128 x {})",
      r, r, kThreads, kConsumerRegs, kProducerRegs);
}

void check_params(const mla_wgmma::Config& c, const MlaDecodeSm90Params& p) {
  MS_CHECK(p.n_seqs > 0 && p.heads > 0, "mla_decode_wgmma: n_seqs = {} and heads = {} must be positive",
           p.n_seqs, p.heads);
  MS_CHECK(p.q_per_seq >= 1 && p.q_per_seq <= 4, "mla_decode_wgmma: q_per_seq = {} must be 1..4",
           p.q_per_seq);
  MS_CHECK(p.topk == nullptr && p.topk_width == 0, "mla_decode_wgmma: dense only, a DSA selection was given");
  MS_CHECK(p.kv_fp8, "mla_decode_wgmma: fp8 e4m3 pages only (kv_fp8 = false)");
  MS_CHECK(p.page_size > 0 && p.num_pages > 0 && p.block_table_stride > 0,
           "mla_decode_wgmma: page_size {}, num_pages {} and block_table_stride {} must be positive",
           p.page_size, p.num_pages, p.block_table_stride);
  MS_CHECK(p.q && p.kv && p.block_table && p.positions && p.seq_lens && p.out,
           "mla_decode_wgmma: q, kv, block_table, positions, seq_lens and out must all be set");
  MS_CHECK(reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_token_stride % 8 == 0 &&
               p.q_token_stride >= static_cast<int64_t>(p.heads) * kDim,
           "mla_decode_wgmma: q must be 16-byte aligned with q_token_stride (= {}) a multiple of 8 and >= "
           "heads * 576",
           p.q_token_stride);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.kv) % 16 == 0, "mla_decode_wgmma: kv pool must be 16-byte aligned");
  MS_CHECK(
      reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.out_token_stride % 4 == 0 &&
          p.out_token_stride >= static_cast<int64_t>(p.heads) * kLatent,
      "mla_decode_wgmma: out must be 16-byte aligned with out_token_stride (= {}) a multiple of 4 and >= "
      "heads * 512",
      p.out_token_stride);
  MS_CHECK(c.heads_per_block > 0 && c.heads_per_block * c.q_per_unit <= kRows && c.max_splits >= 1 &&
               c.max_splits <= kMaxSplits && c.min_tiles_per_split >= 1,
           "mla_decode_wgmma: no configuration (heads_per_block {}, max_splits {})", c.heads_per_block,
           c.max_splits);
  MS_CHECK(c.units == p.n_seqs && c.q_per_unit == p.q_per_seq && c.head_groups * c.heads_per_block >= p.heads,
           "mla_decode_wgmma: config made for {} sequences of {} tokens, params have {} of {}", c.units,
           c.q_per_unit, p.n_seqs, p.q_per_seq);
  MS_CHECK(c.units <= 65535, "mla_decode_wgmma: {} sequences exceed the grid's z limit 65535", c.units);
  MS_CHECK(c.max_splits == 1 || (p.workspace && reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0),
           "mla_decode_wgmma: workspace of {} bytes must be set and 256-byte aligned", c.workspace);
}

// MOESERVE_MLA_MIN_TILES=1..64 replaces the configuration's fewest tiles a split (for timing one against
// another in one build); anything else is refused with the variable's name.
int min_tiles_override(int configured) {
  static const int forced = [] {
    const char* env = std::getenv("MOESERVE_MLA_MIN_TILES");
    if (env == nullptr || *env == '\0') return 0;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    MS_CHECK(end != env && *end == '\0' && v >= 1 && v <= 64,
             "MOESERVE_MLA_MIN_TILES must be a whole number of 64-key tiles from 1 to 64, not '{}'", env);
    return static_cast<int>(v);
  }();
  return forced > 0 ? forced : configured;
}

}  // namespace

std::string mla_decode_wgmma_hang_report() {
  if (host_hang == nullptr) return {};
  const volatile MbarTimeout* r = host_hang;
  if (r->seen == 0) return {};
  const uint32_t b = r->barrier;
  const char* name = b < kSeesawBarBase + 2 ? "full" : b < kSeesawBarBase + 4 ? "land_free" : "other_free";
  const uint32_t index = (b - kSeesawBarBase) % 2;
  return fmt::format(
      "mla_decode_wgmma: block ({}, {}, {}) thread {} waited {:.1f} s for mbarrier {}[{}] to complete the "
      "phase of parity {}, and trapped",
      r->block[0], r->block[1], r->block[2], r->thread, static_cast<double>(kMbarTimeoutNs) * 1e-9, name,
      index, r->parity);
}

mla_wgmma::Config mla_decode_wgmma_choose(const MlaDecodeSm90Params& p, const DeviceLimits& dev) {
  if (p.topk != nullptr || !p.kv_fp8) return {};
  return mla_wgmma::choose(p.n_seqs, p.q_per_seq, p.heads, dev);
}

void mla_decode_wgmma(const mla_wgmma::Config& c, const MlaDecodeSm90Params& p, cudaStream_t stream) {
  check_params(c, p);
  check_fit(current_device_caps(), need());
  check_registers();
  {
    const std::string hung = mla_decode_wgmma_hang_report();
    MS_CHECK(hung.empty(), "{} (an earlier launch)", hung);
  }
  auto* const split_kernel = mla_wgmma_split_seesaw;
  CUDA_CHECK(cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSmemBytes)));
  const size_t n = static_cast<size_t>(c.units) * c.max_splits * c.q_per_unit * p.heads;
  float* part = static_cast<float*>(p.workspace);
  float* lse = part ? part + (n * kLatent * 4 + 255) / 256 * 64 : nullptr;
  const dim3 grid(c.max_splits, c.head_groups, c.units);
  const int min_tiles = min_tiles_override(c.min_tiles_per_split);
  launch_kernel("mla_decode_wgmma", split_kernel, grid, kThreads, kSmemBytes, stream, p, c.heads_per_block,
                c.max_splits, min_tiles, part, lse, hang_record());
  if (c.max_splits > 1) {
    const int groups = mla_split::combine_groups(c.max_splits);
    auto* combine = groups > 1                                    ? mla_wgmma_combine<8, 4>
                    : mla_split::combine_batch(c.max_splits) == 4 ? mla_wgmma_combine<4, 1>
                                                                  : mla_wgmma_combine<8, 1>;
    launch_kernel("mla_wgmma_combine", combine, dim3(c.units, c.q_per_unit * p.heads), groups * kLatent / 4,
                  0, stream, p, c.max_splits, min_tiles, lse, part);
  }
}

}  // namespace ms::cuda
