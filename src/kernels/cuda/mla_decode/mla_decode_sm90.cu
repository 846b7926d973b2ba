// Tensor-core MLA decode (see mla_decode_sm90.h): split pass and log-sum-exp combine pass.
//
// Split pass, one block = (split, head group, unit), 8 warps, per tile of 32 keys:
//   the keys' rows (page, slot looked up by warp 0 one tile ahead, from positions or the DSA selection) are
//   copied raw with cp.async into a ring of `stages` tiles; rows a token may not see are zero-filled by the
//   copy (src-size 0), so NaN bytes of page tails never reach shared memory;
//   fp8: the tile is widened once to f16 (exact: e4m3 is a subset of f16; one conversion instruction per
//   pair, where bf16 would take four) into a padded tile, and the block's MMAs run on f16: Q is rounded to
//   f16 (saturating at +-65504; 11 significant bits against bf16's 8) and so is P (in [0, 1]); S[rows, 32] =
//   Q K^T    warp w: row group w % RG, all 32 keys, a 1/KS share of the 576-long k range
//                          (KS = 8 / RG), the KS partials summed by the softmax;
//   softmax: 4 threads per row, 8 keys each, online in f32 with exp2 (scores pre-scaled by log2 e);
//   O[rows, 512] += P V    warp w owns output columns 64w..64w+63 of every row (V read once per block),
//                          O = 2 * rows f32 registers per lane.
//
// mma.sync.m16n8k16.row.col (bf16 in, or f16 over fp8 pages; f32 accumulate), per lane g = lane / 4, t = lane
// % 4:
//   A (16 x 16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16 x 8, k x n):      b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 x 8):             c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// ldmatrix.x4 gives lane l the row l/4, columns 2(l%4)..+1 of each of 4 8x8 matrices (.trans: the transpose),
// matrix k's row addresses taken from lanes 8k..8k+7:
//   A from row-major [row][k]:  lane -> row (l & 15), column 8 (l >> 4)      => a0..a3
//   B = K^T from [key][k]:      lane -> key (l & 7) + 8 (l >> 4), k 8((l >> 3) & 1)
//                               => r0,r1 = b0,b1 of keys 0-7, r2,r3 = b0,b1 of keys 8-15
//   B = V from [key][dim], .trans: lane -> key (l & 7) + 8((l >> 3) & 1), dim 8 (l >> 4)
//                               => r0,r1 = b0,b1 of dims 0-7, r2,r3 = b0,b1 of dims 8-15
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/common/cp_async.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90.h"
#include "kernels/cuda/mla_decode/mla_split.cuh"
#include "kernels/cuda/mla_decode/mla_wgmma.cuh"

namespace ms::cuda {
namespace {

using namespace mla_sm90;
using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kNoKey = 0x7fffffff;  // key position of a row that is not loaded: above every query position
constexpr int kSStride = kTileKeys + 4;  // floats per row of the partial score tile
constexpr int kPStride = kTileKeys + 8;  // bf16 per row of P: 80 bytes, ldmatrix conflict-free

using dev::cp_async_commit;
using dev::cp_async_wait_pending;
// Copies of rows a token may not see read nothing (src_bytes 0) and leave zeros.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, int src_bytes) {
  dev::cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, src_bytes);
}
using tc::fp8x2_to_f16x2;
using tc::ldsm_x4;
using tc::ldsm_x4_trans;
using tc::pack_bf16;

// The block's 16-bit operand type: bf16 over bf16 pages, f16 over fp8 pages (see the header comment).
template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16)
    return tc::pack_f16_sat(lo, hi);
  else
    return pack_bf16(lo, hi);
}
template <bool F16>
__device__ __forceinline__ void mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (F16)
    tc::mma_f16(c, a, b0, b1);
  else
    tc::mma_bf16(c, a, b0, b1);
}

__device__ __forceinline__ int unit_keys(const MlaDecodeSm90Params& p, int u) {
  if (p.topk) return p.topk_compact ? min(p.topk_width, max(__ldg(p.positions + u) + 1, 0)) : p.topk_width;
  return min(max(p.seq_lens[u], 0), p.block_table_stride * p.page_size);
}

// Tiles per split for `keys` keys over max_splits splits, at least min_tiles: a unit's own plan (the narrow
// kernel's two-block schedule) or, with the batch's longest unit's keys, the plan every block shares.
__device__ __forceinline__ int split_tiles(int keys, int max_splits, int min_tiles) {
  const int tiles = (keys + kTileKeys - 1) / kTileKeys;
  return max(min_tiles, (tiles + max_splits - 1) / max_splits);
}

// Tiles per split: the same in every block of both passes (the longest unit's tiles over max_splits, at
// least min_tiles). `red` is 32 ints of shared memory; contains a __syncthreads.
__device__ int tiles_per_split(const MlaDecodeSm90Params& p, int max_splits, int min_tiles, int* red) {
  int mk = 0;
  if (p.topk && !p.topk_compact) {
    mk = p.topk_width;
  } else {
    for (int b = threadIdx.x; b < p.n_seqs; b += blockDim.x) mk = max(mk, unit_keys(p, b));
    mk = __reduce_max_sync(0xffffffffu, mk);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mk;
    __syncthreads();
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) mk = max(mk, red[w]);
  }
  return split_tiles(mk, max_splits, min_tiles);
}

__device__ __forceinline__ int unit_splits(int keys, int tps) {
  return mla_split::unit_splits<kTileKeys>(keys, tps);
}

