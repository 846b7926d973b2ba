#include <cuda_fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv.h"

namespace ms::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  // Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
  constexpr float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float v = mag[code & 7u];
  return (code & 8u) ? -v : v;
}

__device__ __forceinline__ float fp8_e4m3_value(uint8_t s) {
  __nv_fp8_e4m3 v;
  v.__x = s;
  return static_cast<float>(v);
}

// One warp per output row. Each lane takes 16 packed bytes (32 elements, two scale blocks) per iteration, so
// a warp reads 512 contiguous bytes of the row at a time.
template <int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) nvfp4_gemv_kernel(Nvfp4GemvParams p) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.n) return;
  const uint8_t* wrow = p.w + static_cast<size_t>(row) * (p.k / 2);
  const uint8_t* srow = p.w_scale + static_cast<size_t>(row) * (p.k / 16);
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.f;

  for (int base = lane * 32; base < p.k; base += 32 * 32) {
    const uint4 packed = *reinterpret_cast<const uint4*>(wrow + base / 2);
    const float s0 = fp8_e4m3_value(srow[base / 16]), s1 = fp8_e4m3_value(srow[base / 16 + 1]);
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    float wv[32];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        wv[i * 8 + j] = e2m1_value((words[i] >> (4 * j)) & 0xfu) * (i < 2 ? s0 : s1);
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
      const uint4* xv = reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(r) * p.k + base);
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 xx = __ldg(xv + q);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&xx);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float2 f = __bfloat1622float2(h[t]);
          sum = fmaf(f.x, wv[q * 8 + 2 * t], sum);
          sum = fmaf(f.y, wv[q * 8 + 2 * t + 1], sum);
        }
      }
      acc[r] += sum;
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    float v = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) p.y[static_cast<size_t>(r) * p.n + row] = v * p.w_scale2;
  }
}

template <int M>
void launch(const Nvfp4GemvParams& p, cudaStream_t stream) {
  dim3 grid((p.n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  nvfp4_gemv_kernel<M><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void nvfp4_gemv(const Nvfp4GemvParams& p, cudaStream_t stream) {
  MS_CHECK(p.k > 0 && p.k % 32 == 0, "nvfp4_gemv: k = {} must be a positive multiple of 32", p.k);
  MS_CHECK(p.n > 0, "nvfp4_gemv: n = {} must be positive", p.n);
  MS_CHECK(p.m >= 1 && p.m <= kNvfp4GemvMaxM, "nvfp4_gemv: m = {} outside [1, {}]; use the grouped GEMM", p.m,
           kNvfp4GemvMaxM);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0,
           "nvfp4_gemv: weights and activations must be 16-byte aligned");
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
