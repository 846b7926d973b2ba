// The sm_90a pieces of kernels/cuda/mla_decode/mla_wgmma.cuh against products computed here in double, on
// random f16 inputs laid out in shared memory exactly as mla_decode_wgmma lays them out:
//   S-like: D = A B^T with A [64][128] and B [64][128] both K-major in 128-byte-swizzled blocks of 64
//     columns, 8 k steps (two blocks, four 32-byte steps inside each), by wgmma m64n64k16 and by m64n32k16
//     over B's lines 32..63 (the second consumer warpgroup's keys);
//   O-like: D = P V with P [64][64] from registers (the documented A fragment) and V [64 keys][256 dims]
//     MN-major (dims contiguous, four blocks of 64 dims), 4 k steps, by wgmma m64n256k16 with B transposed.
//   Grouped: the same two products with B and V in the seesaw schedule's owner-region layout (groups of 8 key
//     lines 5,120 bytes apart, each 5 atoms of 1,024 bytes, the column blocks in atoms 1-4): the K-major
//     descriptor's stride byte offset 5,120, the MN-major one's leading byte offset 1,024 and stride 5,120.
// Outputs are NaN-poisoned; the first mismatching (row, col) is printed. Tolerance: f16 inputs, f32
// accumulation of at most 128 products: |err| < 1e-3 * (1 + |ref|).
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_decode/mla_wgmma.cuh"

namespace {

namespace ptx = ms::cuda::mla_wgmma_ptx;
constexpr uint32_t kBlock = 64 * 128;

__device__ unsigned char* align1024(void* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 1023) / 1024 * 1024);
}

// Row-major [lines][cols] f16 (cols a multiple of 64) into swizzled blocks of 64 columns.
__device__ void store_swizzled(unsigned char* dst, const __half* src, int lines, int cols) {
  const int pieces = cols / 8;
  for (int i = threadIdx.x; i < lines * pieces; i += blockDim.x) {
    const int r = i / pieces, c8 = i % pieces;
    *reinterpret_cast<uint4*>(dst + (c8 / 8) * kBlock + ptx::swizzle128_offset(r, (c8 % 8) * 8)) =
        *reinterpret_cast<const uint4*>(src + r * cols + c8 * 8);
  }
}

// d64 [64][64] = A B^T, d32 [64][32] = A B[32..63]^T; A, B [64][128] row-major.
__global__ void __launch_bounds__(128) ss_kernel(const __half* a, const __half* b, float* d64, float* d32) {
  extern __shared__ uint4 smem_dyn[];
  unsigned char* a_s = align1024(smem_dyn);
  unsigned char* b_s = a_s + 2 * kBlock;
  store_swizzled(a_s, a, 64, 128);
  store_swizzled(b_s, b, 64, 128);
  ptx::fence_proxy_async();
  __syncthreads();
  float acc64[32], acc32[16];
  for (float& x : acc64) x = 0.f;
  for (float& x : acc32) x = 0.f;
  const uint64_t da = ptx::desc_sw128(a_s, 16, 1024), db = ptx::desc_sw128(b_s, 16, 1024);
  const uint64_t db32 = ptx::desc_sw128(b_s + 32 * 128, 16, 1024);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint64_t off = ((ks / 4) * kBlock + (ks % 4) * 32) >> 4;
    ptx::wgmma_ss_m64n64k16_f16<0>(acc64, da + off, db + off, ks > 0 ? 1 : 0);
    ptx::wgmma_ss_m64n32k16_f16<0>(acc32, da + off, db32 + off, ks > 0 ? 1 : 0);
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  for (float& x : acc64) ptx::fence_operand(x);
  for (float& x : acc32) ptx::fence_operand(x);
  const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * w + g + (e >> 1) * 8, c = 8 * j + 2 * t + (e & 1);
      d64[r * 64 + c] = acc64[4 * j + e];
      if (j < 4) d32[r * 32 + c] = acc32[4 * j + e];
    }
}

// d [64][256] = P V; P [64][64] row-major (to registers), V [64][256] row-major (keys x dims).
__global__ void __launch_bounds__(128) rs_kernel(const __half* pm, const __half* v, float* d) {
  extern __shared__ uint4 smem_dyn[];
  unsigned char* v_s = align1024(smem_dyn);
  store_swizzled(v_s, v, 64, 256);
  ptx::fence_proxy_async();
  __syncthreads();
  const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  auto pair = [&](int r, int c) { return *reinterpret_cast<const uint32_t*>(pm + r * 64 + c); };
  uint32_t a[4][4];
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pair(16 * w + g, 16 * kk + 2 * t);
    a[kk][1] = pair(16 * w + g + 8, 16 * kk + 2 * t);
    a[kk][2] = pair(16 * w + g, 16 * kk + 2 * t + 8);
    a[kk][3] = pair(16 * w + g + 8, 16 * kk + 2 * t + 8);
  }
  float acc[128];
  for (float& x : acc) x = 0.f;
  const uint64_t dv = ptx::desc_sw128(v_s, kBlock, 1024);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) ptx::wgmma_rs_m64n256k16_f16<1>(acc, a[kk], dv + ((kk * 2048) >> 4), 1);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  for (float& x : acc) ptx::fence_operand(x);
  for (int j = 0; j < 32; ++j)
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * w + g + (e >> 1) * 8, c = 8 * j + 2 * t + (e & 1);
      d[r * 256 + c] = acc[4 * j + e];
    }
}

