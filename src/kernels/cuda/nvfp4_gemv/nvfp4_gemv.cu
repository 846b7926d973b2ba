// Split-K NVFP4 GEMV on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate).
//
// Work split: a block owns a k-slice of 1024 * KW elements and `rows_per_block` weight rows. Each of its 8
// warps owns 128 * KW consecutive k of that slice and walks every row tile (16 rows) of the block, so the
// activations it needs (its k-range of all m rows) are loaded once into registers as the mma B operand and
// reused for every row: no shared-memory staging of x and no barrier in the main loop. The 8 warps' partial
// sums meet once in shared memory at the end; with more than one k-slice the block writes them to the
// workspace and a second kernel adds the slices in a fixed order (deterministic, no atomics).
//
// Fragment mapping: in one 128-wide k step lane (g = lane / 4, t = lane % 4) loads 16 packed bytes (32
// elements, k = 32t .. 32t+31) of rows g and g+8 of the tile. The dot product does not care in which order
// k is visited, so mma chunk j (j = 0..7) takes from each lane bytes 2j and 2j+1: a0a1 = row g byte 2j,
// a4a5 = row g byte 2j+1 (rows g+8 likewise), and B takes the matching activations x[32t + 4j .. 32t+4j+3].
// Every byte is decoded to a bf16 pair by a 256-entry table replicated once per lane (entry e of lane l at
// word e*32 + l: conflict-free), then multiplied by its block scale as bf16 (exact: e2m1 x e4m3 needs at
// most 6 significant bits).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv_config.h"

