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

// Columns d .. d + 3 of output row (token, head): the unit's nsplit partial rows (slots first + s x
// rows_per_unit of lse and part, part rows kLatent wide) weighted by 2^(lse_s - max lse) in split order,
// times the cache scale (fp8 pages; kFp8Only: the kernel takes no other) over the weights' sum (0 where no
// split saw a key).
template <int kLatent, bool kFp8Only>
__device__ __forceinline__ void combine_row(const MlaDecodeSm90Params& p, const float* __restrict__ lse,
                                            const float* __restrict__ part, size_t first, int rows_per_unit,
                                            int nsplit, int token, int head, int d) {
  float mx = -INFINITY;
  for (int s = 0; s < nsplit; ++s) mx = fmaxf(mx, lse[first + static_cast<size_t>(s) * rows_per_unit]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  if (mx != -INFINITY)
    for (int s = 0; s < nsplit; ++s) {
      const size_t slot = first + static_cast<size_t>(s) * rows_per_unit;
      const float w = exp2f(lse[slot] - mx);
      const float4 v = *reinterpret_cast<const float4*>(part + slot * kLatent + d);
      wsum += w;
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
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
