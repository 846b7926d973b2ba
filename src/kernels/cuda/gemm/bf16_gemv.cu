// BF16 GEMV for few rows of x on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate), one launch.
//
// Work split (bf16_gemv_config.h): warp w of a block owns kWarpK = 128 consecutive k of every slice and walks
// the block's 16-row tiles slice by slice; its partial sums for each (x row, weight row) stay in shared
// memory
// ([warps][m][rows], added to in place: each entry has one owning lane), so nothing crosses warps until the
// end. There the warps' sums are added in warp order; a block that shares its rows with others along k writes
// them to `partial`, and the last of those blocks to finish (a counter per row block) adds the splits in
// split order and writes y: deterministic, no second kernel.
//
// Loads: in one 128-wide step lane (g = lane / 4, t = lane % 4) loads, for q = 0..3, 16 bytes of rows g and
// g + 8 of the tile at k = 32q + 8t: each load instruction covers 64 contiguous bytes of 16 rows, and the
// eight loads of the next tile are issued before the current tile is multiplied (two register buffers).
// Fragment mapping: the dot product does not care in which order k is visited, so the mma's k positions
// {2t, 2t+1} and {2t+8, 2t+9} of lane t take that lane's own 8 loaded elements, 4 per mma: A = (row g, words
// 0 and 1 of the load; row g + 8 likewise), B = x[g] at the same 4 elements, read as f32 (L1-resident after
// the first tile) and rounded to bf16 in registers. mma columns are x rows (g < m; zero B beyond m).
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/bf16_gemv_config.h"

namespace ms::cuda {
namespace {

using bf16_gemv_config::Config;
using bf16_gemv_config::kMaxThreads;
using bf16_gemv_config::kTileRows;
using bf16_gemv_config::kWarpK;
using tc::mma_bf16;
using tc::pack_bf16;

// x_vec4: x 16-byte aligned with x_stride % 4 == 0 (float4 loads).
template <int M>
__global__ void __launch_bounds__(kMaxThreads, 2) bf16_gemv_kernel(Bf16GemvParams p, Config c, int x_vec4) {
  extern __shared__ float red[];  // [c.warps][M][rs]: rows of x rs = rb + 4 apart
  __shared__ int is_last;
  const int rb = kTileRows * c.tiles_per_block;
  // The +4 puts the four lanes t of a row g (x rows 2t + e) on different banks.
  const int rs = bf16_gemv_config::red_row_stride(c);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  for (int i = threadIdx.x; i < c.warps * M * rs; i += blockDim.x) red[i] = 0.f;
  const int row_base = blockIdx.x * rb;
  const int tiles = min(c.tiles_per_block, (p.n - row_base + kTileRows - 1) / kTileRows);
  const int s0 = blockIdx.y * c.slices_per_block, s1 = min(s0 + c.slices_per_block, c.slices);
  const int iters = (s1 - s0) * tiles;
  __syncthreads();  // red zeroed

  // Iteration it: slice s0 + it / tiles, tile it % tiles (slice-major: a warp's x stays the same 128 k for
  // a whole slice).
  auto load = [&](int it, uint4(&buf)[2][4]) {
    const int kc = ((s0 + it / tiles) * c.warps + warp) * kWarpK, tile = it % tiles;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row_base + tile * kTileRows + g + 8 * h, p.n - 1);
      const __nv_bfloat16* src = p.w + static_cast<size_t>(row) * p.w_stride;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int kk = kc + 32 * q + 8 * t;
        buf[h][q] = kk < p.k ? dev::ld_stream16_l2_256(src + kk) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto compute = [&](int it, const uint4(&buf)[2][4]) {
    const int kc = ((s0 + it / tiles) * c.warps + warp) * kWarpK, tile = it % tiles;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int kk = kc + 32 * q + 8 * t;
      uint32_t b[4] = {0u, 0u, 0u, 0u};
      if (g < M && g < p.m && kk < p.k) {
        const float* xs = p.x + static_cast<size_t>(g) * p.x_stride + kk;
        float v[8];
        if (x_vec4) {
          const float4 lo = __ldg(reinterpret_cast<const float4*>(xs));
          const float4 hi = __ldg(reinterpret_cast<const float4*>(xs) + 1);
          v[0] = lo.x;
          v[1] = lo.y;
          v[2] = lo.z;
          v[3] = lo.w;
          v[4] = hi.x;
          v[5] = hi.y;
          v[6] = hi.z;
          v[7] = hi.w;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = __ldg(xs + e);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) b[e] = pack_bf16(v[2 * e], v[2 * e + 1]);
      }
      mma_bf16(acc, buf[0][q].x, buf[1][q].x, buf[0][q].y, buf[1][q].y, b[0], b[1]);
      mma_bf16(acc, buf[0][q].z, buf[1][q].z, buf[0][q].w, buf[1][q].w, b[2], b[3]);
    }
    // acc[0], acc[1]: weight row g, x rows 2t and 2t + 1; acc[2], acc[3]: weight row g + 8.
    const int tr = tile * kTileRows + g;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 2 * t + e;
      if (col < M) {
        red[(warp * M + col) * rs + tr] += acc[e];
        red[(warp * M + col) * rs + tr + 8] += acc[2 + e];
      }
    }
  };