template <int RG, bool FP8>
__global__ void __launch_bounds__(kThreads, RG == 1 ? 2 : 1)
    mla_sm90_split(MlaDecodeSm90Params p, int hb, int qu, int stages, int max_splits, int min_tiles,
                   float* __restrict__ part, float* __restrict__ lse) {
  dev::grid_dep_enter();
  constexpr int M = 16 * RG;  // rows of the block
  constexpr int KS = 8 / RG;  // k-range shares of the score product (8 warps / RG row groups)
  constexpr int CPR = FP8 ? kDim / 16 : kDim / 8;  // 16-byte chunks per cache row
  constexpr size_t kStageBytes = FP8 ? size_t{kTileKeys} * kDim : size_t{2} * kTileKeys * kRowStride;
  const int split = blockIdx.x, hg = blockIdx.y, u = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const bool dsa = p.topk != nullptr;

  extern __shared__ uint4 smem_raw[];
  unsigned char* sp = reinterpret_cast<unsigned char*>(smem_raw);
  bf16* q_s = reinterpret_cast<bf16*>(sp);  // [M][kRowStride]
  sp += size_t{2} * M * kRowStride;
  bf16* conv_s = reinterpret_cast<bf16*>(sp);  // [32][kRowStride] (fp8 only)
  if (FP8) sp += size_t{2} * kTileKeys * kRowStride;
  unsigned char* ring = sp;  // [stages][kStageBytes]
  sp += stages * kStageBytes;
  float* s_part = reinterpret_cast<float*>(sp);  // [KS][M][kSStride] (KS * M = 128 rows)
  sp += size_t{4} * kScoreRows * kSStride;
  bf16* p_s = reinterpret_cast<bf16*>(sp);  // [M][kPStride]
  sp += size_t{2} * M * kPStride;
  float* corr_s = reinterpret_cast<float*>(sp);  // [64]
  float* l_s = corr_s + kMaxRows;
  float* m_s = l_s + kMaxRows;
  int* rowpos_s = reinterpret_cast<int*>(m_s + kMaxRows);
  sp += size_t{4} * 4 * kMaxRows;
  int2* meta_s = reinterpret_cast<int2*>(sp);  // [stages + 1][32] (row slot, key position)
  sp += size_t{8} * (stages + 1) * kTileKeys;
  int* red = reinterpret_cast<int*>(sp);  // [16]

  // The plan: this unit's splits and this split's tiles.
  const int tps = tiles_per_split(p, max_splits, min_tiles, red);
  const int keys = unit_keys(p, u);
  const int nsplit = unit_splits(keys, tps);
  if (split >= nsplit) return;
  const int total_tiles = (keys + kTileKeys - 1) / kTileKeys;
  const int tile_begin = split * tps;
  const int ntiles = max(0, min(total_tiles, tile_begin + tps) - tile_begin);
  const int seq = dsa ? (p.token_seq ? p.token_seq[u] : u / p.q_per_seq) : u;
  const int unit_pos = dsa ? p.positions[u] : 0;
  const int max_pos = p.block_table_stride * p.page_size;
  const int32_t* table = p.block_table + static_cast<int64_t>(seq) * p.block_table_stride;

  // Rows: r = j * hb + local head; rows past qu * hb or past `heads` are padding (position -1: no key).
  auto row_token = [&](int r, int& token, int& head) {
    const int j = r / hb;
    head = hg * hb + r % hb;
    token = dsa ? u : u * p.q_per_seq + j;
    return r < hb * qu && head < p.heads;
  };
  if (tid < M) {
    int token, head;
    rowpos_s[tid] = row_token(tid, token, head) ? p.positions[token] : -1;
  }
  for (int i = tid; i < M * (kDim / 8); i += kThreads) {
    const int r = i / (kDim / 8), c = i % (kDim / 8);
    int token, head;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row_token(r, token, head)) {
      const int64_t off = token * p.q_token_stride + static_cast<int64_t>(head) * kDim + c * 8;
      if (p.q_bf16 && !FP8) {
        v = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.q) + off));
      } else if (p.q_bf16) {
        const uint4 r = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.q) + off));
        auto cv = [](uint32_t x) {
          return pack2<true>(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
        };
        v = make_uint4(cv(r.x), cv(r.y), cv(r.z), cv(r.w));
      } else {
        const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + off);
        const float4 a = __ldg(f), b = __ldg(f + 1);
        v = make_uint4(pack2<FP8>(a.x, a.y), pack2<FP8>(a.z, a.w), pack2<FP8>(b.x, b.y),
                       pack2<FP8>(b.z, b.w));
      }
    }
    *reinterpret_cast<uint4*>(q_s + r * kRowStride + c * 8) = v;
  }

  // Key metadata, warp 0, lane = key of the tile: the DSA entry is read one tile before its page id, the
  // page id one tile before it is written to shared memory, so neither load stalls the loop.
  auto topk_entry = [&](int T) -> int {
    const int k = (tile_begin + T) * kTileKeys + lane;
    return (T < ntiles && k < p.topk_width) ? __ldg(p.topk + static_cast<int64_t>(u) * p.topk_width + k) : -1;
  };
  struct KeyMeta {
    int page, pos;
  };
  auto load_meta = [&](int T, int e) -> KeyMeta {
    int pos;
    bool ok;
    if (dsa) {
      pos = e;
      ok = e >= 0 && e <= unit_pos && e < max_pos;
    } else {
      pos = (tile_begin + T) * kTileKeys + lane;
      ok = T < ntiles && pos < keys;
    }
    if (!ok) return {0, kNoKey};
    return {__ldg(table + pos / p.page_size), pos};
  };
  auto store_meta = [&](int T, const KeyMeta& k) {
    int2 v = make_int2(0, kNoKey);
    if (k.pos != kNoKey) {
      const int page = min(max(k.page, 0), p.num_pages - 1);  // a bad id reads a wrong page, never outside
      v = make_int2(page * p.page_size + k.pos % p.page_size, k.pos);
    }
    meta_s[(T % (stages + 1)) * kTileKeys + lane] = v;
  };
  KeyMeta next{0, kNoKey};
  int pre_e = -1;
  if (warp == 0) {
    int e = dsa ? topk_entry(0) : 0;
    for (int T = 0; T < stages; ++T) {
      const int en = dsa ? topk_entry(T + 1) : 0;
      store_meta(T, load_meta(T, e));
      e = en;
    }
    next = load_meta(stages, e);
    pre_e = dsa ? topk_entry(stages + 1) : 0;
  }
  __syncthreads();

  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  constexpr int kRowBytes = FP8 ? kDim : 2 * kDim;
  auto issue = [&](int T) {
    if (T < ntiles) {
      const int2* m = meta_s + (T % (stages + 1)) * kTileKeys;
      unsigned char* dst = ring + (T % stages) * kStageBytes;
      constexpr int kDstRow = FP8 ? kDim : 2 * kRowStride;
      for (int c = tid; c < kTileKeys * CPR; c += kThreads) {
        const int key = c / CPR, col = c % CPR;
        const int2 mk = m[key];
        cp_async16_zfill(dst + key * kDstRow + col * 16,
                         kv + static_cast<int64_t>(mk.x) * kRowBytes + col * 16, mk.y != kNoKey ? 16 : 0);
      }
    }
    cp_async_commit();
  };
  for (int T = 0; T < stages - 1; ++T) issue(T);

  const float score_scale = p.softmax_scale * (FP8 ? p.kv_scale : 1.f) * kLog2e;
  float o[RG][8][4];
