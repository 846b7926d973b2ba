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

// Columns d .. d + 3 of output row (token, head): the unit's partial rows (slots first + s x rows_per_unit of
// lse and part, part rows kLatent wide, s < nsplit) weighted by 2^(lse_s - max lse) in split order, times the
// cache scale (fp8 pages; kFp8Only: the kernel takes no other) over the weights' sum (0 where no split saw a
// key). nsplit_of() gives the unit's split count (called once by every thread: it may hold a barrier); the
// first kB splits' loads go out before it, every load of a batch at once (a unit's slots up to max_splits lie
// inside the workspace; those past nsplit are loaded and never used). Batches after the first rescale the
// running sums to the new maximum, so up to kB splits the sums are those of a single pass over all splits.
// Returns without writing where nsplit <= 1 (the split pass wrote the row).
template <int kLatent, bool kFp8Only, int kB, typename SplitsOf>
__device__ __forceinline__ void combine_row(const MlaDecodeSm90Params& p, const float* __restrict__ lse,
                                            const float* __restrict__ part, size_t first, int rows_per_unit,
                                            int max_splits, SplitsOf&& nsplit_of, int token, int head,
                                            int d) {
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
  load(0, max_splits);
  const int nsplit = nsplit_of();
  if (nsplit <= 1) return;
  float mx = -INFINITY, wsum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < nsplit; s0 += kB) {
    if (s0 > 0) load(s0, nsplit);
    float bm = mx;
#pragma unroll
    for (int i = 0; i < kB; ++i)
      if (s0 + i < nsplit) bm = fmaxf(bm, l[i]);
    if (bm == -INFINITY) continue;  // no split so far saw a key
    const float c = mx == -INFINITY ? 0.f : exp2f(mx - bm);
    wsum *= c;
    acc.x *= c;
    acc.y *= c;
    acc.z *= c;
    acc.w *= c;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      if (s0 + i >= nsplit) continue;
      const float w = exp2f(l[i] - bm);
      wsum += w;
      acc.x = fmaf(w, v[i].x, acc.x);
      acc.y = fmaf(w, v[i].y, acc.y);
      acc.z = fmaf(w, v[i].z, acc.z);
      acc.w = fmaf(w, v[i].w, acc.w);
    }
    mx = bm;
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