  uint4 wa[2][4], wb[2][4];
  if (iters > 0) load(0, wa);
  for (int it = 0; it < iters; it += 2) {
    if (it + 1 < iters) load(it + 1, wb);
    compute(it, wa);
    if (it + 1 >= iters) break;
    if (it + 2 < iters) load(it + 2, wa);
    compute(it + 1, wb);
  }
  __syncthreads();

  const int rows_here = min(rb, p.n - row_base);
  const bool split = gridDim.y > 1;
  for (int i = threadIdx.x; i < p.m * rows_here; i += blockDim.x) {
    const int col = i / rows_here, tr = i % rows_here, row = row_base + tr;
    float s = 0.f;
    for (int w = 0; w < c.warps; ++w) s += red[(w * M + col) * rs + tr];
    if (split)
      p.partial[(static_cast<size_t>(blockIdx.y) * p.m + col) * p.n + row] = s;
    else
      p.y[static_cast<size_t>(col) * p.y_stride + row] = s;
  }
  if (!split) return;
  // The last block of this row block to arrive adds every split's sums (its own included) in split order.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&p.counters[blockIdx.x], 1u) == gridDim.y - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < p.m * rows_here; i += blockDim.x) {
    const int col = i / rows_here, tr = i % rows_here, row = row_base + tr;
    float s = 0.f;
    for (int sp = 0; sp < static_cast<int>(gridDim.y); ++sp)
      s += __ldcg(p.partial + (static_cast<size_t>(sp) * p.m + col) * p.n + row);
    p.y[static_cast<size_t>(col) * p.y_stride + row] = s;
  }
  if (threadIdx.x == 0) atomicExch(&p.counters[blockIdx.x], 0u);
}

template <int M>
void launch(const Bf16GemvParams& p, const Config& c, int x_vec4, cudaStream_t stream) {
  const size_t smem = bf16_gemv_config::smem_bytes(M, c);
  auto* kernel = bf16_gemv_kernel<M>;
  if (smem > 48 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(c.row_blocks), static_cast<unsigned>(c.splits));
  kernel<<<grid, c.warps * 32, smem, stream>>>(p, c, x_vec4);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

Bf16GemvScratch bf16_gemv_scratch_bytes(int m, int n, int k) {
  return {bf16_gemv_config::partial_bytes_bound(m, n, k), bf16_gemv_config::counter_bytes_bound(n, k)};
}

namespace {

void check_params(const Bf16GemvParams& p) {
  MS_CHECK(p.m >= 1 && p.m <= kBf16GemvMaxM, "bf16_gemv: m = {} outside [1, {}]; use a GEMM", p.m,
           kBf16GemvMaxM);
  MS_CHECK(p.n > 0, "bf16_gemv: n = {} must be positive", p.n);
  MS_CHECK(p.k > 0 && p.k % 8 == 0, "bf16_gemv: k = {} must be a positive multiple of 8", p.k);
  check_matrix(p.x, p.m, p.k, p.x_stride, "bf16_gemv", "x");
  check_matrix(p.w, p.n, p.k, p.w_stride, "bf16_gemv", "w");
  check_matrix(p.y, p.m, p.n, p.y_stride, "bf16_gemv", "y");
  MS_CHECK(is_aligned(p.w, 16) && p.w_stride % 8 == 0,
           "bf16_gemv: w must be 16-byte aligned with a row stride that is a multiple of 8 (stride {})",
           p.w_stride);
}

void run(const Bf16GemvParams& p, const Config& c, const DeviceCaps& caps, cudaStream_t stream) {
  const std::string why = bf16_gemv_config::why_invalid(c, p.n, p.k);
  MS_CHECK(why.empty(), "bf16_gemv: configuration for n = {}, k = {}: {}", p.n, p.k, why);
  check_fit(caps, bf16_gemv_config::need(p.m, c));
  if (c.splits > 1) {
    MS_CHECK(
        p.partial != nullptr && is_aligned(p.partial, 4),
        "bf16_gemv: partial is null but m={} n={} k={} splits k in {} ({} bytes; bf16_gemv_scratch_bytes "
        "bounds it)",
        p.m, p.n, p.k, c.splits, static_cast<size_t>(c.splits) * p.m * p.n * sizeof(float));
    MS_CHECK(p.counters != nullptr && is_aligned(p.counters, 4),
             "bf16_gemv: counters is null but m={} n={} k={} splits k in {} ({} zeroed counters)", p.m, p.n,
             p.k, c.splits, c.row_blocks);
  }
  const int x_vec4 = is_aligned(p.x, 16) && p.x_stride % 4 == 0;
  switch (bf16_gemv_config::m_template(p.m)) {
    case 1:
      launch<1>(p, c, x_vec4, stream);
      break;
    case 2:
      launch<2>(p, c, x_vec4, stream);
      break;
    case 4:
      launch<4>(p, c, x_vec4, stream);
      break;
    default:
      launch<8>(p, c, x_vec4, stream);
      break;
  }
}

}  // namespace

void bf16_gemv(const Bf16GemvParams& p, cudaStream_t stream) {
  check_params(p);
  const DeviceCaps caps = current_device_caps();
  run(p, bf16_gemv_config::choose(p.m, p.n, p.k, limits_of(caps)), caps, stream);
}

void bf16_gemv_with(const Bf16GemvParams& p, const Config& c, cudaStream_t stream) {
  check_params(p);
  run(p, c, current_device_caps(), stream);
}

}  // namespace ms::cuda
