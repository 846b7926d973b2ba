// Routing: one warp per token row. The row's scores and selection values live in the warp's slice of shared
// memory; top-k is k rounds of a warp arg-max in which only the lane that owned the winner rescans its own
// experts (e = lane + 32 j), so a round costs one butterfly plus at most n_experts / 32 reads.
// Selection order is the CPU router's: higher value first, ties to the lower id (groups: lower group id).
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/moe/moe_route.h"

namespace ms::cuda {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kRouteThreads = kRouteWarps * 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ bool before(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// Every lane ends with the same (v, id): the largest under `before` (a total order on distinct ids).
__device__ __forceinline__ void warp_argmax(float& v, int& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, o);
    const int oi = __shfl_xor_sync(kFull, id, o);
    if (before(ov, oi, v, id)) {
      v = ov;
      id = oi;
    }
  }
}

// The lane's best remaining candidate among e = lane + 32 j (optionally only where filter[e] != 0);
// (-inf, INT_MAX) when it has none. Taken or excluded experts hold -inf.
__device__ __forceinline__ void lane_best(const float* val, int n, int lane, const uint8_t* filter, float& bv,
                                          int& bi) {
  bv = -INFINITY;
  bi = INT_MAX;
  for (int e = lane; e < n; e += 32) {
    const float v = val[e];
    if (v > bv && (filter == nullptr || filter[e] != 0)) {
      bv = v;
      bi = e;
    }
  }
}

// Appends up to `count` experts in selection order at ids[have..]; returns how many (uniform over the warp).
__device__ int pick(float* val, int n, int lane, const uint8_t* filter, int count, int32_t* ids, int have) {
  float bv;
  int bi;
  lane_best(val, n, lane, filter, bv, bi);
  int got = 0;
  for (; got < count; ++got) {
    float v = bv;
    int id = bi;
    warp_argmax(v, id);
    if (id == INT_MAX) break;
    if (lane == 0) ids[have + got] = id;
    if ((id & 31) == lane) {
      val[id] = -INFINITY;
      lane_best(val, n, lane, filter, bv, bi);
    }
  }
  return got;
}

