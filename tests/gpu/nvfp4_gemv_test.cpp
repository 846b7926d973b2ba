// The NVFP4 GEMV kernel against the CPU reference (quant/nvfp4.h dequantisation, double dot products).
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
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

// How x and y are passed: f32 x (rounded to bf16 in the kernel) rows x_stride apart instead of bf16 x, and
// y rows y_stride apart (0: n). The padding of strided y is NaN-poisoned and must stay so.
// With `counters` the k-slices are added by the last block of each row block (no reduction pass).
struct Layout {
  bool f32_x = false;
  int64_t x_stride = 0, y_stride = 0;
  bool counters = false;
};

// Returns the device output (rows n apart) so callers can compare runs bit for bit.
std::vector<float> run_case(int m, int n, int k, uint32_t seed, Layout lay = {}) {
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
  std::vector<double> ref(static_cast<size_t>(m) * n), ref_abs(ref.size());
  std::vector<float> row(k);
  for (int j = 0; j < n; ++j) {
    ms::quant::nvfp4_dequantize_row(q.packed.data() + static_cast<size_t>(j) * k / 2,
                                    q.scales.data() + static_cast<size_t>(j) * k / 16, q.scale2, k,
                                    row.data());
    for (int r = 0; r < m; ++r) {
      double s = 0, a = 0;
      for (int c = 0; c < k; ++c) {
        const double term = static_cast<double>(row[c]) * xf[static_cast<size_t>(r) * k + c];
        s += term;
        a += std::fabs(term);
      }
      ref[static_cast<size_t>(r) * n + j] = s;
      ref_abs[static_cast<size_t>(r) * n + j] = a;
    }
  }
  auto* dw = to_device(q.packed);
  auto* ds = to_device(q.scales);
  auto* dx = to_device(x);
  // f32 x: the same bf16 values (so the reference holds) plus a part below bf16's precision that the kernel's
  // rounding to nearest must drop (under half an ulp of the bf16 value, the value itself when 0).
  const int64_t xs = lay.x_stride > 0 ? lay.x_stride : k;
  std::vector<float> xf32(static_cast<size_t>(m) * xs, std::nanf(""));
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < k; ++c) {
      const float v = xf[static_cast<size_t>(r) * k + c];
      xf32[static_cast<size_t>(r) * xs + c] = v + v * 0x1p-10f;
    }
  float* dxf = lay.f32_x ? to_device(xf32) : nullptr;
  const int64_t ys = lay.y_stride > 0 ? lay.y_stride : n;
  float* dy = nullptr;
  CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(m) * ys * sizeof(float)));
  CUDA_CHECK(cudaMemset(dy, 0xff, static_cast<size_t>(m) * ys * sizeof(float)));  // NaN
  float* dws = nullptr;
  const size_t ws_bytes = ms::cuda::nvfp4_gemv_workspace_bytes(m, n, k);
  if (ws_bytes) CUDA_CHECK(cudaMalloc(&dws, ws_bytes));
  ms::cuda::Nvfp4GemvParams p{dw, ds, q.scale2, reinterpret_cast<const __nv_bfloat16*>(dx), dy, m, n, k, dws};
  if (lay.f32_x) {
    p.x = nullptr;
    p.x_f32 = dxf;
    p.x_f32_stride = lay.x_stride;
  }
  p.y_stride = lay.y_stride;
  uint32_t* dc = nullptr;
  const size_t cnt_bytes = ms::cuda::nvfp4_gemv_counter_bytes(n);
  if (lay.counters) {
    CUDA_CHECK(cudaMalloc(&dc, cnt_bytes));
    CUDA_CHECK(cudaMemset(dc, 0, cnt_bytes));
    p.counters = dc;
  }
  ms::cuda::nvfp4_gemv(p, nullptr);
  if (dc) {
    std::vector<uint32_t> cnt(cnt_bytes / 4);
    CUDA_CHECK(cudaMemcpy(cnt.data(), dc, cnt_bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt.size(); ++i) EXPECT_EQ(cnt[i], 0u) << "counter " << i << " left set";
    cudaFree(dc);
  }
  std::vector<float> ypad(static_cast<size_t>(m) * ys);
  CUDA_CHECK(cudaMemcpy(ypad.data(), dy, ypad.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<float> y(ref.size());
  for (int r = 0; r < m; ++r)
    for (int64_t c = 0; c < ys; ++c) {
      const float v = ypad[static_cast<size_t>(r) * ys + c];
      if (c < n)
        y[static_cast<size_t>(r) * n + c] = v;
      else
        EXPECT_TRUE(std::isnan(v)) << "padding [" << r << ", " << c << "] written, m=" << m << " n=" << n;
    }
  // The products e2m1 x e4m3 x bf16 are exact in the tensor cores; what differs from the double reference is
  // f32 accumulation order (and the tensor cores' truncating adds): bounded by a few ulp of f32 per add,
  // relative to the sum of |terms|, not to the (possibly cancelling) result.
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!(std::fabs(y[i] - ref[i]) <= 2e-5 * (ref_abs[i] + 1e-30))) worst = std::max(worst, 1.0);  // NaN too
    worst = std::max(worst, std::fabs(y[i] - ref[i]) / (ref_abs[i] + 1e-30));
  }
  EXPECT_LT(worst, 2e-5) << "m=" << m << " n=" << n << " k=" << k << (lay.f32_x ? " f32 x" : " bf16 x")
                         << " y_stride=" << lay.y_stride;
  cudaFree(dw);
  cudaFree(ds);
  cudaFree(dx);
  cudaFree(dxf);
  cudaFree(dy);
  cudaFree(dws);
  return y;
}

}  // namespace

