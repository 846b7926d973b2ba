// BF16 GEMV for few rows of x on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate), one launch.
//
// Work split (bf16_gemv_config.h): warp w of a block owns warp_k consecutive k of every slice (128 for bf16,
// 256 for fp8) and walks the block's 16-row tiles slice by slice; its partial sums for each (x row, weight
// row) stay in shared memory ([warps][m][rows], added to in place: each entry has one owning lane), so
// nothing crosses warps until the end. There the warps' sums are added in warp order; a block that shares its
// rows with others along k writes them to `partial`, and the last of those blocks to finish (a counter per
// row block) adds the splits in split order and writes y: deterministic, no second kernel.
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
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/bf16_gemv_config.h"

namespace ms::cuda {
namespace {

using bf16_gemv_config::Config;
using bf16_gemv_config::kMaxThreads;
using bf16_gemv_config::kTileRows;
using tc::mma_bf16;
using tc::pack_bf16;

// What the kernel reads, for either weight format: the public params with the weight as bytes.
struct GemvArgs {
  const float* __restrict__ x;  // [m, k] rows x_stride apart
  int64_t x_stride;
  const uint8_t* __restrict__ w;  // [n, k] rows w_stride_bytes apart, row 0 = weight row row0
  int64_t w_stride_bytes;
  const float* __restrict__ w_scale;  // FP8Block: [ceil(rows / 128), scale_cols] of the whole weight
  int64_t scale_cols, row0;
  float* __restrict__ y;  // [m, n] rows y_stride apart
  int64_t y_stride;
  int m, n, k;
  float* __restrict__ partial;
  uint32_t* __restrict__ counters;
  int x_vec4;  // x 16-byte aligned with x_stride % 4 == 0 (float4 loads)
};

// v[0..N) = x[g, kk .. kk + N) (f32), float4 loads when x_vec4.
template <int N>
__device__ __forceinline__ void load_x(const GemvArgs& p, int g, int kk, float (&v)[N]) {
  const float* xs = p.x + static_cast<size_t>(g) * p.x_stride + kk;
  if (p.x_vec4) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(xs) + i);
      v[4 * i] = f.x;
      v[4 * i + 1] = f.y;
      v[4 * i + 2] = f.z;
      v[4 * i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = __ldg(xs + e);
  }
}

using dev::word_of;

// FP8 (kFp8): lane t's 16-byte load holds 16 consecutive k of its row (k = 64q + 16t of the warp's 256), each
// fp8 pair widened exactly to a bf16 pair; the 4 mmas per load pair words (2j, 2j+1) with x pairs (2j, 2j+1)
// as the bf16 path pairs words (0, 1) and (2, 3). The products are summed apart for the two 128-wide scale
// blocks of the warp's 256 and multiplied by each row's block scale before they meet.
template <int M, bool kFp8>
__global__ void __launch_bounds__(kMaxThreads, 2) gemv_kernel(GemvArgs p, Config c) {
  constexpr int kWk =
      bf16_gemv_config::warp_k(kFp8 ? bf16_gemv_config::Weights::FP8Block : bf16_gemv_config::Weights::BF16);
  constexpr int kLaneK = kFp8 ? 16 : 8;  // k per 16-byte load
  extern __shared__ float red[];         // [c.warps][M][rs]: rows of x rs = rb + 4 apart
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

  // Iteration it: slice s0 + it / tiles, tile it % tiles (slice-major: a warp's x stays the same k range for
  // a whole slice).
  auto load = [&](int it, uint4(&buf)[2][4]) {
    const int kc = ((s0 + it / tiles) * c.warps + warp) * kWk, tile = it % tiles;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row_base + tile * kTileRows + g + 8 * h, p.n - 1);
      const uint8_t* src = p.w + static_cast<size_t>(row) * p.w_stride_bytes;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int kk = kc + 4 * kLaneK * q + kLaneK * t;
        buf[h][q] = kk < p.k ? dev::ld_stream16_l2_256(src + static_cast<size_t>(kk) * (kFp8 ? 1 : 2))
                             : make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto compute = [&](int it, const uint4(&buf)[2][4]) {
    const int kc = ((s0 + it / tiles) * c.warps + warp) * kWk, tile = it % tiles;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (!kFp8) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int kk = kc + 32 * q + 8 * t;
        uint32_t b[4] = {0u, 0u, 0u, 0u};
        if (g < M && g < p.m && kk < p.k) {
          float v[8];
          load_x(p, g, kk, v);
#pragma unroll
          for (int e = 0; e < 4; ++e) b[e] = pack_bf16(v[2 * e], v[2 * e + 1]);
        }
        mma_bf16(acc, buf[0][q].x, buf[1][q].x, buf[0][q].y, buf[1][q].y, b[0], b[1]);
        mma_bf16(acc, buf[0][q].z, buf[1][q].z, buf[0][q].w, buf[1][q].w, b[2], b[3]);
      }
    } else {
      float part[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // per 128-wide scale block
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int kk = kc + 64 * q + 16 * t;
        uint32_t b[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        if (g < M && g < p.m && kk < p.k) {
          float v[16];
          load_x(p, g, kk, v);
#pragma unroll
          for (int e = 0; e < 8; ++e) b[e] = pack_bf16(v[2 * e], v[2 * e + 1]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t w0 = word_of(buf[0][q], j), w1 = word_of(buf[1][q], j);
          mma_bf16(part[q >> 1], tc::fp8x2_to_bf16x2(w0), tc::fp8x2_to_bf16x2(w1),
                   tc::fp8x2_to_bf16x2(w0 >> 16), tc::fp8x2_to_bf16x2(w1 >> 16), b[2 * j], b[2 * j + 1]);
        }
      }
      // Scales of rows g and g + 8 (as loaded: clamped to n - 1) for the warp's two k blocks.
      const int kb = kc / 128;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = p.row0 + min(row_base + tile * kTileRows + g + 8 * h, p.n - 1);
        const float* srow = p.w_scale + (row / 128) * p.scale_cols;
        const float sa = kb < p.scale_cols ? __ldg(srow + kb) : 0.f;
        const float sb = kb + 1 < p.scale_cols ? __ldg(srow + kb + 1) : 0.f;
        acc[2 * h] = part[0][2 * h] * sa + part[1][2 * h] * sb;
        acc[2 * h + 1] = part[0][2 * h + 1] * sa + part[1][2 * h + 1] * sb;
      }
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

  // The first weight loads (nothing writes weights) go out before waiting for the kernel before this one
  // (programmatic dependent launch: x, y, the partial sums and the counters are touched only after).
  uint4 wa[2][4], wb[2][4];
  if (iters > 0) load(0, wa);
  dev::grid_dep_wait();
  dev::grid_dep_launch_dependents();
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

template <int M, bool kFp8>
void launch(const GemvArgs& p, const Config& c, cudaStream_t stream) {
  const size_t smem = bf16_gemv_config::smem_bytes(M, c);
  auto* kernel = gemv_kernel<M, kFp8>;
  if (smem > 48 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(c.row_blocks), static_cast<unsigned>(c.splits));
  launch_kernel(kFp8 ? "fp8_block_gemv" : "bf16_gemv", kernel, grid, dim3(c.warps * 32), smem, stream, p, c);
}

template <bool kFp8>
void launch_m(const GemvArgs& p, const Config& c, cudaStream_t stream) {
  switch (bf16_gemv_config::m_template(p.m)) {
    case 1:
      launch<1, kFp8>(p, c, stream);
      break;
    case 2:
      launch<2, kFp8>(p, c, stream);
      break;
    case 4:
      launch<4, kFp8>(p, c, stream);
      break;
    default:
      launch<8, kFp8>(p, c, stream);
      break;
  }
}

using bf16_gemv_config::Weights;

const char* kernel_name(Weights w) {
  return w == Weights::FP8Block ? "fp8_block_gemv" : "bf16_gemv";
}

// Shape, x, y and alignment checks shared by both formats (the weight's own in the callers).
void check_common(const char* name, int m, int n, int k, int k_multiple, const float* x, int64_t x_stride,
                  const float* y, int64_t y_stride) {
  MS_CHECK(m >= 1 && m <= kBf16GemvMaxM, "{}: m = {} outside [1, {}]; use a GEMM", name, m, kBf16GemvMaxM);
  MS_CHECK(n > 0, "{}: n = {} must be positive", name, n);
  MS_CHECK(k > 0 && k % k_multiple == 0, "{}: k = {} must be a positive multiple of {}", name, k, k_multiple);
  check_matrix(x, m, k, x_stride, name, "x");
  check_matrix(y, m, n, y_stride, name, "y");
}

void run(GemvArgs a, Weights w, const Config& c, const DeviceCaps& caps, cudaStream_t stream) {
  const char* name = kernel_name(w);
  const std::string why = bf16_gemv_config::why_invalid(c, a.n, a.k, w);
  MS_CHECK(why.empty(), "{}: configuration for n = {}, k = {}: {}", name, a.n, a.k, why);
  check_fit(caps, bf16_gemv_config::need(a.m, c, w));
  if (c.splits > 1) {
    MS_CHECK(a.partial != nullptr && is_aligned(a.partial, 4),
             "{}: partial is null but m={} n={} k={} splits k in {} ({} bytes; the scratch_bytes function "
             "bounds it)",
             name, a.m, a.n, a.k, c.splits, static_cast<size_t>(c.splits) * a.m * a.n * sizeof(float));
    MS_CHECK(a.counters != nullptr && is_aligned(a.counters, 4),
             "{}: counters is null but m={} n={} k={} splits k in {} ({} zeroed counters)", name, a.m, a.n,
             a.k, c.splits, c.row_blocks);
  }
  a.x_vec4 = is_aligned(a.x, 16) && a.x_stride % 4 == 0;
  if (w == Weights::FP8Block)
    launch_m<true>(a, c, stream);
  else
    launch_m<false>(a, c, stream);
}

GemvArgs args_of(const Bf16GemvParams& p) {
  check_common("bf16_gemv", p.m, p.n, p.k, 8, p.x, p.x_stride, p.y, p.y_stride);
  check_matrix(p.w, p.n, p.k, p.w_stride, "bf16_gemv", "w");
  MS_CHECK(is_aligned(p.w, 16) && p.w_stride % 8 == 0,
           "bf16_gemv: w must be 16-byte aligned with a row stride that is a multiple of 8 (stride {})",
           p.w_stride);
  return {p.x,
          p.x_stride,
          reinterpret_cast<const uint8_t*>(p.w),
          p.w_stride * 2,
          nullptr,
          0,
          0,
          p.y,
          p.y_stride,
          p.m,
          p.n,
          p.k,
          p.partial,
          p.counters,
          0};
}

GemvArgs args_of(const Fp8BlockGemvParams& p) {
  check_common("fp8_block_gemv", p.m, p.n, p.k, 16, p.x, p.x_stride, p.y, p.y_stride);
  check_matrix(p.w, p.n, p.k, p.k, "fp8_block_gemv", "w");
  MS_CHECK(is_aligned(p.w, 16), "fp8_block_gemv: w must be 16-byte aligned");
  MS_CHECK(p.row0 >= 0 && p.w_scale != nullptr,
           "fp8_block_gemv: row0 = {} and w_scale (null: {}) must be set", p.row0, p.w_scale == nullptr);
  return {p.x,       p.x_stride, p.w + p.row0 * p.k,
          p.k,       p.w_scale,  (p.k + 127) / 128,
          p.row0,    p.y,        p.y_stride,
          p.m,       p.n,        p.k,
          p.partial, p.counters, 0};
}

}  // namespace

Bf16GemvScratch bf16_gemv_scratch_bytes(int m, int n, int k) {
  return {bf16_gemv_config::partial_bytes_bound(m, n, k), bf16_gemv_config::counter_bytes_bound(n, k)};
}

Bf16GemvScratch fp8_block_gemv_scratch_bytes(int m, int n, int k) {
  return {bf16_gemv_config::partial_bytes_bound(m, n, k, Weights::FP8Block),
          bf16_gemv_config::counter_bytes_bound(n, k, Weights::FP8Block)};
}

void bf16_gemv(const Bf16GemvParams& p, cudaStream_t stream) {
  const GemvArgs a = args_of(p);
  const DeviceCaps caps = current_device_caps();
  run(a, Weights::BF16, bf16_gemv_config::choose(p.m, p.n, p.k, limits_of(caps)), caps, stream);
}

void bf16_gemv_with(const Bf16GemvParams& p, const Config& c, cudaStream_t stream) {
  run(args_of(p), Weights::BF16, c, current_device_caps(), stream);
}

void fp8_block_gemv(const Fp8BlockGemvParams& p, cudaStream_t stream) {
  const GemvArgs a = args_of(p);
  const DeviceCaps caps = current_device_caps();
  run(a, Weights::FP8Block, bf16_gemv_config::choose(p.m, p.n, p.k, limits_of(caps), Weights::FP8Block), caps,
      stream);
}

void fp8_block_gemv_with(const Fp8BlockGemvParams& p, const Config& c, cudaStream_t stream) {
  run(args_of(p), Weights::FP8Block, c, current_device_caps(), stream);
}

}  // namespace ms::cuda