#pragma unroll
  for (int a = 0; a < RG; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b) o[a][b][0] = o[a][b][1] = o[a][b][2] = o[a][b][3] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;  // softmax state of row tid / 4 (threads tid < 4M)
  const int srow = tid >> 2, sq = tid & 3;

  for (int i = 0; i < ntiles; ++i) {
    cp_async_wait_pending(stages - 2);
    __syncthreads();  // tile i landed; every warp is done with tile i - 1 (its stage, S, P, meta)
    issue(i + stages - 1);
    const bf16* tile;
    if (FP8) {
      const uint4* raw = reinterpret_cast<const uint4*>(ring + (i % stages) * kStageBytes);
      for (int c = tid; c < kTileKeys * CPR; c += kThreads) {
        const int key = c / CPR, col = c % CPR;
        const uint4 v = raw[c];
        uint4* d = reinterpret_cast<uint4*>(conv_s + key * kRowStride + col * 16);
        d[0] = make_uint4(fp8x2_to_f16x2(v.x), fp8x2_to_f16x2(v.x >> 16), fp8x2_to_f16x2(v.y),
                          fp8x2_to_f16x2(v.y >> 16));
        d[1] = make_uint4(fp8x2_to_f16x2(v.z), fp8x2_to_f16x2(v.z >> 16), fp8x2_to_f16x2(v.w),
                          fp8x2_to_f16x2(v.w >> 16));
      }
      tile = conv_s;
      __syncthreads();
    } else {
      tile = reinterpret_cast<const bf16*>(ring + (i % stages) * kStageBytes);
    }
    if (warp == 0) {
      store_meta(i + stages, next);
      next = load_meta(i + stages + 1, pre_e);
      if (dsa) pre_e = topk_entry(i + stages + 2);
    }

    // Partial scores: row group rg x all 32 keys over k share ks (36 / KS k-steps, rounded per share).
    {
      const int rg = warp % RG, ks = warp / RG;
      float acc[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
      const bf16* qa = q_s + (16 * rg + (lane & 15)) * kRowStride + (lane >> 4) * 8;
      const bf16* kb = tile + ((lane & 7) + ((lane >> 4) << 3)) * kRowStride + ((lane >> 3) & 1) * 8;
      const int k_begin = ks * (kDim / 16) / KS, k_end = (ks + 1) * (kDim / 16) / KS;
#pragma unroll 3
      for (int kk = k_begin; kk < k_end; ++kk) {
        uint32_t a[4], r0[4], r1[4];
        ldsm_x4(a, qa + 16 * kk);
        ldsm_x4(r0, kb + 16 * kk);                    // keys 0-15
        ldsm_x4(r1, kb + 16 * kRowStride + 16 * kk);  // keys 16-31
        mma16<FP8>(acc[0], a, r0[0], r0[1]);
        mma16<FP8>(acc[1], a, r0[2], r0[3]);
        mma16<FP8>(acc[2], a, r1[0], r1[1]);
        mma16<FP8>(acc[3], a, r1[2], r1[3]);
      }
      float* dst = s_part + ks * M * kSStride;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(dst + (16 * rg + g) * kSStride + col) =
            make_float2(acc[nt][0], acc[nt][1]);
        *reinterpret_cast<float2*>(dst + (16 * rg + g + 8) * kSStride + col) =
            make_float2(acc[nt][2], acc[nt][3]);
      }
    }
    __syncthreads();

    // Online softmax: row srow, keys 8sq..8sq+7 (the 4 threads of a row are lanes of one warp).
    if (srow < M) {
      const int rp = rowpos_s[srow];
      const int2* mk = meta_s + (i % (stages + 1)) * kTileKeys;
      float s[8], mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int key = 8 * sq + c;
        float v = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) v += s_part[(ks * M + srow) * kSStride + key];
        s[c] = mk[key].y <= rp ? v * score_scale : -INFINITY;
        mx = fmaxf(mx, s[c]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
      const float corr = exp2f(m_run - m_use);
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        s[c] = exp2f(s[c] - m_use);
        sum += s[c];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l_run = l_run * corr + sum;
      m_run = m_new;
      *reinterpret_cast<uint4*>(p_s + srow * kPStride + 8 * sq) = make_uint4(
          pack2<FP8>(s[0], s[1]), pack2<FP8>(s[2], s[3]), pack2<FP8>(s[4], s[5]), pack2<FP8>(s[6], s[7]));
      if (sq == 0) corr_s[srow] = corr;
    }
    __syncthreads();

    // O[:, 64 warp .. 64 warp + 63] = corr * O + P V.
#pragma unroll
    for (int rg = 0; rg < RG; ++rg) {
      const float c0 = corr_s[16 * rg + g], c1 = corr_s[16 * rg + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        o[rg][nt][0] *= c0;
        o[rg][nt][1] *= c0;
        o[rg][nt][2] *= c1;
        o[rg][nt][3] *= c1;
      }
    }
    const bf16* vb = tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRowStride + 64 * warp + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < kTileKeys / 16; ++kk) {
      uint32_t b[8][2];
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t r[4];
        ldsm_x4_trans(r, vb + kk * 16 * kRowStride + np * 16);
        b[2 * np][0] = r[0];
        b[2 * np][1] = r[1];
        b[2 * np + 1][0] = r[2];
        b[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int rg = 0; rg < RG; ++rg) {
        uint32_t a[4];
        ldsm_x4(a, p_s + (16 * rg + (lane & 15)) * kPStride + (lane >> 4) * 8 + 16 * kk);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) mma16<FP8>(o[rg][nt], a, b[nt][0], b[nt][1]);
      }
    }
  }
  cp_async_wait_pending(0);  // no copy may still target shared memory when the block exits

  if (srow < M && sq == 0) {
    l_s[srow] = l_run;
    m_s[srow] = m_run;
  }
  __syncthreads();
  const float out_scale = FP8 ? p.kv_scale : 1.f;
  const int rows_per_unit = qu * p.heads;
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 16 * rg + g + 8 * hf;
      int token, head;
      if (!row_token(r, token, head)) continue;
      const float l = l_s[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (nsplit == 1) {
        const int64_t base =
            token * p.out_token_stride + static_cast<int64_t>(head) * kLatent + 64 * warp + 2 * t;
        const float f = inv * out_scale;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float x = o[rg][nt][2 * hf] * f, y = o[rg][nt][2 * hf + 1] * f;
          if (p.out_bf16)
            *reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.out) + base + 8 * nt) = pack_bf16(x, y);
          else
            *reinterpret_cast<float2*>(static_cast<float*>(p.out) + base + 8 * nt) = make_float2(x, y);
        }
      } else {
        const int row_id = (r / hb) * p.heads + head;
        const size_t slot = (static_cast<size_t>(u) * max_splits + split) * rows_per_unit + row_id;
        float* dst = part + slot * kLatent + 64 * warp + 2 * t;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<float2*>(dst + 8 * nt) =
              make_float2(o[rg][nt][2 * hf] * inv, o[rg][nt][2 * hf + 1] * inv);
        if (warp == 0 && t == 0) lse[slot] = l > 0.f ? m_s[r] + log2f(l) : -INFINITY;
      }
    }
}

