// Device pieces of the split-KV plan that the fp8/bf16 decode kernel (mla_decode_sm90.cu) and the warpgroup
// kernel (mla_decode_wgmma.cu) share: how many splits a unit's keys take, and the combine of one output row
// from the splits' partial rows. Each kernel keeps its own tile width and its own count of a unit's keys.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/mla_decode/mla_decode_sm90.h"

namespace ms::cuda::mla_split {

// Splits of a unit with `keys` keys at `tps` tiles of kTileKeys a split (at least one, also for no keys).
template <int kTileKeys>
__device__ __forceinline__ int unit_splits(int keys, int tps) {
  return max(1, ((keys + kTileKeys - 1) / kTileKeys + tps - 1) / tps);
}

// Splits whose log-sum-exps and partial columns one combine thread loads at once: 4 where a unit has at
// most 4 splits (the combine then holds 40 registers, 12 blocks a multiprocessor, which matters where 64
// rows a unit give thousands of blocks), else 8 (64 registers; up to 128 splits of one unit at batch 1,
// where each batch's round trip is on the path and the blocks are few). On an H200 (docs/PERFORMANCE.md):
// 8 at 128 splits 7% faster than 4, 8 at 2-4 splits of 64 rows 1-2% slower.
constexpr int combine_batch(int max_splits) {
  return max_splits > 4 ? 8 : 4;
}
// Groups of threads that take a share of a row's splits each (kLatent / 4 threads a group, one block a row):
// 4 from 32 splits (then at most a few units, so few blocks), so that a group's batches one after another
// are a quarter as many; else 1.
constexpr int combine_groups(int max_splits) {
  return max_splits >= 32 ? 4 : 1;
}

// Columns d .. d + 3 of output row (token, head): the unit's partial rows (slots first + s x rows_per_unit of
// lse and part, part rows kLatent wide, s < nsplit) weighted by 2^(lse_s - max lse), times the cache scale
// (fp8 pages; kFp8Only: the kernel takes no other) over the weights' sum (0 where no split saw a key).
// nsplit_of() gives the unit's split count (called once by every thread: it may hold a barrier). With kG
// groups, group q (threads q x kLatent / 4 ..) takes splits [q per, (q + 1) per), per = max_splits / kG
// rounded up; each group's first kB splits' loads go out before nsplit_of, every load of a batch at once (a
// unit's slots up to max_splits lie inside the workspace; those past nsplit are loaded and never used).
// Batches after the first rescale the running sums to the new maximum, so with one group and up to kB splits
// the sums are those of one pass in split order; the groups' sums meet in `scratch` (kG x kLatent / 4 x 6
// floats of shared memory; unused with one group) in group order. Deterministic. Returns without writing
// where nsplit <= 1 (the split pass wrote the row).
template <int kLatent, bool kFp8Only, int kB, int kG, typename SplitsOf>
__device__ __forceinline__ void combine_row(const MlaDecodeSm90Params& p, const float* __restrict__ lse,
                                            const float* __restrict__ part, size_t first, int rows_per_unit,
                                            int max_splits, SplitsOf&& nsplit_of, int token, int head,
                                            float* scratch) {
  constexpr int kT = kLatent / 4;  // threads a group
  const int tid = static_cast<int>(threadIdx.x);
  const int q = kG > 1 ? tid / kT : 0, col = kG > 1 ? tid % kT : tid;
  const int d = 4 * col;
  const int per = (max_splits + kG - 1) / kG, lo = q * per;
  float l[kB];
  float4 v[kB];
  auto load = [&](int s0, int end) {
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      l[i] = -INFINITY;
      v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s0 + i < end) {
        const size_t slot = first + static_cast<size_t>(s0 + i) * rows_per_unit;
        l[i] = lse[slot];
        v[i] = *reinterpret_cast<const float4*>(part + slot * kLatent + d);
      }
    }
  };
  load(lo, min(lo + per, max_splits));
  const int nsplit = nsplit_of();
  if (nsplit <= 1) return;
  const int hi = min(lo + per, nsplit);
  float mx = -INFINITY, wsum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = lo; s0 < hi; s0 += kB) {
    if (s0 > lo) load(s0, hi);
    float bm = mx;
#pragma unroll
    for (int i = 0; i < kB; ++i)
      if (s0 + i < hi) bm = fmaxf(bm, l[i]);
    if (bm == -INFINITY) continue;  // no split so far saw a key
    const float c = mx == -INFINITY ? 0.f : exp2f(mx - bm);
    wsum *= c;
    acc.x *= c;
    acc.y *= c;
    acc.z *= c;
    acc.w *= c;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      if (s0 + i >= hi) continue;
      const float w = exp2f(l[i] - bm);
      wsum += w;
      acc.x = fmaf(w, v[i].x, acc.x);
      acc.y = fmaf(w, v[i].y, acc.y);
      acc.z = fmaf(w, v[i].z, acc.z);
      acc.w = fmaf(w, v[i].w, acc.w);
    }
    mx = bm;
  }
  if constexpr (kG > 1) {
    float* mine = scratch + (q * kT + col) * 6;
    mine[0] = mx;
    mine[1] = wsum;
    mine[2] = acc.x;
    mine[3] = acc.y;
    mine[4] = acc.z;
    mine[5] = acc.w;
    __syncthreads();
    if (q != 0) return;
    float m_all = -INFINITY;
#pragma unroll
    for (int g = 0; g < kG; ++g) m_all = fmaxf(m_all, scratch[(g * kT + col) * 6]);
    wsum = 0.f;
    acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (m_all != -INFINITY)
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float* o = scratch + (g * kT + col) * 6;
        if (o[0] == -INFINITY) continue;  // the group's splits saw no key
        const float c = exp2f(o[0] - m_all);
        wsum = fmaf(o[1], c, wsum);
        acc.x = fmaf(o[2], c, acc.x);
        acc.y = fmaf(o[3], c, acc.y);
        acc.z = fmaf(o[4], c, acc.z);
        acc.w = fmaf(o[5], c, acc.w);
      }
  }
  const float f = wsum > 0.f ? (kFp8Only || p.kv_fp8 ? p.kv_scale : 1.f) / wsum : 0.f;
  const int64_t o = token * p.out_token_stride + static_cast<int64_t>(head) * kLatent + d;
  if (p.out_bf16)
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.out) + o) =
        make_uint2(tc::pack_bf16(acc.x * f, acc.y * f), tc::pack_bf16(acc.z * f, acc.w * f));
  else
    *reinterpret_cast<float4*>(static_cast<float*>(p.out) + o) =
        make_float4(acc.x * f, acc.y * f, acc.z * f, acc.w * f);
}

}  // namespace ms::cuda::mla_split
