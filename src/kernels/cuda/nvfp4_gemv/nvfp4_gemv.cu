#include <cuda_fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv.h"

namespace ms::cuda {
namespace {

constexpr int kWarps = 8;        // warps per block
constexpr int kRowsPerWarp = 2;  // weight rows per warp: more 16-byte loads in flight per thread
constexpr int kTile = 32 * 32;   // elements of k per tile: 32 lanes x 32 elements (16 packed bytes) each
constexpr int kPad = 4;          // floats of padding after every 32 staged x values (no bank conflicts)
constexpr int kTileStride = kTile + kTile / 32 * kPad;

__host__ __device__ constexpr float e2m1_value(uint32_t code) {
  constexpr float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8u) ? -mag[code & 7u] : mag[code & 7u];
}

__device__ __forceinline__ float fp8_e4m3_value(uint8_t s) {
  __nv_fp8_e4m3 v;
  v.__x = s;
  return static_cast<float>(v);
}

// Each block stages a tile of x (all m rows, as f32) in shared memory once, then every warp streams its
// weight rows through it: one 16-byte load per lane per row per tile, decoded two elements per byte through a
// 256-entry table, partial sums kept per 16-element block and scaled once.
template <int M>
__global__ void __launch_bounds__(kWarps * 32) nvfp4_gemv_kernel(Nvfp4GemvParams p) {
  __shared__ float2 lut[256];    // byte -> (low nibble value, high nibble value)
  extern __shared__ float xs[];  // [M, kTileStride]
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    lut[i] = make_float2(e2m1_value(i & 15), e2m1_value(i >> 4));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
    for (int r = 0; r < M; ++r) acc[rr][r] = 0.f;

  for (int t0 = 0; t0 < p.k; t0 += kTile) {
    const int tlen = min(kTile, p.k - t0);
    __syncthreads();  // the previous tile is consumed
    for (int i = threadIdx.x; i < M * tlen / 2; i += blockDim.x) {
      const int r = i / (tlen / 2), c = (i % (tlen / 2)) * 2;
      const float2 f = __bfloat1622float2(
          *reinterpret_cast<const __nv_bfloat162*>(p.x + static_cast<size_t>(r) * p.k + t0 + c));
      float* dst = xs + r * kTileStride + c + c / 32 * kPad;
      dst[0] = f.x;
      dst[1] = f.y;
    }
    __syncthreads();
    const int c = lane * 32;
    if (c >= tlen) continue;
    uint4 packed[kRowsPerWarp];
    float s0[kRowsPerWarp], s1[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int row = min(row0 + rr, p.n - 1);  // a tail warp re-reads the last row and discards it
      packed[rr] =
          __ldg(reinterpret_cast<const uint4*>(p.w + static_cast<size_t>(row) * (p.k / 2) + (t0 + c) / 2));
      const uint8_t* srow = p.w_scale + static_cast<size_t>(row) * (p.k / 16) + (t0 + c) / 16;
      s0[rr] = fp8_e4m3_value(srow[0]);
      s1[rr] = fp8_e4m3_value(srow[1]);
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      float wv[32];
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&packed[rr]);
#pragma unroll
      for (int b = 0; b < 16; ++b) {
        const float2 w = lut[bytes[b]];
        wv[2 * b] = w.x;
        wv[2 * b + 1] = w.y;
      }
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const float4* xv = reinterpret_cast<const float4*>(xs + r * kTileStride + c + c / 32 * kPad);
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 x = xv[q];
          a0 = fmaf(wv[4 * q], x.x, a0);
          a0 = fmaf(wv[4 * q + 1], x.y, a0);
          a0 = fmaf(wv[4 * q + 2], x.z, a0);
          a0 = fmaf(wv[4 * q + 3], x.w, a0);
        }
#pragma unroll
        for (int q = 4; q < 8; ++q) {
          const float4 x = xv[q];
          a1 = fmaf(wv[4 * q], x.x, a1);
          a1 = fmaf(wv[4 * q + 1], x.y, a1);
          a1 = fmaf(wv[4 * q + 2], x.z, a1);
          a1 = fmaf(wv[4 * q + 3], x.w, a1);
        }
        acc[rr][r] = fmaf(a0, s0[rr], fmaf(a1, s1[rr], acc[rr][r]));
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float v = acc[rr][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && row0 + rr < p.n) p.y[static_cast<size_t>(r) * p.n + row0 + rr] = v * p.w_scale2;
    }
  }
}

template <int M>
void launch(const Nvfp4GemvParams& p, cudaStream_t stream) {
  const int rows_per_block = kWarps * kRowsPerWarp;
  dim3 grid((p.n + rows_per_block - 1) / rows_per_block);
  const size_t smem = static_cast<size_t>(M) * kTileStride * sizeof(float);
  nvfp4_gemv_kernel<M><<<grid, kWarps * 32, smem, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void nvfp4_gemv(const Nvfp4GemvParams& p, cudaStream_t stream) {
  MS_CHECK(p.k > 0 && p.k % 32 == 0, "nvfp4_gemv: k = {} must be a positive multiple of 32", p.k);
  MS_CHECK(p.n > 0, "nvfp4_gemv: n = {} must be positive", p.n);
  MS_CHECK(p.m >= 1 && p.m <= kNvfp4GemvMaxM, "nvfp4_gemv: m = {} outside [1, {}]; use the grouped GEMM", p.m,
           kNvfp4GemvMaxM);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 4 == 0,
           "nvfp4_gemv: weights must be 16-byte and activations 4-byte aligned");
  switch (p.m) {
    case 1:
      return launch<1>(p, stream);
    case 2:
      return launch<2>(p, stream);
    case 3:
      return launch<3>(p, stream);
    case 4:
      return launch<4>(p, stream);
    case 5:
      return launch<5>(p, stream);
    case 6:
      return launch<6>(p, stream);
    case 7:
      return launch<7>(p, stream);
    default:
      return launch<8>(p, stream);
  }
}

}  // namespace ms::cuda