// The narrow kernel (mla_decode_sm90_config.h: fp8 pages, rows <= 32), one block = (split, head group, unit),
// 8 warps, per step of 64 keys (a ring of `stages` raw steps, rows 592 bytes apart, copied as the kernel
// above copies them: rows a token may not see are zero-filled). Its products, N = 8 * NT rows, mma.sync
// m16n8k16 on f16 (e4m3 is exact in f16), f32 accumulation:
//   S^T[64 keys, N rows] = K Q^T   16 keys a warp; K straight from the raw tile by ldmatrix (a b16 element is
//                                  two fp8 codes) and widened in registers, so the k order inside a 32-column
//                                  chunk is permuted (lane t holds columns 4t..4t+3 and 16 + 4t..); q is
//                                  stored in that order, one 16-byte load a lane a chunk and n-tile;
//   online softmax in f32 with exp2; P -> shared [rows][72] f16;
//   O^T[512, N] += V^T P^T        V^T fragments by ldmatrix.trans of the raw tile, one byte permute and two
//                                  conversions a register, so within a 16-dim m-tile row g is dim 2 g and row
//                                  g + 8 dim 2 g + 1; P^T by ldmatrix.
// Two schedules:
//   WS = false: every warp takes each phase of a step in turn (three block barriers a step): S^T with warp w
//     on keys 16 (w % 4).. over the k-half w / 4 (the halves' partial scores meet in shared memory), the
//     softmax with warp w on rows w + 8 j, P V with warp w on dims 64 w..; two blocks a multiprocessor.
//   WS = true: 16 warps; warps 0-7 (A) take the partial scores and the softmax of step i as above while
//     warps 8-15 (B) take P V of step i - 1 (warp 8 + b: dims 64 b..) and the copies: B refills the ring slot
//     of the step it has just finished and tells A, by named barriers, when a step has landed; A tells B
//     when P is ready (partial scores, P and the correction double-buffered by step parity). One block a
//     multiprocessor with a ring of 3+ steps.
template <int NT, bool WS>
__global__ void __launch_bounds__(WS ? 2 * kThreads : kThreads, NT == 4 || WS ? 1 : 2)
    mla_sm90_narrow(MlaDecodeSm90Params p, int hb, int qu, int stages, int max_splits, int min_tiles,
                    float* __restrict__ part, float* __restrict__ lse) {
  dev::grid_dep_enter();
  constexpr int N = 8 * NT;
  constexpr int kChunks = kDim / 32;  // 18 column chunks of 32 codes
  constexpr int CPR = kDim / 16;      // 16-byte pieces of a raw row
  constexpr int kStep = kNarrowKeys;
  constexpr size_t kStageBytes = size_t{kStep} * kNarrowRowBytes;
  constexpr int kBlock = WS ? 2 * kThreads : kThreads;  // WS: warps 0-7 (A) and 8-15 (B)
  // Named barriers of the WS schedule (0 is __syncthreads): A's own, B's own, step landed [parity], P ready
  // [parity].
  constexpr int kBarA = 1, kBarB = 2, kBarFull = 3, kBarP = 5;
  const int split = blockIdx.x, hg = blockIdx.y, u = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const bool dsa = p.topk != nullptr;
  const int meta_w0 = WS ? 8 : 0;            // the two warps that keep the key metadata
  const int pv_warp = WS ? warp - 8 : warp;  // P V: dims 64 pv_warp..

  extern __shared__ uint4 smem_raw[];
  unsigned char* sp = reinterpret_cast<unsigned char*>(smem_raw);
  unsigned char* q_s = sp;  // [N][kNarrowQStride bytes], f16 in the permuted chunk order
  sp += size_t{N} * kNarrowQStride;
  unsigned char* ring = sp;  // [stages][64][592]
  sp += stages * kStageBytes;
  // Partial scores [B][2 halves][N][kNarrowPartStride] f32, P [B][N][kNarrowPStride] f16 and the correction
  // [B][32], B = 2 buffers by step parity with WS, else 1.
  constexpr int kBufs = WS ? 2 : 1;
  float* s_part = reinterpret_cast<float*>(sp);
  sp += size_t{4} * kBufs * 2 * N * kNarrowPartStride;
  __half* p_s = reinterpret_cast<__half*>(sp);
  sp += size_t{2} * kBufs * N * kNarrowPStride;
  float* corr_s = reinterpret_cast<float*>(sp);
  sp += size_t{4} * kBufs * kNarrowMaxRows;
  float* l_s = reinterpret_cast<float*>(sp);  // [32]
  float* m_s = l_s + kNarrowMaxRows;
  int* rowpos_s = reinterpret_cast<int*>(m_s + kNarrowMaxRows);
  sp += size_t{4} * 3 * kNarrowMaxRows;
  int2* meta_s = reinterpret_cast<int2*>(sp);  // [stages + 1][64] (row slot, key position)
  sp += size_t{8} * (stages + 1) * kStep;
  int* red = reinterpret_cast<int*>(sp);  // [16]

  // The two-block schedule plans each unit by itself (one load and no barrier before the first copies); the
  // warp-specialised one as the whole-tile kernel does (the batch's longest unit; with each unit's own plan
  // it measured 2.6% slower at 32 heads, batch 64 x 32k, on an H200, for reasons not found).
  const int keys = unit_keys(p, u);
  const int tps =
      WS ? tiles_per_split(p, max_splits, min_tiles, red) : split_tiles(keys, max_splits, min_tiles);
  const int nsplit = unit_splits(keys, tps);
  if (split >= nsplit) return;
  const int key_begin = split * tps * kTileKeys;
  const int key_end = min(keys, key_begin + tps * kTileKeys);
  const int nsteps = max(0, (key_end - key_begin + kStep - 1) / kStep);
  const int seq = dsa ? (p.token_seq ? p.token_seq[u] : u / p.q_per_seq) : u;
  const int unit_pos = dsa ? p.positions[u] : 0;
  const int max_pos = p.block_table_stride * p.page_size;
  const int32_t* table = p.block_table + static_cast<int64_t>(seq) * p.block_table_stride;
  // Pages of a power-of-two size (the usual 32 and 64) take a shift and a mask instead of a division.
  const int page_shift = (p.page_size & (p.page_size - 1)) == 0 ? __ffs(p.page_size) - 1 : -1;

  auto row_token = [&](int r, int& token, int& head) {
    const int j = r / hb;
    head = hg * hb + r % hb;
    token = dsa ? u : u * p.q_per_seq + j;
    return r < hb * qu && head < p.heads;
  };
  if (tid < N) {
    int token, head;
    rowpos_s[tid] = row_token(tid, token, head) ? p.positions[token] : -1;
  }
  // q: row r, chunk c, lane piece tt: f16 of columns 32 c + 4 tt..+3 and 32 c + 16 + 4 tt..+3.
  auto stage_q = [&]() {
    for (int i = tid; i < N * kChunks * 4; i += kBlock) {
      const int r = i / (kChunks * 4), c = (i / 4) % kChunks, tt = i % 4;
      int token, head;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row_token(r, token, head)) {
        const int64_t off = token * p.q_token_stride + static_cast<int64_t>(head) * kDim + 32 * c + 4 * tt;
        if (p.q_bf16) {
          const bf16* qb = static_cast<const bf16*>(p.q) + off;
          const uint2 a = __ldg(reinterpret_cast<const uint2*>(qb)),
                      b = __ldg(reinterpret_cast<const uint2*>(qb + 16));
          auto cv = [](uint32_t x) {
            return pack2<true>(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
          };
          v = make_uint4(cv(a.x), cv(a.y), cv(b.x), cv(b.y));
        } else {
          const float* qf = static_cast<const float*>(p.q) + off;
          const float4 a = __ldg(reinterpret_cast<const float4*>(qf)),
                       b = __ldg(reinterpret_cast<const float4*>(qf + 16));
          v = make_uint4(pack2<true>(a.x, a.y), pack2<true>(a.z, a.w), pack2<true>(b.x, b.y),
                         pack2<true>(b.z, b.w));
        }
      }
      *reinterpret_cast<uint4*>(q_s + r * kNarrowQStride + c * 64 + tt * 16) = v;
    }
  };
  // The warp-specialised schedule stages q first and loads the first steps' metadata one step after another
  // (the two-block schedule's shorter prologue below did not make it faster at 32 heads on an H200).
  if constexpr (WS) stage_q();
  // Key metadata, warps meta_w0 and meta_w0 + 1, key 32 (warp - meta_w0) + lane of the step, loaded one step
  // before it is stored (the DSA entry one step before that), as in the kernel above.
  const int mkey = 32 * (warp - meta_w0) + lane;
  auto topk_entry = [&](int T) -> int {
    const int k = key_begin + T * kStep + mkey;
    return k < key_end ? __ldg(p.topk + static_cast<int64_t>(u) * p.topk_width + k) : -1;
  };
  struct KeyMeta {
    int page, pos;
  };
  auto load_meta = [&](int T, int e) -> KeyMeta {
    int pos;
    bool ok;
    if (dsa) {
      pos = e;
      ok = e >= 0 && e <= unit_pos && e < max_pos;
    } else {
      pos = key_begin + T * kStep + mkey;
      ok = pos < key_end;
    }
    if (!ok) return {0, kNoKey};
    return {__ldg(table + (page_shift >= 0 ? pos >> page_shift : pos / p.page_size)), pos};
  };
  // Ring slots are kept as counters (the ring depths are runtime values; a modulo would be a division).
  auto store_meta = [&](int slot, const KeyMeta& k) {
    int2 v = make_int2(0, kNoKey);
    if (k.pos != kNoKey) {
      const int page = min(max(k.page, 0), p.num_pages - 1);  // a bad id reads a wrong page, never outside
      const int in_page = page_shift >= 0 ? k.pos & (p.page_size - 1) : k.pos % p.page_size;
      v = make_int2(page * p.page_size + in_page, k.pos);
    }
    meta_s[slot * kStep + mkey] = v;
  };
  const bool meta_warp = warp == meta_w0 || warp == meta_w0 + 1;
  KeyMeta next{0, kNoKey};
  int pre_e = -1;
  if (meta_warp && WS) {
    int e = dsa ? topk_entry(0) : 0;
    for (int T = 0; T < stages; ++T) {
      const int en = dsa ? topk_entry(T + 1) : 0;
      store_meta(T, load_meta(T, e));
      e = en;
    }
    next = load_meta(stages, e);
    pre_e = dsa ? topk_entry(stages + 1) : 0;
  } else if (meta_warp) {
    // The first stages + 1 steps' metadata with every load in flight at once (DSA: the entries, then the
    // pages), and the DSA entry of the step after.
    // (Steps stages and stages + 1 are not picked out of the arrays: the compiler turns such a pick into a
    // dynamic index, and the arrays into local memory.)
    int e[kMaxStages];
#pragma unroll
    for (int T = 0; T < kMaxStages; ++T) e[T] = dsa && T < stages ? topk_entry(T) : 0;
    const int e_last = dsa ? topk_entry(stages) : 0;
    pre_e = dsa ? topk_entry(stages + 1) : 0;
    KeyMeta km[kMaxStages];
#pragma unroll
    for (int T = 0; T < kMaxStages; ++T) km[T] = T < stages ? load_meta(T, e[T]) : KeyMeta{0, kNoKey};
    next = load_meta(stages, e_last);
#pragma unroll
    for (int T = 0; T < kMaxStages; ++T)
      if (T < stages) store_meta(T, km[T]);
  }
  __syncthreads();

  // The copies of step T into ring slot stage_slot, from metadata slot meta_slot, by `threads` threads from
  // `first`; one commit group a call, also past the last step.
  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  auto issue = [&](int T, int stage_slot, int meta_slot, int first, int threads) {
    if (T < nsteps) {
      const int2* m = meta_s + meta_slot * kStep;
      unsigned char* dst = ring + stage_slot * kStageBytes;
      for (int c = tid - first; c < kStep * CPR; c += threads) {
        const int key = c / CPR, col = c % CPR;
        const int2 mk = m[key];
        cp_async16_zfill(dst + key * kNarrowRowBytes + col * 16,
                         kv + static_cast<int64_t>(mk.x) * kDim + col * 16, mk.y != kNoKey ? 16 : 0);
      }
    }
    cp_async_commit();
  };

  const float score_scale = p.softmax_scale * p.kv_scale * kLog2e;
  float o[4][NT][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int n = 0; n < NT; ++n) o[a][n][0] = o[a][n][1] = o[a][n][2] = o[a][n][3] = 0.f;
  // The softmax state of rows warp + 8 j (warps 0-7): the running maximum, this lane's share of the row sum.
  float m_run[NT], l_part[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    m_run[j] = -INFINITY;
    l_part[j] = 0.f;
  }
  // ldmatrix row addresses: lane -> key (lane & 7) + 8 ((lane >> 3) & 1), 16-byte column (lane >> 4).
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 16 * (lane >> 4);

  // Partial S^T of the step in `st` (warps 0-7): keys 16 (warp % 4).. over the k-half warp / 4 (9 of the 18
  // chunks), into sp_buf [2 halves][N][kNarrowPartStride].
  auto partial_scores = [&](const unsigned char* st, float* sp_buf) {
    const int kt = warp & 3, kh = (warp >> 2) & 1;
    // Two chains (even and odd chunks) summed at the end; one at 32 rows, where registers are short.
    constexpr int kChains = NT == 4 ? 1 : 2;
    float acc[kChains][NT][4];
#pragma unroll
    for (int h = 0; h < kChains; ++h)
#pragma unroll
      for (int n = 0; n < NT; ++n) acc[h][n][0] = acc[h][n][1] = acc[h][n][2] = acc[h][n][3] = 0.f;
    const unsigned char* kb = st + (16 * kt + lrow) * kNarrowRowBytes + lcol;
    const unsigned char* qb = q_s + g * kNarrowQStride + t * 16;
#pragma unroll
    for (int cc = 0; cc < 9; ++cc) {
      const int c = 9 * kh + cc, h = cc % kChains;
      uint32_t r[4];
      ldsm_x4(r, kb + 32 * c);
      const uint32_t a1[4] = {fp8x2_to_f16x2(r[0]), fp8x2_to_f16x2(r[1]), tc::fp8x2_hi_to_f16x2(r[0]),
                              tc::fp8x2_hi_to_f16x2(r[1])};
      const uint32_t a2[4] = {fp8x2_to_f16x2(r[2]), fp8x2_to_f16x2(r[3]), tc::fp8x2_hi_to_f16x2(r[2]),
                              tc::fp8x2_hi_to_f16x2(r[3])};
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4 qv = *reinterpret_cast<const uint4*>(qb + 8 * n * kNarrowQStride + 64 * c);
        tc::mma_f16(acc[h][n], a1, qv.x, qv.y);
        tc::mma_f16(acc[h][n], a2, qv.z, qv.w);
      }
    }
    float* dst = sp_buf + kh * N * kNarrowPartStride + 16 * kt + g;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float v[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) v[x] = kChains == 2 ? acc[0][n][x] + acc[kChains - 1][n][x] : acc[0][n][x];
      dst[(8 * n + 2 * t) * kNarrowPartStride] = v[0];
      dst[(8 * n + 2 * t + 1) * kNarrowPartStride] = v[1];
      dst[(8 * n + 2 * t) * kNarrowPartStride + 8] = v[2];
      dst[(8 * n + 2 * t + 1) * kNarrowPartStride + 8] = v[3];
    }
  };
  // Online softmax of a step (warps 0-7): rows warp + 8 j, keys 2 lane, 2 lane + 1 (metadata `mk`), the two
  // halves' partial scores added; P to p_buf [N][kNarrowPStride], the rows' correction to corr.
  auto softmax = [&](const int2* mk, const float* sp_buf, __half* p_buf, float* corr) {
    const int4 kpair = reinterpret_cast<const int4*>(mk)[lane];  // keys 2 lane, 2 lane + 1
    const int kp0 = kpair.y, kp1 = kpair.w;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = warp + 8 * j;
      const float2 a = *reinterpret_cast<const float2*>(sp_buf + r * kNarrowPartStride + 2 * lane);
      const float2 b = *reinterpret_cast<const float2*>(sp_buf + (N + r) * kNarrowPartStride + 2 * lane);
      const int rp = rowpos_s[r];
      const float s0 = kp0 <= rp ? (a.x + b.x) * score_scale : -INFINITY;
      const float s1 = kp1 <= rp ? (a.y + b.y) * score_scale : -INFINITY;
      float mx = fmaxf(s0, s1);
#pragma unroll
      for (int x = 16; x >= 1; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
      const float m_new = fmaxf(m_run[j], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
      const float c = exp2f(m_run[j] - m_use);
      const float e0 = exp2f(s0 - m_use), e1 = exp2f(s1 - m_use);
      l_part[j] = l_part[j] * c + e0 + e1;
      m_run[j] = m_new;
      *reinterpret_cast<uint32_t*>(p_buf + r * kNarrowPStride + 2 * lane) = pack2<true>(e0, e1);
      if (lane == 0) corr[r] = c;
    }
  };
  // O^T[dims 64 pv_warp.., rows] = corr * O^T + V^T P^T over the step in `st`, P from p_buf.
  auto pv = [&](const unsigned char* st, const __half* p_buf, const float* corr) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float c0 = corr[8 * n + 2 * t], c1 = corr[8 * n + 2 * t + 1];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        o[mt][n][0] *= c0;
        o[mt][n][2] *= c0;
        o[mt][n][1] *= c1;
        o[mt][n][3] *= c1;
      }
    }
    const unsigned char* vb = st + lrow * kNarrowRowBytes + 64 * pv_warp + lcol;