TEST(Nvfp4Gemv, MatchesCpuReference) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  run_case(1, 256, 1024, 1);
  run_case(3, 129, 2048, 2);
  run_case(8, 64, 6144, 3);
  run_case(1, 7, 32, 4);
  // Every m, k not a multiple of the 128-wide warp step, and k long enough for several k-slices (workspace
  // and the reduction pass), rows not a multiple of 16.
  for (int m = 1; m <= 8; ++m) run_case(m, 77, 1056, 10 + m);
  run_case(2, 40, 96, 20);
  run_case(8, 300, 16384, 21);
  run_case(5, 1000, 6144, 22);
}

TEST(Nvfp4Gemv, F32ActivationsAndStridedOutput) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // f32 x read in place (rows padded), y rows wider than n (a column slice of a fused output), with and
  // without the k-slice reduction pass; every m.
  for (int m = 1; m <= 8; ++m) run_case(m, 77, 1056, 40 + m, Layout{true, 1056 + 4 * m, 77 + 2 * m + 1});
  run_case(1, 129, 6144, 50, Layout{true, 0, 0});
  run_case(8, 300, 16384, 51, Layout{true, 16388, 301});
  run_case(3, 64, 64, 52, Layout{true, 68, 0});
  run_case(5, 40, 96, 53, Layout{false, 0, 41});  // bf16 x, strided y
}

TEST(Nvfp4Gemv, LastBlockReductionGivesTheReductionPassBits) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // Shapes that split k (64 rows x 16384: too few rows for one k-slice per block), every m template.
  for (int m : {1, 2, 3, 8}) {
    for (auto [n, k] : {std::pair{64, 16384}, std::pair{77, 6144}, std::pair{300, 4096}}) {
      const auto two_pass = run_case(m, n, k, 60 + m, Layout{true, 0, 0, false});
      const auto one_pass = run_case(m, n, k, 60 + m, Layout{true, 0, n + 5, true});
      ASSERT_EQ(two_pass.size(), one_pass.size());
      for (size_t i = 0; i < one_pass.size(); ++i)
        ASSERT_EQ(std::memcmp(&one_pass[i], &two_pass[i], 4), 0)
            << "m=" << m << " n=" << n << " k=" << k << " element " << i;
    }
  }
}

TEST(Nvfp4Gemv, SplitReductionIsDeterministic) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto a = run_case(4, 257, 8192, 30);
  auto b = run_case(4, 257, 8192, 30);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

TEST(Nvfp4Gemv, RefusesMissingWorkspace) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_GT(ms::cuda::nvfp4_gemv_workspace_bytes(1, 64, 16384), 0u);
  void* buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
  auto* u8 = static_cast<uint8_t*>(buf);
  // 64 rows x 16384: too few rows for one k-slice per block, so the plan splits k and needs the workspace.
  ms::cuda::Nvfp4GemvParams p{
      u8, u8,    1.f,    reinterpret_cast<const __nv_bfloat16*>(u8), static_cast<float*>(buf), 1,
      64, 16384, nullptr};
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
  cudaFree(buf);
}

TEST(Nvfp4Gemv, RefusesBadShapes) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ms::cuda::Nvfp4GemvParams p{nullptr, nullptr, 1.f, nullptr, nullptr, 9, 16, 64};
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
  p.m = 1;
  p.k = 48;
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
  void* buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, 1 << 16));
  auto* u8 = static_cast<uint8_t*>(buf);
  p = ms::cuda::Nvfp4GemvParams{
      u8, u8, 1.f, reinterpret_cast<const __nv_bfloat16*>(u8), reinterpret_cast<float*>(u8 + 32768),
      1,  16, 64};
  p.x_f32 = reinterpret_cast<const float*>(u8);  // both x and x_f32
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
  p.x = nullptr;
  p.x_f32_stride = 66;  // not a multiple of 4
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
  p.x_f32_stride = 0;
  p.y_stride = 8;  // narrower than n
  EXPECT_THROW(ms::cuda::nvfp4_gemv(p, nullptr), ms::Error);
  cudaFree(buf);
}

TEST(DeviceCaps, SharedMemoryCheckRefusesOversizedTiles) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto caps = ms::cuda::query_device(0);
  EXPECT_GT(caps.smem_per_block_optin, 0u);
  EXPECT_NO_THROW(ms::cuda::check_smem(caps, "small", 1024));
  EXPECT_THROW(ms::cuda::check_smem(caps, "huge", caps.smem_per_block_optin + 1), ms::Error);
}