// base_pass: OR the row's top-k0 into base_set (mask-1 rows only). Otherwise write the row's slots.
__global__ void __launch_bounds__(kRouteThreads)
    moe_route_kernel(const MoeRouteConfig cfg, const MoeRouteParams p, const bool base_pass) {
  dev::grid_dep_enter();
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRouteWarps + warp;
  if (row >= p.m) return;  // whole warps only: no block barrier follows
  const bool oea_row = cfg.oea_enabled && p.decode_mask != nullptr && p.decode_mask[row] != 0;
  if (base_pass && !oea_row) return;

  const int n = cfg.n_experts;
  float* s_score = route_smem + static_cast<size_t>(warp) * (2 * n + kMoeRouteMaxTopK);  // [n] unbiased
  float* s_val = s_score + n;                                                            // [n] selection
  int32_t* s_ids = reinterpret_cast<int32_t*>(s_val + n);                                // [top_k] picks
  const float* lg = p.logits + static_cast<int64_t>(row) * p.ld_logits;

  if (cfg.scoring == MoeScoring::Sigmoid) {
    for (int e = lane; e < n; e += 32) s_score[e] = 1.0f / (1.0f + expf(-lg[e]));
  } else {
    float mx = -INFINITY;
    for (int e = lane; e < n; e += 32) mx = fmaxf(mx, lg[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < n; e += 32) {
      const float x = expf(lg[e] - mx);
      s_score[e] = x;
      sum += x;
    }
    // A butterfly leaves the same bits in every lane (each step adds a commutative pair).
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
    const float inv = 1.0f / sum;
    for (int e = lane; e < n; e += 32) s_score[e] *= inv;
  }
  const float* bias = cfg.use_correction_bias ? p.correction_bias : nullptr;
  for (int e = lane; e < n; e += 32) {
    const float s = bias != nullptr ? s_score[e] + bias[e] : s_score[e];
    s_val[e] = s == s ? s : -INFINITY;  // a NaN is never selected
  }
  __syncwarp();

  if (cfg.n_group > 1) {
    const int gs = n / cfg.n_group;
    float gscore = -INFINITY;
    int gid = INT_MAX;
    if (lane < cfg.n_group) {
      const float* s = s_val + lane * gs;
      float best = -INFINITY, second = -INFINITY;
      for (int i = 0; i < gs; ++i) {
        if (s[i] > best) {
          second = best;
          best = s[i];
        } else if (s[i] > second) {
          second = s[i];
        }
      }
      gscore = cfg.group_score == MoeGroupScore::Max || gs == 1 ? best : best + second;
      gid = lane;
    }
    uint32_t keep = 0;
    for (int i = 0; i < cfg.topk_group; ++i) {
      float v = gscore;
      int id = gid;
      warp_argmax(v, id);
      if (id < kMoeRouteMaxGroups) keep |= 1u << id;
      if (id == lane) {
        gscore = -INFINITY;
        gid = INT_MAX;
      }
    }
    __syncwarp();  // group scans read other lanes' experts before the masking below rewrites them
    const float masked = cfg.masked_fill == MoeMaskedFill::Zero ? 0.0f : -INFINITY;
    for (int e = lane; e < n; e += 32)
      if (((keep >> (e / gs)) & 1u) == 0) s_val[e] = masked;
    __syncwarp();
  }

  if (base_pass) {
    const int used = pick(s_val, n, lane, nullptr, cfg.oea_k0, s_ids, 0);
    __syncwarp();
    if (lane < used) p.base_set[s_ids[lane]] = 1;  // plain byte stores of 1 from many rows: benign
    return;
  }
  int used;
  if (oea_row) {
    const int kmax = cfg.oea_kmax == 0 ? cfg.top_k : cfg.oea_kmax;
    used = pick(s_val, n, lane, nullptr, cfg.oea_k0, s_ids, 0);
    used += pick(s_val, n, lane, p.base_set, kmax - cfg.oea_k0, s_ids, used);
  } else {
    used = pick(s_val, n, lane, nullptr, cfg.top_k, s_ids, 0);
  }
  __syncwarp();
  // The sum runs in slot order on one lane, as the CPU router's does.
  float denom = 1.0f;
  if (cfg.norm_topk_prob) {
    float sum = 0.0f;
    if (lane == 0)
      for (int i = 0; i < used; ++i) sum += s_score[s_ids[i]];
    denom = __shfl_sync(kFull, sum, 0) + 1e-20f;
  }
  if (lane < cfg.top_k) {
    int32_t id = -1;
    float w = 0.0f;
    if (lane < used) {
      id = s_ids[lane];
      const float s = s_score[id];
      w = (cfg.norm_topk_prob ? s / denom : s) * cfg.routed_scaling_factor;
    }
    const int64_t o = static_cast<int64_t>(row) * cfg.top_k + lane;
    p.topk_ids[o] = id;
    p.topk_weights[o] = w;
  }
}

void launch_route(const MoeRouteConfig& cfg, const MoeRouteParams& p, bool base_pass, cudaStream_t stream) {
  const size_t smem = moe_route_smem_bytes(cfg.n_experts);
  check_smem(current_device_caps(), "moe_route", smem);
  const int blocks = (p.m + kRouteWarps - 1) / kRouteWarps;
  launch_kernel("moe_route", moe_route_kernel, blocks, kRouteThreads, smem, stream, cfg, p, base_pass);
}

}  // namespace

size_t moe_route_smem_bytes(int n_experts) {
  return static_cast<size_t>(kRouteWarps) * (2 * static_cast<size_t>(n_experts) + kMoeRouteMaxTopK) *
         sizeof(float);
}