#pragma unroll
    for (int q2 = 0; q2 < kStep / 32; ++q2) {
      uint32_t pb[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
        ldsm_x4(pb[n], p_buf + (8 * n + (lane & 7)) * kNarrowPStride + 32 * q2 + 8 * (lane >> 3));
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2) {
        const int kk = 2 * q2 + k2;
#pragma unroll
        for (int mp = 0; mp < 2; ++mp) {
          uint32_t r[4];
          ldsm_x4_trans(r, vb + 16 * kk * kNarrowRowBytes + 32 * mp);
          // r: codes (key 2t, dim 2g), (2t, 2g + 1), (2t + 1, 2g), (2t + 1, 2g + 1) -> per dim, keys 2t, 2t
          // + 1.
#pragma unroll
          for (int x = 0; x < 4; ++x) r[x] = __byte_perm(r[x], 0, 0x3120);
          const uint32_t aa[4] = {fp8x2_to_f16x2(r[0]), tc::fp8x2_hi_to_f16x2(r[0]), fp8x2_to_f16x2(r[1]),
                                  tc::fp8x2_hi_to_f16x2(r[1])};
          const uint32_t ab[4] = {fp8x2_to_f16x2(r[2]), tc::fp8x2_hi_to_f16x2(r[2]), fp8x2_to_f16x2(r[3]),
                                  tc::fp8x2_hi_to_f16x2(r[3])};
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            tc::mma_f16(o[2 * mp][n], aa, pb[n][2 * k2], pb[n][2 * k2 + 1]);
            tc::mma_f16(o[2 * mp + 1][n], ab, pb[n][2 * k2], pb[n][2 * k2 + 1]);
          }
        }
      }
    }
  };

  if constexpr (!WS) {
    // The first steps' copies go in flight before q is staged (q's loads then wait in their shadow).
    for (int T = 0; T < stages - 1; ++T) issue(T, T, T, 0, kBlock);
    stage_q();
    // Step i's ring slot (i % stages) and metadata slot (i % (stages + 1)).
    int cur = 0, mcur = 0;
    for (int i = 0; i < nsteps; ++i) {
      cp_async_wait_pending(stages - 2);
      __syncthreads();  // step i landed; every warp is done with step i - 1 (its stage, scores, P, meta)
      // Step i + stages - 1 goes to step i - 1's ring slot; its metadata is in slot (i - 2) % (stages + 1).
      issue(i + stages - 1, cur > 0 ? cur - 1 : stages - 1, mcur >= 2 ? mcur - 2 : mcur + stages - 1, 0,
            kBlock);
      const unsigned char* st = ring + cur * kStageBytes;
      if (meta_warp) {
        store_meta(mcur > 0 ? mcur - 1 : stages, next);  // step i + stages
        next = load_meta(i + stages + 1, pre_e);
        if (dsa) pre_e = topk_entry(i + stages + 2);
      }
      partial_scores(st, s_part);
      __syncthreads();
      softmax(meta_s + mcur * kStep, s_part, p_s, corr_s);
      __syncthreads();
      pv(st, p_s, corr_s);
      cur = cur + 1 == stages ? 0 : cur + 1;
      mcur = mcur + 1 == stages + 1 ? 0 : mcur + 1;
    }
  } else if (warp < 8) {
    // A: the partial scores and the softmax of each step, as soon as B says it has landed.
    int cur = 0, mcur = 0;
    for (int i = 0; i < nsteps; ++i) {
      const int b = i & 1;
      float* sp_buf = s_part + b * 2 * N * kNarrowPartStride;
      mla_wgmma_ptx::named_barrier(kBarFull + b, kBlock);  // step i has landed
      partial_scores(ring + cur * kStageBytes, sp_buf);
      mla_wgmma_ptx::named_barrier(kBarA, kBlock / 2);
      softmax(meta_s + mcur * kStep, sp_buf, p_s + b * N * kNarrowPStride, corr_s + b * kNarrowMaxRows);
      mla_wgmma_ptx::named_barrier_arrive(kBarP + b, kBlock);  // P and the correction of step i
      cur = cur + 1 == stages ? 0 : cur + 1;
      mcur = mcur + 1 == stages + 1 ? 0 : mcur + 1;
    }
  } else {
    // B: P V of each step, then the refill of its ring slot, and the landing of the step after next.
    for (int T = 0; T < stages; ++T) issue(T, T, T, kBlock / 2, kBlock / 2);
    if (nsteps > 0) {
      cp_async_wait_pending(stages - 1);
      mla_wgmma_ptx::named_barrier_arrive(kBarFull, kBlock);
    }
    if (nsteps > 1) {
      cp_async_wait_pending(stages - 2);
      mla_wgmma_ptx::named_barrier_arrive(kBarFull + 1, kBlock);
    }
    int cur = 0, mstore = stages;  // step j's ring slot; the metadata slot of step j + stages
    for (int j = 0; j < nsteps; ++j) {
      const int b = j & 1;
      mla_wgmma_ptx::named_barrier(kBarP + b, kBlock);
      pv(ring + cur * kStageBytes, p_s + b * N * kNarrowPStride, corr_s + b * kNarrowMaxRows);
      if (meta_warp) {
        store_meta(mstore, next);  // step j + stages
        next = load_meta(j + stages + 1, pre_e);
        if (dsa) pre_e = topk_entry(j + stages + 2);
      }
      mla_wgmma_ptx::named_barrier(kBarB, kBlock / 2);  // B is done with the slot; the metadata is in
      issue(j + stages, cur, mstore, kBlock / 2, kBlock / 2);
      if (j + 2 < nsteps) {
        cp_async_wait_pending(stages - 2);
        mla_wgmma_ptx::named_barrier_arrive(kBarFull + b, kBlock);  // step j + 2 (the parity of j)
      }
      cur = cur + 1 == stages ? 0 : cur + 1;
      mstore = mstore + 1 == stages + 1 ? 0 : mstore + 1;
    }
  }
  if (warp < 8)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float l = l_part[j];
