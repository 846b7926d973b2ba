// The NVFP4 GEMV kernel against the CPU reference (quant/nvfp4.h dequantisation, fp32 dot products).
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv.h"
#include "quant/float_formats.h"
#include "quant/nvfp4.h"

namespace {

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

void run_case(int m, int n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(n) * k);
  for (auto& v : w) v = dist(rng) * 0.05f;
  auto q = ms::quant::nvfp4_quantize(w.data(), n, k);
  std::vector<uint16_t> x(static_cast<size_t>(m) * k);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = ms::quant::f32_to_bf16(dist(rng));
    xf[i] = ms::quant::bf16_to_f32(x[i]);
  }
  // Reference: dequantised rows, double accumulation.
  std::vector<double> ref(static_cast<size_t>(m) * n);
  std::vector<float> row(k);
  for (int j = 0; j < n; ++j) {
    ms::quant::nvfp4_dequantize_row(q.packed.data() + static_cast<size_t>(j) * k / 2,
                                    q.scales.data() + static_cast<size_t>(j) * k / 16, q.scale2, k,
                                    row.data());
    for (int r = 0; r < m; ++r) {
      double s = 0;
      for (int c = 0; c < k; ++c) s += static_cast<double>(row[c]) * xf[static_cast<size_t>(r) * k + c];
      ref[static_cast<size_t>(r) * n + j] = s;
    }
  }
  auto* dw = to_device(q.packed);
  auto* ds = to_device(q.scales);
  auto* dx = to_device(x);
  float* dy = nullptr;
  CUDA_CHECK(cudaMalloc(&dy, ref.size() * sizeof(float)));
  ms::cuda::Nvfp4GemvParams p{dw, ds, q.scale2, reinterpret_cast<const __nv_bfloat16*>(dx), dy, m, n, k};
  ms::cuda::nvfp4_gemv(p, nullptr);
  std::vector<float> y(ref.size());
  CUDA_CHECK(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double max_rel = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double scale = std::max(1e-3, std::fabs(ref[i]));
    max_rel = std::max(max_rel, std::fabs(y[i] - ref[i]) / scale);
  }
  // fp32 accumulation in another order than the double reference: ~1e-6 relative, far below NVFP4's own
  // error.
  EXPECT_LT(max_rel, 1e-4) << "m=" << m << " n=" << n << " k=" << k;
  cudaFree(dw);
  cudaFree(ds);
  cudaFree(dx);
  cudaFree(dy);
}

}  // namespace

TEST(Nvfp4Gemv, MatchesCpuReference) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  run_case(1, 256, 1024, 1);
  run_case(3, 129, 2048, 2);
  run_case(8, 64, 6144, 3);
  run_case(1, 7, 32, 4);
}

TEST(Nvfp4Gemv, RefusesBadShapes) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ms::cuda::Nvfp4GemvParams p{nullptr, nullptr, 1.f, nullptr, nullptr, 9, 16, 64};
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
  p.m = 1;
  p.k = 48;
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
}

TEST(DeviceCaps, SharedMemoryCheckRefusesOversizedTiles) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto caps = ms::cuda::query_device(0);
  EXPECT_GT(caps.smem_per_block_optin, 0u);
  EXPECT_NO_THROW(ms::cuda::check_smem(caps, "small", 1024));
  EXPECT_THROW(ms::cuda::check_smem(caps, "huge", caps.smem_per_block_optin + 1), ms::Error);
}