// Row-major [lines][cols] f16 (cols <= 256) into the grouped layout: line r in group r / 8 (5,120 bytes
// apart), column block q in atom 1 + q (1,024 bytes), swizzled inside the atom.
__device__ void store_grouped(unsigned char* dst, const __half* src, int lines, int cols) {
  const int pieces = cols / 8;
  for (int i = threadIdx.x; i < lines * pieces; i += blockDim.x) {
    const int r = i / pieces, c8 = i % pieces;
    *reinterpret_cast<uint4*>(dst + (r / 8) * 5120 + (1 + c8 / 8) * 1024 +
                              ptx::swizzle128_offset(r % 8, (c8 % 8) * 8)) =
        *reinterpret_cast<const uint4*>(src + r * cols + c8 * 8);
  }
}

// d_s [64][64] = A B^T (A [64][128] dense swizzled, B [64][128] grouped); d_o [64][256] = P V (V [64][256]
// grouped).
__global__ void __launch_bounds__(128) grouped_kernel(const __half* a, const __half* b, const __half* pm,
                                                      const __half* v, float* d_s, float* d_o) {
  extern __shared__ uint4 smem_dyn[];
  unsigned char* a_s = align1024(smem_dyn);
  unsigned char* b_s = a_s + 2 * kBlock;
  unsigned char* v_s = b_s + 8 * 5120;
  store_swizzled(a_s, a, 64, 128);
  store_grouped(b_s, b, 64, 128);
  store_grouped(v_s, v, 64, 256);
  ptx::fence_proxy_async();
  __syncthreads();
  const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  float acc_s[32];
  for (float& x : acc_s) x = 0.f;
  const uint64_t da = ptx::desc_sw128(a_s, 16, 1024);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint64_t db = ptx::desc_sw128(b_s + (1 + ks / 4) * 1024, 16, 5120);
    ptx::wgmma_ss_m64n64k16_f16<0>(acc_s, da + (((ks / 4) * kBlock + (ks % 4) * 32) >> 4), db + (ks % 4) * 2,
                                   ks > 0 ? 1 : 0);
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  for (float& x : acc_s) ptx::fence_operand(x);
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e)
      d_s[(16 * w + g + (e >> 1) * 8) * 64 + 8 * j + 2 * t + (e & 1)] = acc_s[4 * j + e];

  auto pair = [&](int r, int c) { return *reinterpret_cast<const uint32_t*>(pm + r * 64 + c); };
  uint32_t pa[4][4];
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pair(16 * w + g, 16 * kk + 2 * t);
    pa[kk][1] = pair(16 * w + g + 8, 16 * kk + 2 * t);
    pa[kk][2] = pair(16 * w + g, 16 * kk + 2 * t + 8);
    pa[kk][3] = pair(16 * w + g + 8, 16 * kk + 2 * t + 8);
  }
  float acc[128];
  for (float& x : acc) x = 0.f;
  const uint64_t dv = ptx::desc_sw128(v_s + 1024, 1024, 5120);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) ptx::wgmma_rs_m64n256k16_f16<1>(acc, pa[kk], dv + ((kk * 2 * 5120) >> 4), 1);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  for (float& x : acc) ptx::fence_operand(x);
  for (int j = 0; j < 32; ++j)
    for (int e = 0; e < 4; ++e)
      d_o[(16 * w + g + (e >> 1) * 8) * 256 + 8 * j + 2 * t + (e & 1)] = acc[4 * j + e];
}

bool skip() {
  return ms::cuda::device_count() == 0 || ms::cuda::query_device(0).arch() != 90;
}

std::vector<__half> random_half(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<__half> v(n);
  for (auto& x : v) x = __float2half(dist(rng));
  return v;
}

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

float* poisoned(size_t n) {
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * 4));
  CUDA_CHECK(cudaMemset(p, 0xff, n * 4));
  return p;
}

// Compares got [rows][cols] with ref; reports the first mismatch.
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, int cols, const char* what) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err < 1e-3 * (1.0 + std::fabs(ref[i])))) {
      ADD_FAILURE() << what << ": first mismatch at (row " << i / cols << ", col " << i % cols << "): got "
                    << got[i] << ", expected " << ref[i];
      return;
    }
  }
}

}  // namespace