namespace ms::cuda {
namespace {

using nvfp4_gemv_config::kLutBytes;
using nvfp4_gemv_config::kThreads;
using nvfp4_gemv_config::kWarpK;
using nvfp4_gemv_config::kWarps;

__host__ __device__ constexpr float e2m1_value(uint32_t code) {
  constexpr float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8u) ? -mag[code & 7u] : mag[code & 7u];
}

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// fp8 e4m3 scale byte -> (s, s) as bf16x2 (exact: e4m3 is a subset of bf16).
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t byte) {
  __nv_fp8_e4m3 v;
  v.__x = static_cast<__nv_fp8_storage_t>(byte);
  const float f = static_cast<float>(v);
  return bf16x2_bits(f, f);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

using tc::mma_bf16;

using dev::word_of;

// M: rows of x (1..8, mma column n). KW: 128-wide k steps per warp (slice = 1024 * KW). R: row tiles in
// flight.
template <int M, int KW>
__global__ void __launch_bounds__(kThreads, 2)
    nvfp4_gemv_splitk_kernel(Nvfp4GemvParams p, int rows_per_block, int splits) {
  const int64_t x_stride = p.x_f32_stride > 0 ? p.x_f32_stride : p.k;
  const int64_t y_stride = p.y_stride > 0 ? p.y_stride : p.n;
  constexpr int R = 2 / KW;
  extern __shared__ uint4 smem[];
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);      // [256][32]
  float* red = reinterpret_cast<float*>(lut + 256 * 32);  // [kWarps][M][rows_per_block]
  for (int i = threadIdx.x; i < 256 * 8; i += kThreads) {
    const uint32_t e = i >> 3, v = bf16x2_bits(e2m1_value(e & 15u), e2m1_value(e >> 4));
    smem[i] = make_uint4(v, v, v, v);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int k_warp = blockIdx.y * (kWarps * kWarpK * KW) + warp * (kWarpK * KW);
  const int row_base = blockIdx.x * rows_per_block;
  const bool active = k_warp < p.k;
  // Programmatic dependent launch: the table above touches no global memory; x, y, the workspace and the
  // counters only after the kernel before this one is done.
  dev::grid_dep_wait();
  dev::grid_dep_launch_dependents();

  // B operand: x[g, k_warp + 128 kw + 32 t + 0..31] as 16 bf16 pairs per step (zero past m or k), from
  // bf16 x or from f32 x rounded here.
  uint32_t b[KW][16];
#pragma unroll
  for (int kw = 0; kw < KW; ++kw) {
    const int kk = k_warp + kw * kWarpK + 32 * t;
    const bool in = g < M && g < p.m && kk < p.k;
    if (p.x_f32 != nullptr) {
      const float4* src = reinterpret_cast<const float4*>(
          p.x_f32 + static_cast<size_t>(in ? g : 0) * x_stride + (in ? kk : 0));
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const float4 v = in ? __ldg(src + q) : make_float4(0.f, 0.f, 0.f, 0.f);
        b[kw][2 * q] = bf16x2_bits(v.x, v.y);
        b[kw][2 * q + 1] = bf16x2_bits(v.z, v.w);
      }
    } else {
      const uint4* src =
          reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(in ? g : 0) * p.k + (in ? kk : 0));
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 v = in ? __ldg(src + q) : make_uint4(0, 0, 0, 0);
        b[kw][4 * q] = v.x;
        b[kw][4 * q + 1] = v.y;
        b[kw][4 * q + 2] = v.z;
        b[kw][4 * q + 3] = v.w;
      }
    }
  }
  __syncthreads();  // table ready
  const uint32_t* lut_lane = lut + lane;
  const size_t row_bytes = static_cast<size_t>(p.k) / 2, scale_bytes = static_cast<size_t>(p.k) / 16;

  // Loads of the next row tiles are issued before the current ones are decoded (two register buffers), so
  // every warp keeps its weight loads in flight while it computes.
  auto load = [&](int tile0, uint4(&wv)[R][2][KW], uint32_t(&sv)[R][2][KW]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          const int row = min(row_base + tile0 + 16 * r + g + 8 * h, p.n - 1);
          const int kk = k_warp + kw * kWarpK + 32 * t;
          const bool in = active && kk < p.k && tile0 + 16 * r < rows_per_block;
          wv[r][h][kw] =
              in ? dev::ld_stream16_l2_256(p.w + row * row_bytes + kk / 2) : make_uint4(0, 0, 0, 0);
          sv[r][h][kw] =
              in ? __ldg(reinterpret_cast<const uint16_t*>(p.w_scale + row * scale_bytes + kk / 16)) : 0u;
        }
  };
  auto compute = [&](int tile0, const uint4(&wv)[R][2][KW], const uint32_t(&sv)[R][2][KW]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (tile0 + 16 * r >= rows_per_block) break;
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      if (active) {
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          const uint32_t s0[2] = {scale_bf16x2(sv[r][0][kw] & 0xffu), scale_bf16x2(sv[r][0][kw] >> 8)};
          const uint32_t s1[2] = {scale_bf16x2(sv[r][1][kw] & 0xffu), scale_bf16x2(sv[r][1][kw] >> 8)};
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const uint32_t w0 = word_of(wv[r][0][kw], j >> 1), w1 = word_of(wv[r][1][kw], j >> 1);
            const int sh = (j & 1) * 16;
            const uint32_t a0 = bf16x2_mul(lut_lane[((w0 >> sh) & 0xffu) * 32], s0[j >> 2]);
            const uint32_t a1 = bf16x2_mul(lut_lane[((w1 >> sh) & 0xffu) * 32], s1[j >> 2]);
            const uint32_t a2 = bf16x2_mul(lut_lane[((w0 >> (sh + 8)) & 0xffu) * 32], s0[j >> 2]);
            const uint32_t a3 = bf16x2_mul(lut_lane[((w1 >> (sh + 8)) & 0xffu) * 32], s1[j >> 2]);
            mma_bf16(c, a0, a1, a2, a3, b[kw][2 * j], b[kw][2 * j + 1]);
          }
        }
      }
      // c0,c1: row g, columns (x rows) 2t, 2t+1; c2,c3: row g+8.
      const int tr = tile0 + 16 * r + g;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int col = 2 * t + q;
        if (col < M) {
          red[(warp * M + col) * rows_per_block + tr] = c[q];
          red[(warp * M + col) * rows_per_block + tr + 8] = c[2 + q];
        }
      }
    }
  };
  uint4 wa[R][2][KW], wb[R][2][KW];
  uint32_t sa[R][2][KW], sb[R][2][KW];
  constexpr int kStep = 16 * R;
  load(0, wa, sa);
  for (int tile0 = 0; tile0 < rows_per_block; tile0 += 2 * kStep) {
    if (tile0 + kStep < rows_per_block) load(tile0 + kStep, wb, sb);
    compute(tile0, wa, sa);
    if (tile0 + kStep >= rows_per_block) break;
    if (tile0 + 2 * kStep < rows_per_block) load(tile0 + 2 * kStep, wa, sa);
    compute(tile0 + kStep, wb, sb);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * rows_per_block; i += kThreads) {
    const int col = i / rows_per_block, tr = i % rows_per_block, row = row_base + tr;
    if (col >= p.m || row >= p.n) continue;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(w * M + col) * rows_per_block + tr];
    if (splits == 1)
      p.y[static_cast<size_t>(col) * y_stride + row] = s * p.w_scale2;
    else
      p.workspace[(static_cast<size_t>(blockIdx.y) * p.m + col) * p.n + row] = s;
  }
  if (splits == 1 || p.counters == nullptr) return;
  // With counters, the last block of this row block to finish adds the k-slices in slice order (the order
  // and the arithmetic of the reduction pass, so the bits are the same) and no second kernel runs.
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&p.counters[blockIdx.x], 1u) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < M * rows_per_block; i += kThreads) {
    const int col = i / rows_per_block, tr = i % rows_per_block, row = row_base + tr;
    if (col >= p.m || row >= p.n) continue;
    float s = 0.f;
    for (int sp = 0; sp < splits; ++sp)
      s += __ldcg(p.workspace + (static_cast<size_t>(sp) * p.m + col) * p.n + row);
    p.y[static_cast<size_t>(col) * y_stride + row] = s * p.w_scale2;
  }
  if (threadIdx.x == 0) atomicExch(&p.counters[blockIdx.x], 0u);
}