#pragma unroll
      for (int x = 16; x >= 1; x >>= 1) l += __shfl_xor_sync(0xffffffffu, l, x);
      if (lane == 0) {
        l_s[warp + 8 * j] = l;
        m_s[warp + 8 * j] = m_run[j];
      }
    }
  cp_async_wait_pending(0);  // no copy may still target shared memory when the block exits
  __syncthreads();
  if (WS && warp < 8) return;  // B holds O^T
  const int rows_per_unit = qu * p.heads;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 8 * n + 2 * t + hf;
      int token, head;
      if (!row_token(r, token, head)) continue;
      const float l = l_s[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int dim0 = 64 * pv_warp + 2 * g;
      if (nsplit == 1) {
        const int64_t base = token * p.out_token_stride + static_cast<int64_t>(head) * kLatent + dim0;
        const float f = inv * p.kv_scale;
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          const float x = o[mt][n][hf] * f, y = o[mt][n][hf + 2] * f;
          if (p.out_bf16)
            *reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.out) + base + 16 * mt) = pack_bf16(x, y);
          else
            *reinterpret_cast<float2*>(static_cast<float*>(p.out) + base + 16 * mt) = make_float2(x, y);
        }
      } else {
        const int row_id = (r / hb) * p.heads + head;
        const size_t slot = (static_cast<size_t>(u) * max_splits + split) * rows_per_unit + row_id;
        float* dst = part + slot * kLatent + dim0;
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
          *reinterpret_cast<float2*>(dst + 16 * mt) = make_float2(o[mt][n][hf] * inv, o[mt][n][hf + 2] * inv);
        if (pv_warp == 0 && g == 0) lse[slot] = l > 0.f ? m_s[r] + log2f(l) : -INFINITY;
      }
    }
}