TEST(MlaWgmmaPrimitives, SharedOperandsKMajorSwizzled) {
  if (skip()) GTEST_SKIP() << "needs an sm_90 device";
  const auto a = random_half(64 * 128, 1), b = random_half(64 * 128, 2);
  __half* da = to_device(a);
  __half* db = to_device(b);
  float* d64 = poisoned(64 * 64);
  float* d32 = poisoned(64 * 32);
  const int smem = 4 * kBlock + 1024;
  CUDA_CHECK(cudaFuncSetAttribute(ss_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  ss_kernel<<<1, 128, smem>>>(da, db, d64, d32);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> g64(64 * 64), g32(64 * 32);
  CUDA_CHECK(cudaMemcpy(g64.data(), d64, g64.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(g32.data(), d32, g32.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> r64(64 * 64), r32(64 * 32);
  for (int i = 0; i < 64; ++i)
    for (int n = 0; n < 64; ++n) {
      double s = 0;
      for (int k = 0; k < 128; ++k)
        s += static_cast<double>(__half2float(a[i * 128 + k])) * __half2float(b[n * 128 + k]);
      r64[i * 64 + n] = s;
      if (n >= 32) r32[i * 32 + n - 32] = s;
    }
  expect_close(g64, r64, 64, "m64n64k16, A and B K-major in shared memory");
  expect_close(g32, r32, 32, "m64n32k16 over B lines 32..63");
  cudaFree(da);
  cudaFree(db);
  cudaFree(d64);
  cudaFree(d32);
}

TEST(MlaWgmmaPrimitives, RegisterATransposedB) {
  if (skip()) GTEST_SKIP() << "needs an sm_90 device";
  const auto pm = random_half(64 * 64, 3), v = random_half(64 * 256, 4);
  __half* dp = to_device(pm);
  __half* dv = to_device(v);
  float* dd = poisoned(64 * 256);
  const int smem = 4 * kBlock + 1024;
  CUDA_CHECK(cudaFuncSetAttribute(rs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  rs_kernel<<<1, 128, smem>>>(dp, dv, dd);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(64 * 256);
  CUDA_CHECK(cudaMemcpy(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> ref(64 * 256, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int k = 0; k < 64; ++k) {
      const double pv = __half2float(pm[i * 64 + k]);
      for (int n = 0; n < 256; ++n) ref[i * 256 + n] += pv * __half2float(v[k * 256 + n]);
    }
  expect_close(got, ref, 256, "m64n256k16, A in registers, B MN-major (transposed)");
  cudaFree(dp);
  cudaFree(dv);
  cudaFree(dd);
}

TEST(MlaWgmmaPrimitives, GroupedOwnerRegionLayout) {
  if (skip()) GTEST_SKIP() << "needs an sm_90 device";
  const auto a = random_half(64 * 128, 5), b = random_half(64 * 128, 6);
  const auto pm = random_half(64 * 64, 7), v = random_half(64 * 256, 8);
  __half* da = to_device(a);
  __half* db = to_device(b);
  __half* dp = to_device(pm);
  __half* dv = to_device(v);
  float* ds = poisoned(64 * 64);
  float* dd = poisoned(64 * 256);
  const int smem = 2 * kBlock + 2 * 8 * 5120 + 1024;
  CUDA_CHECK(cudaFuncSetAttribute(grouped_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  grouped_kernel<<<1, 128, smem>>>(da, db, dp, dv, ds, dd);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> gs(64 * 64), go(64 * 256);
  CUDA_CHECK(cudaMemcpy(gs.data(), ds, gs.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(go.data(), dd, go.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> rs(64 * 64), ro(64 * 256, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int n = 0; n < 64; ++n) {
      double s = 0;
      for (int k = 0; k < 128; ++k)
        s += static_cast<double>(__half2float(a[i * 128 + k])) * __half2float(b[n * 128 + k]);
      rs[i * 64 + n] = s;
    }
  for (int i = 0; i < 64; ++i)
    for (int k = 0; k < 64; ++k) {
      const double pv = __half2float(pm[i * 64 + k]);
      for (int n = 0; n < 256; ++n) ro[i * 256 + n] += pv * __half2float(v[k * 256 + n]);
    }
  expect_close(gs, rs, 64, "m64n64k16, B K-major in groups of 8 lines 5,120 bytes apart");
  expect_close(go, ro, 256, "m64n256k16, V MN-major, 64-dim blocks 1,024 bytes apart, 8-key groups 5,120");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dp);
  cudaFree(dv);
  cudaFree(ds);
  cudaFree(dd);
}