void moe_route_check(const MoeRouteConfig& cfg, const MoeRouteParams& p) {
  MS_CHECK(cfg.n_experts >= 1 && cfg.n_experts <= kMoeRouteMaxExperts,
           "moe_route: n_experts {} is outside [1, {}]", cfg.n_experts, kMoeRouteMaxExperts);
  MS_CHECK(cfg.top_k >= 1 && cfg.top_k <= cfg.n_experts && cfg.top_k <= kMoeRouteMaxTopK,
           "moe_route: top_k {} is outside [1, min(n_experts {}, {})]", cfg.top_k, cfg.n_experts,
           kMoeRouteMaxTopK);
  MS_CHECK(cfg.n_group >= 1 && cfg.n_group <= kMoeRouteMaxGroups && cfg.n_experts % cfg.n_group == 0,
           "moe_route: n_group {} must be in [1, {}] and divide n_experts {}", cfg.n_group,
           kMoeRouteMaxGroups, cfg.n_experts);
  MS_CHECK(cfg.topk_group >= 1 && cfg.topk_group <= cfg.n_group,
           "moe_route: topk_group {} is outside [1, {}]", cfg.topk_group, cfg.n_group);
  MS_CHECK(
      cfg.masked_fill == MoeMaskedFill::Zero || cfg.topk_group * (cfg.n_experts / cfg.n_group) >= cfg.top_k,
      "moe_route: topk_group {} groups of {} experts hold fewer than top_k {}", cfg.topk_group,
      cfg.n_experts / cfg.n_group, cfg.top_k);
  MS_CHECK(std::isfinite(cfg.routed_scaling_factor), "moe_route: routed_scaling_factor is {}",
           cfg.routed_scaling_factor);
  if (cfg.oea_enabled) {
    MS_CHECK(cfg.oea_k0 >= 1 && cfg.oea_k0 <= cfg.top_k, "moe_route: oea_k0 {} is outside [1, top_k {}]",
             cfg.oea_k0, cfg.top_k);
    MS_CHECK(cfg.oea_kmax == 0 || (cfg.oea_kmax >= cfg.oea_k0 && cfg.oea_kmax <= cfg.top_k),
             "moe_route: oea_kmax {} is outside [oea_k0 {}, top_k {}] (0 means top_k)", cfg.oea_kmax,
             cfg.oea_k0, cfg.top_k);
    MS_CHECK(p.base_set != nullptr, "moe_route: base_set is null but oea_enabled is set");
  }
  MS_CHECK(p.m >= 0, "moe_route: m is {}", p.m);
  if (p.m == 0) return;
  MS_CHECK(p.logits != nullptr && p.ld_logits >= cfg.n_experts,
           "moe_route: logits is null or ld_logits {} is below n_experts {}", p.ld_logits, cfg.n_experts);
  MS_CHECK(!cfg.use_correction_bias || p.correction_bias != nullptr,
           "moe_route: use_correction_bias is set but correction_bias is null");
  MS_CHECK(p.topk_ids != nullptr && p.topk_weights != nullptr, "moe_route: topk_ids / topk_weights is null");
}

void moe_route_base_set(const MoeRouteConfig& cfg, const MoeRouteParams& p, cudaStream_t stream) {
  moe_route_check(cfg, p);
  MS_CHECK(cfg.oea_enabled, "moe_route_base_set: oea_enabled is false");
  CUDA_CHECK(cudaMemsetAsync(p.base_set, 0, static_cast<size_t>(cfg.n_experts), stream));
  if (p.m == 0 || p.decode_mask == nullptr) return;  // no mask-1 row: the base set stays empty
  launch_route(cfg, p, true, stream);
}

void moe_route_select(const MoeRouteConfig& cfg, const MoeRouteParams& p, cudaStream_t stream) {
  moe_route_check(cfg, p);
  if (p.m == 0) return;
  launch_route(cfg, p, false, stream);
}

void moe_route(const MoeRouteConfig& cfg, const MoeRouteParams& p, cudaStream_t stream) {
  if (cfg.oea_enabled) moe_route_base_set(cfg, p, stream);
  moe_route_select(cfg, p, stream);
}

}  // namespace ms::cuda