// One block per (unit, row of the unit): weights 2^(lse_s - max) over the unit's splits, in split order.
// own_plan: each unit's own plan (the narrow kernel's two-block schedule), else the batch's longest unit's.
// kB, kG: mla_split::combine_batch and combine_groups of the plan (blocks of kG x kLatent / 4 threads).
template <int kB, int kG>
__global__ void __launch_bounds__(kG* kLatent / 4, kG > 1    ? 2
                                                   : kB == 4 ? 12
                                                             : 8)
    mla_sm90_combine(MlaDecodeSm90Params p, int qu, int max_splits, int min_tiles, bool own_plan,
                     const float* __restrict__ lse, const float* __restrict__ part) {
  dev::grid_dep_enter();
  __shared__ int red[32];
  __shared__ float scratch[kG > 1 ? kG * kLatent / 4 * 6 : 1];
  const int u = blockIdx.x, row_id = blockIdx.y;
  const int j = row_id / p.heads, head = row_id % p.heads;
  const int token = p.topk ? u : u * p.q_per_seq + j;
  const int rows_per_unit = qu * p.heads;
  const size_t first = static_cast<size_t>(u) * max_splits * rows_per_unit + row_id;
  // The unit's splits (1: the split pass wrote its output), found while the first partial rows load.
  auto nsplit_of = [&]() {
    const int tps = own_plan ? split_tiles(unit_keys(p, u), max_splits, min_tiles)
                             : tiles_per_split(p, max_splits, min_tiles, red);
    return unit_splits(unit_keys(p, u), tps);
  };
  mla_split::combine_row<kLatent, false, kB, kG>(p, lse, part, first, rows_per_unit, max_splits, nsplit_of,
                                                 token, head, scratch);
}

