// The sm_90a warpgroup-MMA primitives (kernels/cuda/common/wgmma_sm90.cuh) on one tile: C [64][N] = A
// [64][64] . B [N][64]^T with A and B staged in the K-major 128-byte swizzle, against a CPU product. Inputs
// are small multiples of 1/4 (exact in bf16, every partial sum exact in f32), so the comparison is exact and
// the first wrong (row, col) localises the fault: a wrong descriptor or swizzle scrambles k (wrong values
// everywhere), a wrong stride-byte offset breaks rows 8 .. 63 only, a wrong accumulator layout moves whole
// 8-column blocks or rows. A second A half (rows 64 .. 127 of a 128-row tile, the descriptor started 8 KB in)
// is what the grouped MoE kernel's second consumer uses; scale_d = 0 on the first k step must discard the
// poisoned accumulators.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/wgmma_sm90.cuh"

namespace {

namespace wg = ms::cuda::wg;

// a: bf16 bits [128][64]; b: bf16 bits [N][64]; c: f32 [64][N] = a[a_row0 .. a_row0 + 63] . b^T. One
// warpgroup (128 threads).
template <int N>
__global__ void __launch_bounds__(128)
    wgmma_tile_kernel(const uint16_t* a, const uint16_t* b, float* c, int a_row0) {
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  const uint32_t dyn = wg::smem_u32(smem_dyn);
  const uint32_t pad = ((dyn + 1023u) & ~1023u) - dyn;
  unsigned char* sa = smem_dyn + pad;  // [128][64] bf16, swizzled
  unsigned char* sb = sa + 128 * 128;  // [N][64] bf16, swizzled
  const int tid = threadIdx.x;
  for (int i = tid; i < 128 * 8; i += 128) {
    const int r = i / 8, ch = i % 8;
    *reinterpret_cast<uint4*>(sa + wg::sw128_offset(r, ch)) =
        *reinterpret_cast<const uint4*>(a + r * 64 + ch * 8);
  }
  for (int i = tid; i < N * 8; i += 128) {
    const int r = i / 8, ch = i % 8;
    *reinterpret_cast<uint4*>(sb + wg::sw128_offset(r, ch)) =
        *reinterpret_cast<const uint4*>(b + r * 64 + ch * 8);
  }
  wg::fence_proxy_async();
  __syncthreads();

  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = __int_as_float(0x7fc00000);  // NaN: scale_d = 0 must ignore it
  const uint64_t da = wg::smem_desc_sw128(dyn + pad + a_row0 * 128);
  const uint64_t db = wg::smem_desc_sw128(dyn + pad + 128 * 128);
  wg::fence_operands(acc);
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wg::mma_bf16_ss<N>(acc, wg::desc_advance(da, kk), wg::desc_advance(db, kk), kk > 0);
  wg::wgmma_commit();
  wg::wgmma_wait<0>();
  wg::fence_operands(acc);

  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const int col = 8 * j + 2 * t;
    c[(16 * w + g) * N + col] = acc[4 * j];
    c[(16 * w + g) * N + col + 1] = acc[4 * j + 1];
    c[(16 * w + g + 8) * N + col] = acc[4 * j + 2];
    c[(16 * w + g + 8) * N + col + 1] = acc[4 * j + 3];
  }
}

uint16_t bf16_bits(float f) {  // exact for the values used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

template <int N>
void run_tile(int a_row0, uint32_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " a_row0=" + std::to_string(a_row0));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<float> af(128 * 64), bf(static_cast<size_t>(N) * 64);
  for (auto& v : af) v = 0.25f * static_cast<float>(d(rng));
  for (auto& v : bf) v = 0.25f * static_cast<float>(d(rng));
  std::vector<uint16_t> ah(af.size()), bh(bf.size());
  for (size_t i = 0; i < af.size(); ++i) ah[i] = bf16_bits(af[i]);
  for (size_t i = 0; i < bf.size(); ++i) bh[i] = bf16_bits(bf[i]);

  uint16_t *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  CUDA_CHECK(cudaMalloc(&da, ah.size() * 2));
  CUDA_CHECK(cudaMalloc(&db, bh.size() * 2));
  CUDA_CHECK(cudaMalloc(&dc, size_t{64} * N * 4));
  CUDA_CHECK(cudaMemcpy(da, ah.data(), ah.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(db, bh.data(), bh.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dc, 0xff, size_t{64} * N * 4));  // NaN: every element must be written
  const int smem = 1024 + 128 * 128 + N * 128;
  CUDA_CHECK(cudaFuncSetAttribute(wgmma_tile_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_tile_kernel<N><<<1, 128, smem>>>(da, db, dc, a_row0);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(size_t{64} * N);
  CUDA_CHECK(cudaMemcpy(got.data(), dc, got.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);

  int bad = 0;
  for (int r = 0; r < 64; ++r) {
    for (int col = 0; col < N; ++col) {
      float ref = 0.f;
      for (int k = 0; k < 64; ++k) ref += af[(a_row0 + r) * 64 + k] * bf[col * 64 + k];
      const float g = got[static_cast<size_t>(r) * N + col];
      if (!(g == ref)) {
        if (bad < 5)
          ADD_FAILURE() << "first mismatches: C[" << r << "][" << col << "] gpu " << g << " cpu " << ref;
        ++bad;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "of " << 64 * N << " elements";
}

bool have_sm90() {
  return ms::cuda::device_count() > 0 && ms::cuda::current_device_caps().arch() == 90;
}

TEST(Wgmma, TileGemmMatchesCpuN64) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  run_tile<64>(0, 1);
}

TEST(Wgmma, TileGemmMatchesCpuN128) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  run_tile<128>(0, 2);
  run_tile<128>(64, 3);
}

TEST(Wgmma, TileGemmMatchesCpuN256) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  run_tile<256>(0, 4);
  run_tile<256>(64, 5);
}

// mbarrier phases: 4 producer warps arrive on `full`, one consumer warp waits by parity, 8 rounds; the
// consumer sees each round's value (release / acquire through the barrier).
__global__ void mbar_pingpong_kernel(int* out, int rounds) {
  __shared__ __align__(8) uint64_t bars[2];
  __shared__ int value[4];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    wg::mbar_init(&bars[0], 4);  // full: one arrival per producer warp
    wg::mbar_init(&bars[1], 1);  // empty: the consumer's one arrival
    wg::mbar_init_fence();
  }
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    if (warp < 4) {
      if (r > 0) wg::mbar_wait(&bars[1], (r - 1) & 1);
      if (lane == 0) {
        value[warp] = 100 * r + warp;
        wg::mbar_arrive(&bars[0]);
      }
    } else {
      wg::mbar_wait(&bars[0], r & 1);
      if (lane == 0) {
        out[r] = value[0] + value[1] + value[2] + value[3];
        wg::mbar_arrive(&bars[1]);
      }
    }
    __syncwarp();
  }
}

TEST(Wgmma, MbarrierPhasesHandOverData) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  const int rounds = 8;
  int* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, rounds * 4));
  CUDA_CHECK(cudaMemset(d, 0xff, rounds * 4));
  mbar_pingpong_kernel<<<1, 160>>>(d, rounds);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int> h(rounds);
  CUDA_CHECK(cudaMemcpy(h.data(), d, rounds * 4, cudaMemcpyDeviceToHost));
  cudaFree(d);
  for (int r = 0; r < rounds; ++r) EXPECT_EQ(h[r], 400 * r + 6) << "round " << r;
}

}  // namespace