// y[i / n, i % n] (rows y_stride apart) = w_scale2 * sum over slices s (in order) of workspace[s, i], i over
// m * n.
__global__ void nvfp4_gemv_reduce_kernel(const float* __restrict__ part, float* __restrict__ y, size_t count,
                                         int n, int64_t y_stride, int splits, float scale2) {
  dev::grid_dep_enter();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int sp = 0; sp < splits; ++sp) s += part[sp * count + i];
    y[(i / n) * y_stride + i % n] = s * scale2;
  }
}

using nvfp4_gemv_config::ceil_div;
using nvfp4_gemv_config::Config;
using nvfp4_gemv_config::smem_bytes;

template <int M, int KW>
void launch(const Nvfp4GemvParams& p, const Config& c, const DeviceCaps& caps, cudaStream_t stream) {
  const size_t smem = smem_bytes(M, c.rows_per_block);
  check_smem(caps, "nvfp4_gemv", smem);
  auto* kernel = nvfp4_gemv_splitk_kernel<M, KW>;
  CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  dim3 grid(ceil_div(p.n, c.rows_per_block), c.splits);
  launch_kernel("nvfp4_gemv", kernel, grid, dim3(kThreads), smem, stream, p, c.rows_per_block, c.splits);
}

template <int M>
void launch_m(const Nvfp4GemvParams& p, const Config& c, const DeviceCaps& caps, cudaStream_t stream) {
  if (c.kw == 2)
    launch<M, 2>(p, c, caps, stream);
  else
    launch<M, 1>(p, c, caps, stream);
}

}  // namespace

size_t nvfp4_gemv_counter_bytes(int n) {
  return static_cast<size_t>(ceil_div(std::max(n, 1), 16)) * sizeof(uint32_t);  // the smallest row block
}

size_t nvfp4_gemv_workspace_bytes(int m, int n, int k) {
  const int max_splits = ceil_div(std::max(k, 1), kWarps * kWarpK);  // the smallest slice any config uses
  if (max_splits <= 1) return 0;
  return static_cast<size_t>(max_splits) * std::max(m, 0) * std::max(n, 0) * sizeof(float);
}

void nvfp4_gemv(const Nvfp4GemvParams& p, cudaStream_t stream) {
  MS_CHECK(p.k > 0 && p.k % 32 == 0, "nvfp4_gemv: k = {} must be a positive multiple of 32", p.k);
  MS_CHECK(p.n > 0, "nvfp4_gemv: n = {} must be positive", p.n);
  MS_CHECK(p.m >= 1 && p.m <= kNvfp4GemvMaxM, "nvfp4_gemv: m = {} outside [1, {}]; use the grouped GEMM", p.m,
           kNvfp4GemvMaxM);
  MS_CHECK((p.x != nullptr) != (p.x_f32 != nullptr), "nvfp4_gemv: set exactly one of x (bf16) and x_f32");
  MS_CHECK(p.y != nullptr && (p.y_stride == 0 || p.y_stride >= p.n),
           "nvfp4_gemv: y is null or its row stride {} is smaller than n = {}", p.y_stride, p.n);
  MS_CHECK(p.x_f32 == nullptr || ((p.x_f32_stride == 0 || p.x_f32_stride >= p.k) && p.x_f32_stride % 4 == 0),
           "nvfp4_gemv: x_f32 row stride {} must be 0 (k) or at least k = {} and a multiple of 4",
           p.x_f32_stride, p.k);
  const void* x = p.x != nullptr ? static_cast<const void*>(p.x) : static_cast<const void*>(p.x_f32);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(p.w_scale) % 2 == 0,
           "nvfp4_gemv: weights and activations must be 16-byte aligned, block scales 2-byte aligned");
  const DeviceCaps caps = current_device_caps();
  const Config c = nvfp4_gemv_config::choose(p.m, p.n, p.k, limits_of(caps));
  MS_CHECK(c.splits == 1 || p.workspace != nullptr,
           "nvfp4_gemv: workspace is null but m={} n={} k={} needs nvfp4_gemv_workspace_bytes = {} bytes",
           p.m, p.n, p.k, nvfp4_gemv_workspace_bytes(p.m, p.n, p.k));
  switch (p.m) {
    case 1:
      launch_m<1>(p, c, caps, stream);
      break;
    case 2:
      launch_m<2>(p, c, caps, stream);
      break;
    case 3:
    case 4:
      launch_m<4>(p, c, caps, stream);
      break;
    default:
      launch_m<8>(p, c, caps, stream);
      break;
  }
  if (c.splits > 1 && p.counters == nullptr) {
    const size_t count = static_cast<size_t>(p.m) * p.n;
    const int blocks = static_cast<int>(std::min<size_t>((count + 255) / 256, 4u * caps.multiprocessors));
    launch_kernel("nvfp4_gemv_reduce", nvfp4_gemv_reduce_kernel, dim3(blocks), dim3(256), 0, stream,
                  static_cast<const float*>(p.workspace), p.y, count, p.n, p.y_stride > 0 ? p.y_stride : p.n,
                  c.splits, p.w_scale2);
  }
}

}  // namespace ms::cuda