void check_params(const mla_sm90::Config& c, const MlaDecodeSm90Params& p) {
  MS_CHECK(p.n_seqs > 0 && p.heads > 0, "mla_decode_sm90: n_seqs = {} and heads = {} must be positive",
           p.n_seqs, p.heads);
  MS_CHECK(p.q_per_seq >= 1 && p.q_per_seq <= 4, "mla_decode_sm90: q_per_seq = {} must be 1..4", p.q_per_seq);
  MS_CHECK(p.page_size > 0 && p.num_pages > 0 && p.block_table_stride > 0,
           "mla_decode_sm90: page_size {}, num_pages {} and block_table_stride {} must be positive",
           p.page_size, p.num_pages, p.block_table_stride);
  MS_CHECK(p.q && p.kv && p.block_table && p.positions && p.out,
           "mla_decode_sm90: q, kv, block_table, positions and out must all be set");
  MS_CHECK(p.topk != nullptr || p.seq_lens != nullptr, "mla_decode_sm90: a dense launch needs seq_lens");
  MS_CHECK((p.topk == nullptr) == (p.topk_width == 0) && p.topk_width >= 0,
           "mla_decode_sm90: topk pointer and topk_width {} disagree", p.topk_width);
  MS_CHECK(
      reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_token_stride % 8 == 0 &&
          p.q_token_stride >= static_cast<int64_t>(p.heads) * kDim,
      "mla_decode_sm90: q must be 16-byte aligned with q_token_stride (= {}) a multiple of 8 and >= heads * "
      "576",
      p.q_token_stride);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.kv) % 16 == 0, "mla_decode_sm90: kv pool must be 16-byte aligned");
  MS_CHECK(reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.out_token_stride % 4 == 0 &&
               p.out_token_stride >= static_cast<int64_t>(p.heads) * kLatent,
           "mla_decode_sm90: out must be 16-byte aligned with out_token_stride (= {}) a multiple of 4 and >= "
           "heads * 512",
           p.out_token_stride);
  MS_CHECK(c.heads_per_block > 0 && c.stages >= 2 && c.stages <= kMaxStages && c.max_splits >= 1 &&
               c.max_splits <= kMaxSplits && c.min_tiles_per_split >= 1,
           "mla_decode_sm90: no configuration (heads_per_block {}, stages {}): shared memory of {} bytes "
           "does not fit",
           c.heads_per_block, c.stages, c.smem);
  const int units = p.topk ? p.n_seqs * p.q_per_seq : p.n_seqs;
  MS_CHECK(c.units == units && c.q_per_unit == (p.topk ? 1 : p.q_per_seq),
           "mla_decode_sm90: config made for {} units of {} tokens, params have {} of {}", c.units,
           c.q_per_unit, units, p.topk ? 1 : p.q_per_seq);
  MS_CHECK(c.max_splits == 1 || (p.workspace && reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0),
           "mla_decode_sm90: workspace of {} bytes must be set and 256-byte aligned", c.workspace);
}

template <int NT>
void launch_narrow(const mla_sm90::Config& c, const MlaDecodeSm90Params& p, float* part, float* lse,
                   cudaStream_t stream) {
  auto* k = c.narrow_ws ? mla_sm90_narrow<NT, true> : mla_sm90_narrow<NT, false>;
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem)));
  const dim3 grid(c.max_splits, c.head_groups, c.units);
  launch_kernel("mla_decode_sm90_narrow", k, grid, c.narrow_ws ? 2 * kThreads : kThreads, c.smem, stream, p,
                c.heads_per_block, c.q_per_unit, c.stages, c.max_splits, c.min_tiles_per_split, part, lse);
}

template <int RG, bool FP8>
void launch(const mla_sm90::Config& c, const MlaDecodeSm90Params& p, float* part, float* lse,
            cudaStream_t stream) {
  auto* k = mla_sm90_split<RG, FP8>;
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem)));
  const dim3 grid(c.max_splits, c.head_groups, c.units);
  launch_kernel("mla_decode_sm90", k, grid, kThreads, c.smem, stream, p, c.heads_per_block, c.q_per_unit,
                c.stages, c.max_splits, c.min_tiles_per_split, part, lse);
}

}  // namespace

mla_sm90::Config mla_decode_sm90_choose(const MlaDecodeSm90Params& p, const DeviceLimits& dev) {
  const bool dsa = p.topk != nullptr;
  const int units = dsa ? p.n_seqs * p.q_per_seq : p.n_seqs;
  const int cap = p.max_heads_per_block > 0
                      ? p.max_heads_per_block
                      : mla_sm90::auto_heads_cap(dsa, units, p.heads, dev.multiprocessors);
  return mla_sm90::choose(units, dsa ? 1 : p.q_per_seq, p.heads, p.kv_fp8, dev, cap, !p.no_narrow);
}

void mla_decode_sm90(const mla_sm90::Config& c, const MlaDecodeSm90Params& p, cudaStream_t stream) {
  check_params(c, p);
  check_smem(current_device_caps(), "mla_decode_sm90", c.smem);
  MS_CHECK(c.units <= 65535, "mla_decode_sm90: {} units exceed the grid's z limit 65535", c.units);
  const size_t n = static_cast<size_t>(c.units) * c.max_splits * c.q_per_unit * p.heads;
  float* part = static_cast<float*>(p.workspace);
  float* lse = part ? part + (n * kLatent * 4 + 255) / 256 * 64 : nullptr;
  if (c.narrow_nt > 0) {
    MS_CHECK(p.kv_fp8, "mla_decode_sm90: the narrow configuration reads fp8 pages only");
    MS_CHECK(!c.narrow_ws || (c.stages >= 3 && c.blocks_per_sm == 1),
             "mla_decode_sm90: the narrow warp-specialised schedule needs one block a multiprocessor and a "
             "ring of "
             "3+ steps (stages {}, blocks {})",
             c.stages, c.blocks_per_sm);
    MS_CHECK(c.heads_per_block * c.q_per_unit <= 8 * c.narrow_nt,
             "mla_decode_sm90: {} rows a block exceed the narrow configuration's {}",
             c.heads_per_block * c.q_per_unit, 8 * c.narrow_nt);
    if (c.narrow_nt == 1)
      launch_narrow<1>(c, p, part, lse, stream);
    else if (c.narrow_nt == 2)
      launch_narrow<2>(c, p, part, lse, stream);
    else if (c.narrow_nt == 4)
      launch_narrow<4>(c, p, part, lse, stream);
    else
      MS_THROW("mla_decode_sm90: narrow_nt {} must be 1, 2 or 4", c.narrow_nt);
  } else {
    switch (c.row_groups * 2 + (p.kv_fp8 ? 1 : 0)) {
      case 2:
        launch<1, false>(c, p, part, lse, stream);
        break;
      case 3:
        launch<1, true>(c, p, part, lse, stream);
        break;
      case 4:
        launch<2, false>(c, p, part, lse, stream);
        break;
      case 5:
        launch<2, true>(c, p, part, lse, stream);
        break;
      case 8:
        launch<4, false>(c, p, part, lse, stream);
        break;
      case 9:
        launch<4, true>(c, p, part, lse, stream);
        break;
      default:
        MS_THROW("mla_decode_sm90: row_groups {} must be 1, 2 or 4", c.row_groups);
    }
  }
  if (c.max_splits > 1) {
    const int groups = mla_split::combine_groups(c.max_splits);
    auto* combine = groups > 1                                    ? mla_sm90_combine<8, 4>
                    : mla_split::combine_batch(c.max_splits) == 4 ? mla_sm90_combine<4, 1>
                                                                  : mla_sm90_combine<8, 1>;
    launch_kernel("mla_sm90_combine", combine, dim3(c.units, c.q_per_unit * p.heads), groups * kLatent / 4, 0,
                  stream, p, c.q_per_unit, c.max_splits, c.min_tiles_per_split,
                  c.narrow_nt > 0 && !c.narrow_ws, lse, part);
  }
}

}  // namespace ms::cuda
