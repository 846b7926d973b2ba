// The CUDA linear paths against the CPU reference: weight dequantisation (bit-exact with
// kernels/cpu dequantize_row, and its bf16 rounding), the direct dequantising kernel for every format,
// cuBLASLt bf16 and f32 GEMMs, and the linear() runner on the path linear_plan picks.
// Tolerances, relative to sum_k |x_k w_k| of each output (not to the possibly cancelling result):
//   direct kernel and f32 GEMM 1e-4 (f32 accumulation of up to ~1000 terms, typical error ~1e-6);
//   bf16 GEMM and bf16_gemv vs the same bf16 inputs in double 5e-5 (bf16 x bf16 products are exact in f32;
//   what differs is the order of f32 adds); bf16 paths vs the f32 CPU reference 1e-2 (x and the weight
//   rounded to bf16, 2^-9 each).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/weight_view.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/blaslt.h"
#include "kernels/cuda/gemm/dequant_weight.h"
#include "kernels/cuda/gemm/direct_linear.h"
#include "kernels/cuda/gemm/linear.h"
#include "ops/attention.h"
#include "ops/cuda_backend.h"
#include "ops/linear_weight.h"
#include "ops/ops.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

namespace {

using ms::cuda::WeightFormat;
using ms::test::DeviceBuffer;
using ms::test::random_floats;
namespace cpu = ms::kernels::cpu;

const WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::BF16, WeightFormat::FP8Block,
                                 WeightFormat::NVFP4};

// One weight in its stored format, on the host (for the CPU reference) and on the device.
struct TestWeight {
  WeightFormat format;
  int64_t rows, cols;
  std::vector<uint8_t> data, scale;  // raw bytes
  float scale2 = 1.0f;
  std::unique_ptr<DeviceBuffer<uint8_t>> d_data, d_scale;

  TestWeight(WeightFormat f, int64_t r, int64_t c, uint32_t seed) : format(f), rows(r), cols(c) {
    const auto w = random_floats(static_cast<size_t>(r * c), seed, 0.0f, 0.05f);
    auto bytes_of = [](const auto& v) {
      std::vector<uint8_t> b(v.size() * sizeof(v[0]));
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    };
    switch (f) {
      case WeightFormat::F32:
        data = bytes_of(w);
        break;
      case WeightFormat::BF16: {
        std::vector<uint16_t> h(w.size());
        for (size_t i = 0; i < w.size(); ++i) h[i] = ms::quant::f32_to_bf16(w[i]);
        data = bytes_of(h);
        break;
      }
      case WeightFormat::FP8Block: {
        auto q = ms::quant::fp8_block_quantize(w.data(), r, c);
        data = q.data;
        scale = bytes_of(q.scale_inv);
        break;
      }
      case WeightFormat::NVFP4: {
        auto q = ms::quant::nvfp4_quantize(w.data(), r, c);
        data = q.packed;
        scale = q.scales;
        scale2 = q.scale2;
        break;
      }
    }
    d_data = std::make_unique<DeviceBuffer<uint8_t>>(data);
    if (!scale.empty()) d_scale = std::make_unique<DeviceBuffer<uint8_t>>(scale);
  }
  cpu::WeightView cpu_view() const {
    cpu::WeightView v;
    v.format = static_cast<cpu::WeightFormat>(static_cast<int>(format));
    v.rows = rows;
    v.cols = cols;
    v.data = data.data();
    v.scale = scale.empty() ? nullptr : scale.data();
    v.scale2 = scale2;
    v.block = 128;
    return v;
  }
  ms::cuda::DeviceWeight device() const {
    ms::cuda::DeviceWeight d;
    d.format = format;
    d.rows = rows;
    d.cols = cols;
    d.data = d_data->get();
    d.scale = d_scale ? d_scale->get() : nullptr;
    d.scale2 = scale2;
    d.block = 128;
    return d;
  }
  std::vector<float> dequant_row(int64_t r) const {
    std::vector<float> out(static_cast<size_t>(cols));
    cpu::dequantize_row(cpu_view(), r, out.data());
    return out;
  }
};

std::string name_of(WeightFormat f) {
  return ms::cuda::weight_format_name(f);
}

// Reference y and sum |terms| in double, from rows [row0, row0 + n) of the CPU-dequantised weight.
// `round_bf16`: x and w rounded to bf16 first (the inputs a bf16 GEMM sees); with `round_w` false only x
// (what the FP8-block GEMV sees: fp8 values exact, the block scale applied in f32).
void reference(const TestWeight& w, int64_t row0, int64_t n, const std::vector<float>& x, int64_t x_stride,
               int64_t m, bool round_bf16, std::vector<double>& ref, std::vector<double>& abs_sum,
               bool round_w = true) {
  const int64_t k = w.cols;
  auto rx = [&](float v) { return round_bf16 ? ms::quant::bf16_to_f32(ms::quant::f32_to_bf16(v)) : v; };
  auto rb = [&](float v) { return round_w ? rx(v) : v; };
  ref.assign(static_cast<size_t>(m * n), 0.0);
  abs_sum.assign(ref.size(), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const auto row = w.dequant_row(row0 + j);
    for (int64_t i = 0; i < m; ++i) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double t = static_cast<double>(rb(row[c])) * rx(x[i * x_stride + c]);
        s += t;
        a += std::fabs(t);
      }
      ref[i * n + j] = s;
      abs_sum[i * n + j] = a;
    }
  }
}

// Every output within rtol * sum|terms| (+ a denormal-scale floor); padding after n stays poisoned.
void expect_linear_close(const std::vector<float>& y, int64_t y_stride, const std::vector<double>& ref,
                         const std::vector<double>& abs_sum, int64_t m, int64_t n, double rtol,
                         const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < m && bad < 5; ++i)
    for (int64_t j = 0; j < y_stride && bad < 5; ++j) {
      const float g = y[i * y_stride + j];
      if (j >= n) {
        if (!std::isnan(g)) {
          ADD_FAILURE() << what << ": padding [" << i << ", " << j << "] written";
          ++bad;
        }
        continue;
      }
      const double e = ref[i * n + j], tol = rtol * abs_sum[i * n + j] + 1e-30;
      if (!(std::fabs(g - e) <= tol)) {
        ADD_FAILURE() << what << ": [" << i << ", " << j << "] got " << g << " want " << e << " (tol " << tol
                      << ")";
        ++bad;
      }
    }
}

TEST(CudaDequantWeight, ExactVsCpuDequantisation) {
  MS_REQUIRE_GPU();
  struct Case {
    WeightFormat f;
    int64_t rows, cols;
  };
  for (const Case c : {Case{WeightFormat::FP8Block, 200, 300}, Case{WeightFormat::FP8Block, 130, 128},
                       Case{WeightFormat::NVFP4, 77, 208}, Case{WeightFormat::BF16, 9, 33},
                       Case{WeightFormat::F32, 12, 17}}) {
    TestWeight w(c.f, c.rows, c.cols, 100);
    const int64_t row0 = 3, n = c.rows - 5, stride = c.cols + 8;
    DeviceBuffer<float> d_f32(static_cast<size_t>(n * stride));
    DeviceBuffer<uint16_t> d_bf16(static_cast<size_t>(n * stride));
    ms::cuda::DequantWeightParams p;
    p.w = w.device();
    p.row0 = row0;
    p.n = n;
    p.out_f32 = d_f32.get();
    p.out_stride = stride;
    ms::cuda::dequant_weight(p, nullptr);
    p.out_f32 = nullptr;
    p.out_bf16 = reinterpret_cast<__nv_bfloat16*>(d_bf16.get());
    ms::cuda::dequant_weight(p, nullptr);
    const auto got = d_f32.download();
    const auto got_bf16 = d_bf16.download();
    for (int64_t j = 0; j < n; ++j) {
      const auto row = w.dequant_row(row0 + j);
      for (int64_t c2 = 0; c2 < stride; ++c2) {
        const size_t at = static_cast<size_t>(j * stride + c2);
        if (c2 >= c.cols) {
          ASSERT_TRUE(std::isnan(got[at]) && got_bf16[at] == 0xffff) << name_of(c.f) << " padding written";
          continue;
        }
        ASSERT_TRUE(ms::test::same_float(got[at], row[c2]))
            << name_of(c.f) << " row " << j << " col " << c2 << ": " << got[at] << " vs " << row[c2];
        ASSERT_EQ(got_bf16[at], ms::quant::f32_to_bf16(row[c2])) << name_of(c.f) << " bf16 row " << j;
      }
    }
  }
}

TEST(CudaDequantWeight, EveryFp8CodeDecodesAsTheCpuTable) {
  MS_REQUIRE_GPU();
  // One 2 x 128 block of all 256 codes with scale 1: the device decoder against quant's table, NaNs included.
  TestWeight w(WeightFormat::FP8Block, 2, 128, 101);
  for (int i = 0; i < 256; ++i) w.data[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  const float one = 1.0f;
  std::memcpy(w.scale.data(), &one, 4);
  w.d_data->upload(w.data);
  w.d_scale->upload(w.scale);
  DeviceBuffer<float> d_out(256);
  ms::cuda::DequantWeightParams p;
  p.w = w.device();
  p.n = 2;
  p.out_f32 = d_out.get();
  p.out_stride = 128;
  ms::cuda::dequant_weight(p, nullptr);
  const auto got = d_out.download();
  const float* table = ms::quant::fp8_e4m3_table();
  for (int i = 0; i < 256; ++i)
    ASSERT_TRUE(ms::test::same_float(got[static_cast<size_t>(i)], table[i])) << "code " << i;
}

TEST(CudaDirectLinear, EveryFormatMatchesCpuDequantisedDot) {
  MS_REQUIRE_GPU();
  struct Case {
    int64_t m, rows, k;
  };
  for (WeightFormat f : kFormats) {
    for (const Case c : {Case{1, 65, 48}, Case{3, 130, 1040}, Case{16, 64, 304}, Case{17, 1, 16},
                         Case{40, 200, 300}, Case{5, 3, 7}}) {
      const int64_t k = f == WeightFormat::NVFP4 ? (c.k + 15) / 16 * 16 : c.k;
      TestWeight w(f, c.rows, k, 200 + static_cast<uint32_t>(c.m));
      const int64_t row0 = c.rows > 2 ? 1 : 0, n = c.rows > 2 ? c.rows - 2 : c.rows;
      const int64_t xs = k + 5, ys = n + 3;
      const auto x = random_floats(static_cast<size_t>(c.m * xs), 300);
      std::vector<double> ref, abs_sum;
      reference(w, row0, n, x, xs, c.m, false, ref, abs_sum);
      DeviceBuffer<float> d_x(x), d_y(static_cast<size_t>(c.m * ys));
      ms::cuda::DirectLinearParams p;
      p.x = d_x.get();
      p.x_stride = xs;
      p.w = w.device();
      p.row0 = row0;
      p.n = n;
      p.y = d_y.get();
      p.y_stride = ys;
      p.m = c.m;
      ms::cuda::direct_linear(p, nullptr);
      expect_linear_close(d_y.download(), ys, ref, abs_sum, c.m, n, 1e-4,
                          "direct " + name_of(f) + " m=" + std::to_string(c.m) + " k=" + std::to_string(k));
    }
  }
}

TEST(CudaBlasLt, Bf16GemmMatchesReference) {
  MS_REQUIRE_GPU();
  ms::cuda::BlasLtHandle lt;
  struct Case {
    int64_t m, n, k, w_pad;
  };
  for (const Case c :
       {Case{1, 8, 64, 0}, Case{17, 72, 136, 8}, Case{64, 257, 1024, 0}, Case{129, 96, 520, 0}}) {
    for (bool from_f32 : {true, false}) {
      TestWeight w(WeightFormat::BF16, c.n, c.k, 400);
      const int64_t ws = c.k + c.w_pad, xs = c.k + 3, xbs = c.k + 8, ys = c.n + 4;
      // The weight with padded rows when w_pad > 0.
      std::vector<uint16_t> wp(static_cast<size_t>(c.n * ws), 0xffff);
      for (int64_t j = 0; j < c.n; ++j)
        std::memcpy(&wp[j * ws], w.data.data() + j * c.k * 2, static_cast<size_t>(c.k) * 2);
      const auto x = random_floats(static_cast<size_t>(c.m * xs), 401);
      std::vector<uint16_t> xb(static_cast<size_t>(c.m * xbs), 0xffff);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t t = 0; t < c.k; ++t) xb[i * xbs + t] = ms::quant::f32_to_bf16(x[i * xs + t]);
      std::vector<double> ref, abs_sum, ref32, abs32;
      reference(w, 0, c.n, x, xs, c.m, true, ref, abs_sum);
      reference(w, 0, c.n, x, xs, c.m, false, ref32, abs32);
      DeviceBuffer<float> d_x(x), d_y(static_cast<size_t>(c.m * ys));
      DeviceBuffer<uint16_t> d_w(wp), d_xb(static_cast<size_t>(c.m * xbs));
      if (!from_f32) d_xb.upload(xb);
      ms::cuda::GemmBf16Params p;
      p.x_f32 = from_f32 ? d_x.get() : nullptr;
      p.x_f32_stride = xs;
      p.x_bf16 = reinterpret_cast<__nv_bfloat16*>(d_xb.get());
      p.x_bf16_stride = xbs;
      p.w = reinterpret_cast<const __nv_bfloat16*>(d_w.get());
      p.w_stride = ws;
      p.y = d_y.get();
      p.y_stride = ys;
      p.m = c.m;
      p.n = c.n;
      p.k = c.k;
      ms::cuda::gemm_bf16(p, lt, nullptr);
      const auto y = d_y.download();
      const std::string what = "gemm_bf16 m=" + std::to_string(c.m) + " n=" + std::to_string(c.n);
      expect_linear_close(y, ys, ref, abs_sum, c.m, c.n, 5e-5, what);
      expect_linear_close(y, ys, ref32, abs32, c.m, c.n, 1e-2, what + " vs f32");
      if (from_f32) {  // the cast wrote the scratch exactly as the CPU rounds
        const auto got_xb = d_xb.download();
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t t = 0; t < c.k; ++t) ASSERT_EQ(got_xb[i * xbs + t], xb[i * xbs + t]);
      }
    }
  }
  EXPECT_GT(lt.cached_plans(), 0u);
}

TEST(CudaBlasLt, F32GemmMatchesReference) {
  MS_REQUIRE_GPU();
  ms::cuda::BlasLtHandle lt;
  struct Case {
    int64_t m, n, k;
  };
  for (const Case c : {Case{1, 8, 64}, Case{33, 100, 260}, Case{64, 64, 1024}, Case{20, 3, 4}}) {
    TestWeight w(WeightFormat::F32, c.n, c.k, 500);
    const int64_t xs = c.k + 4, ys = c.n + 1;
    const auto x = random_floats(static_cast<size_t>(c.m * xs), 501);
    std::vector<double> ref, abs_sum;
    reference(w, 0, c.n, x, xs, c.m, false, ref, abs_sum);
    DeviceBuffer<float> d_x(x), d_y(static_cast<size_t>(c.m * ys));
    ms::cuda::GemmF32Params p;
    p.x = d_x.get();
    p.x_stride = xs;
    p.w = reinterpret_cast<const float*>(w.d_data->get());
    p.w_stride = c.k;
    p.y = d_y.get();
    p.y_stride = ys;
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    ms::cuda::gemm_f32(p, lt, nullptr);
    const size_t plans = lt.cached_plans();
    d_y.poison();
    ms::cuda::gemm_f32(p, lt, nullptr);  // the cached plan
    EXPECT_EQ(lt.cached_plans(), plans);
    expect_linear_close(d_y.download(), ys, ref, abs_sum, c.m, c.n, 1e-4,
                        "gemm_f32 m=" + std::to_string(c.m) + " n=" + std::to_string(c.n));
  }
}

// FP8 e4m3 x e4m3 through cuBLASLt (the FP8 matrix-rate ceiling's GEMM) against the same decoded values
// multiplied in double, relative to sum |x w|; the scale multiplies the product. Hopper's FP8 tensor cores
// accumulate with fewer mantissa bits than f32 (measured on an H200: worst 1.1e-4 at k = 128, 3.4e-5 at
// k = 1024), so the bound is 5e-4; a wrong layout or scale gives errors of order 1.
TEST(CudaBlasLt, Fp8GemmMatchesReference) {
  MS_REQUIRE_GPU();
  int dev = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major * 10 + minor < 89) GTEST_SKIP() << "no FP8 tensor cores before sm_89";
  ms::cuda::BlasLtHandle lt;
  struct Case {
    int64_t m, n, k;
  };
  for (const Case c : {Case{16, 64, 128}, Case{32, 96, 256}, Case{64, 128, 1024}}) {
    const int64_t xs = c.k + 16, ws = c.k, ys = c.n + 4;
    auto codes = [](size_t count, uint32_t seed) {
      const auto f = random_floats(count, seed, 0.0f, 2.0f);
      std::vector<uint8_t> b(count);
      for (size_t i = 0; i < count; ++i) b[i] = ms::quant::f32_to_fp8_e4m3(f[i]);
      return b;
    };
    const auto hx = codes(static_cast<size_t>(c.m * xs), 700), hw = codes(static_cast<size_t>(c.n * ws), 701);
    DeviceBuffer<uint8_t> d_x(hx), d_w(hw);
    DeviceBuffer<float> d_y(static_cast<size_t>(c.m * ys));
    ms::cuda::GemmFp8Params p;
    p.x = d_x.get();
    p.x_stride = xs;
    p.w = d_w.get();
    p.w_stride = ws;
    p.y = d_y.get();
    p.y_stride = ys;
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    p.scale = 0.5f;
    ms::cuda::gemm_fp8(p, lt, nullptr);
    const auto y = d_y.download();
    double worst = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t t = 0; t < c.k; ++t) {
          const double v =
              static_cast<double>(ms::quant::fp8_e4m3_to_f32(hx[static_cast<size_t>(i * xs + t)])) *
              ms::quant::fp8_e4m3_to_f32(hw[static_cast<size_t>(j * ws + t)]);
          ref += v;
          mag += std::fabs(v);
        }
        const double got = y[static_cast<size_t>(i * ys + j)];
        ASSERT_TRUE(std::isfinite(got)) << "row " << i << " col " << j << " not written";
        worst = std::max(worst, std::fabs(got - 0.5 * ref) / (0.5 * mag + 1e-30));
      }
    EXPECT_LT(worst, 5e-4) << "gemm_fp8 m=" << c.m << " n=" << c.n << " k=" << c.k;
  }
}

TEST(CudaLinear, PlannedPathMatchesCpuLinear) {
  MS_REQUIRE_GPU();
  ms::cuda::BlasLtHandle lt;
  for (WeightFormat f : kFormats) {
    for (int64_t m : {2, 16, 40, 200}) {
      const int64_t rows = 96, k = 256, row0 = 16, n = 64, xs = k + 8, ys = n + 2;
      TestWeight w(f, rows, k, 600);
      const auto x = random_floats(static_cast<size_t>(m * xs), 601);
      // The CPU op's own kernel as the reference value, the double dot for the tolerance scale.
      std::vector<float> ref_cpu(static_cast<size_t>(m * n));
      cpu::LinearParams cp;
      cp.x = x.data();
      cp.x_stride = xs;
      cp.w = w.cpu_view();
      cp.row0 = row0;
      cp.n = n;
      cp.y = ref_cpu.data();
      cp.y_stride = n;
      cp.m = m;
      cpu::linear(cp);
      std::vector<double> ref, abs_sum;
      reference(w, row0, n, x, xs, m, false, ref, abs_sum);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = ref_cpu[i];
      const auto path = ms::cuda::linear_plan(f, m, n, k);
      const auto scratch = ms::cuda::linear_scratch_bytes(path, m, n, k);
      DeviceBuffer<float> d_x(x), d_y(static_cast<size_t>(m * ys));
      DeviceBuffer<uint16_t> d_xs(scratch.x_bytes / 2 + 1), d_ws(scratch.w_bytes / 2 + 1);
      ms::cuda::LinearParams p;
      p.x = d_x.get();
      p.x_stride = xs;
      p.w = w.device();
      p.row0 = row0;
      p.n = n;
      p.y = d_y.get();
      p.y_stride = ys;
      p.m = m;
      p.x_scratch = reinterpret_cast<__nv_bfloat16*>(d_xs.get());
      p.w_scratch = reinterpret_cast<__nv_bfloat16*>(d_ws.get());
      DeviceBuffer<float> d_part(scratch.gemv_partial_bytes / 4 + 1);
      DeviceBuffer<uint32_t> d_cnt(scratch.gemv_counter_bytes / 4 + 1);
      CUDA_CHECK(cudaMemset(d_cnt.get(), 0, d_cnt.size() * 4));
      p.gemv_partial = d_part.get();
      p.gemv_counters = d_cnt.get();
      ms::cuda::linear(p, path, lt, nullptr);
      const bool bf16_path =
          path == ms::cuda::LinearPath::BlasLtBf16 || path == ms::cuda::LinearPath::DequantBlasLt ||
          path == ms::cuda::LinearPath::GemvBf16 || path == ms::cuda::LinearPath::GemvFp8Block;
      expect_linear_close(
          d_y.download(), ys, ref, abs_sum, m, n, bf16_path ? 1e-2 : 1e-4,
          "linear " + name_of(f) + " m=" + std::to_string(m) + " path " + ms::cuda::linear_path_name(path));
    }
  }
}

TEST(CudaLinear, PlanChoosesByFormatAndRows) {
  using ms::cuda::linear_plan;
  using ms::cuda::LinearPath;
  EXPECT_EQ(linear_plan(WeightFormat::F32, 1, 4096, 4096), LinearPath::BlasLtF32);
  EXPECT_EQ(linear_plan(WeightFormat::BF16, 1, 2048, 4096), LinearPath::GemvBf16);
  EXPECT_EQ(linear_plan(WeightFormat::BF16, 8, 2048, 4096), LinearPath::GemvBf16);
  EXPECT_EQ(linear_plan(WeightFormat::BF16, 1, 4096, 4096), LinearPath::BlasLtBf16);  // 32 MB: cuBLASLt
  EXPECT_EQ(linear_plan(WeightFormat::BF16, 9, 4096, 4096), LinearPath::BlasLtBf16);
  EXPECT_EQ(ms::cuda::linear_scratch_bytes(LinearPath::GemvBf16, 1, 4096, 4096).x_bytes, 0u);
  EXPECT_EQ(linear_plan(WeightFormat::FP8Block, 1, 4096, 4096), LinearPath::GemvFp8Block);
  EXPECT_EQ(linear_plan(WeightFormat::FP8Block, 8, 4096, 4104), LinearPath::DequantBlasLt);  // k % 16 != 0
  EXPECT_EQ(linear_plan(WeightFormat::FP8Block, 9, 4096, 4096), LinearPath::DequantBlasLt);
  EXPECT_EQ(linear_plan(WeightFormat::NVFP4, 1, 4096, 4096), LinearPath::DequantBlasLt);
  EXPECT_EQ(linear_plan(WeightFormat::BF16, 1, 4096, 300), LinearPath::Direct);
  EXPECT_EQ(linear_plan(WeightFormat::F32, 64, 512, 512), LinearPath::BlasLtF32);
  EXPECT_EQ(linear_plan(WeightFormat::BF16, 64, 512, 512), LinearPath::BlasLtBf16);
  EXPECT_EQ(linear_plan(WeightFormat::FP8Block, 64, 512, 512), LinearPath::DequantBlasLt);
  EXPECT_EQ(linear_plan(WeightFormat::NVFP4, 64, 512, 512), LinearPath::DequantBlasLt);
  EXPECT_EQ(linear_plan(WeightFormat::BF16, 64, 512, 300), LinearPath::Direct);  // k rows not 16-byte aligned
  EXPECT_EQ(ms::cuda::linear_scratch_bytes(LinearPath::DequantBlasLt, 64, 512, 256).w_bytes, 512u * 256 * 2);
  EXPECT_EQ(ms::cuda::linear_scratch_bytes(LinearPath::Direct, 64, 512, 256).x_bytes, 0u);
}

TEST(CudaLinear, LaunchersRefuseBadWeights) {
  float dummy[64] = {};
  ms::cuda::DirectLinearParams p;
  p.x = dummy;
  p.x_stride = 40;
  p.w.format = WeightFormat::NVFP4;
  p.w.rows = 1;
  p.w.cols = 40;  // not a multiple of 16
  p.w.data = dummy;
  p.w.scale = dummy;
  p.n = 1;
  p.y = dummy;
  p.y_stride = 1;
  p.m = 1;
  EXPECT_THROW(ms::cuda::direct_linear(p, nullptr), ms::Error);
  p.w.cols = 32;
  p.x_stride = 32;
  p.w.scale = nullptr;  // missing block scales
  EXPECT_THROW(ms::cuda::direct_linear(p, nullptr), ms::Error);
  p.w.scale = dummy;
  p.row0 = 1;  // rows [1, 2) of a 1-row weight
  EXPECT_THROW(ms::cuda::direct_linear(p, nullptr), ms::Error);
}

// The split-K scratch of a decode GEMV run (bf16_gemv, fp8_block_gemv): what the launcher asks for, or what
// the forced configuration `cfg` needs; counters zeroed.
struct GemvScratch {
  DeviceBuffer<float> part;
  DeviceBuffer<uint32_t> cnt;
  GemvScratch(const ms::cuda::Bf16GemvScratch& s, const ms::cuda::bf16_gemv_config::Config* cfg, int m, int n)
      : part(std::max(s.partial_bytes, cfg ? size_t{4} * cfg->splits * m * n : 0) / 4 + 1),
        cnt(std::max(s.counter_bytes, cfg ? size_t{4} * cfg->row_blocks : 0) / 4 + 1) {
    CUDA_CHECK(cudaMemset(cnt.get(), 0, cnt.size() * 4));
  }
};

// A decode GEMV's y against the double reference on bf16-rounded x (5e-5 of sum |terms|) and on f32 x
// (1e-2), and its split counters back at zero.
void expect_gemv_result(const std::vector<float>& y, int64_t ys, const std::vector<double>& ref,
                        const std::vector<double>& abs_sum, const std::vector<double>& ref32,
                        const std::vector<double>& abs32, int m, int n, const GemvScratch& scratch,
                        const std::string& what) {
  expect_linear_close(y, ys, ref, abs_sum, m, n, 5e-5, what);
  expect_linear_close(y, ys, ref32, abs32, m, n, 1e-2, what + " vs f32");
  const auto cnt = scratch.cnt.download();
  for (size_t i = 0; i < cnt.size(); ++i) EXPECT_EQ(cnt[i], 0u) << what << ": counter " << i << " left set";
}

// bf16_gemv against the double reference on x rounded to bf16 (5e-5 of sum |terms|) and on f32 x (1e-2):
// rows [row0, row0 + n) of a taller weight, x rows xs apart starting x_off floats into their buffer (1: the
// unaligned scalar-load path), y rows ys apart and NaN-poisoned (every output written, nothing past n). With
// `cfg` the given configuration runs instead of the chooser's. Checks that the split counters are zero
// again afterwards; returns y.
std::vector<float> check_bf16_gemv(int m, int rows, int row0, int n, int k, int64_t xs, int64_t ys, int x_off,
                                   uint32_t seed, const ms::cuda::bf16_gemv_config::Config* cfg = nullptr) {
  const std::string what =
      "bf16_gemv m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
      " row0=" + std::to_string(row0) +
      (cfg ? " warps=" + std::to_string(cfg->warps) + " spb=" + std::to_string(cfg->slices_per_block) +
                 " tpb=" + std::to_string(cfg->tiles_per_block)
           : std::string());
  TestWeight w(WeightFormat::BF16, rows, k, seed);
  const auto x = random_floats(static_cast<size_t>(m * xs), seed + 1);
  std::vector<double> ref, abs_sum, ref32, abs32;
  reference(w, row0, n, x, xs, m, true, ref, abs_sum);
  reference(w, row0, n, x, xs, m, false, ref32, abs32);
  std::vector<float> xbuf(static_cast<size_t>(m * xs + x_off), 0.f);
  std::copy(x.begin(), x.end(), xbuf.begin() + x_off);
  DeviceBuffer<float> d_x(xbuf), d_y(static_cast<size_t>(m * ys));
  const GemvScratch scratch(ms::cuda::bf16_gemv_scratch_bytes(m, n, k), cfg, m, n);
  ms::cuda::Bf16GemvParams p;
  p.x = d_x.get() + x_off;
  p.x_stride = xs;
  p.w = reinterpret_cast<const __nv_bfloat16*>(w.d_data->get()) + static_cast<size_t>(row0) * k;
  p.w_stride = k;
  p.y = d_y.get();
  p.y_stride = ys;
  p.m = m;
  p.n = n;
  p.k = k;
  p.partial = scratch.part.get();
  p.counters = scratch.cnt.get();
  if (cfg)
    ms::cuda::bf16_gemv_with(p, *cfg, nullptr);
  else
    ms::cuda::bf16_gemv(p, nullptr);
  const auto y = d_y.download();
  expect_gemv_result(y, ys, ref, abs_sum, ref32, abs32, m, n, scratch, what);
  return y;
}

TEST(CudaBf16Gemv, MatchesReferenceForEveryRowCount) {
  MS_REQUIRE_GPU();
  // k = 6144 splits k across blocks (a 129-row slice of a 200-row weight), odd n, strided x and y.
  for (int m = 1; m <= 8; ++m) check_bf16_gemv(m, 200, 37, 129, 6144, 6144 + 4, 129 + 3, 0, 700 + m);
}

TEST(CudaBf16Gemv, MatchesReferenceOnOddShapes) {
  MS_REQUIRE_GPU();
  check_bf16_gemv(3, 90, 5, 77, 136, 136, 77, 0, 710);         // k not a multiple of 128: a part-empty warp
  check_bf16_gemv(5, 40, 0, 33, 8, 9, 35, 0, 711);             // one 8-wide chunk, one warp
  check_bf16_gemv(1, 7, 0, 7, 1000, 1000, 7, 0, 712);          // fewer rows than one tile
  check_bf16_gemv(4, 120, 17, 100, 520, 521, 101, 1, 713);     // x unaligned: scalar loads
  check_bf16_gemv(2, 300, 0, 300, 16384, 16384, 300, 0, 714);  // 16 slices
  check_bf16_gemv(8, 2100, 51, 2049, 2048, 2048, 2050, 0, 715);
  check_bf16_gemv(1, 576, 0, 576, 6144, 6144, 576, 0, 716);    // GLM-5 kv_a
  check_bf16_gemv(8, 640, 64, 576, 6144, 6144, 1200, 0, 717);  // a row slice of a fused weight
}

TEST(CudaBf16Gemv, EveryTilingAndSplitMatches) {
  MS_REQUIRE_GPU();
  namespace bc = ms::cuda::bf16_gemv_config;
  // n = 333 (21 tiles), k = 2056 (17 chunks): warps 1..8, slices walked by one block or split across several,
  // several tiles per block with a short last block.
  const int n = 333, k = 2056;
  const int chunks = bc::ceil_div(k, bc::kWarpK), tiles = bc::ceil_div(n, bc::kTileRows);
  int runs = 0;
  for (int warps : {8, 5, 2, 1})
    for (int spb : {1, 2, 3})
      for (int tpb : {1, 3, 8}) {
        bc::Config c;
        c.warps = warps;
        c.slices = bc::ceil_div(chunks, warps);
        if (spb > c.slices) continue;
        c.slices_per_block = spb;
        c.splits = bc::ceil_div(c.slices, spb);
        c.tiles_per_block = tpb;
        c.row_blocks = bc::ceil_div(tiles, tpb);
        const int m = 1 + runs % 8;
        check_bf16_gemv(m, n + 9, 9, n, k, k, n + 1, 0, 720 + runs, &c);
        ++runs;
      }
  EXPECT_GE(runs, 20);
}

TEST(CudaBf16Gemv, SplitSumsAreDeterministic) {
  MS_REQUIRE_GPU();
  // The last block of each row block adds the splits in a fixed order: repeated launches give the same bits
  // (and leave the counters zero for the next, checked inside).
  // (13 tiles of rows: fewer than half the multiprocessors, so the chooser splits k.)
  const auto a = check_bf16_gemv(4, 200, 0, 200, 12288, 12288, 200, 0, 730);
  const auto b = check_bf16_gemv(4, 200, 0, 200, 12288, 12288, 200, 0, 730);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(ms::test::same_float(a[i], b[i])) << "element " << i;
}

TEST(CudaBf16Gemv, RefusesBadArguments) {
  MS_REQUIRE_GPU();
  DeviceBuffer<float> buf(1 << 16);
  ms::cuda::Bf16GemvParams p;
  p.x = buf.get();
  p.x_stride = 64;
  p.w = reinterpret_cast<const __nv_bfloat16*>(buf.get());
  p.w_stride = 64;
  p.y = buf.get() + 8192;
  p.y_stride = 16;
  p.m = 9;  // more rows than the GEMV takes
  p.n = 16;
  p.k = 64;
  EXPECT_THROW(ms::cuda::bf16_gemv(p, nullptr), ms::Error);
  p.m = 1;
  p.k = 60;  // not a multiple of 8
  p.x_stride = p.w_stride = 60;
  EXPECT_THROW(ms::cuda::bf16_gemv(p, nullptr), ms::Error);
  p.k = p.x_stride = p.w_stride = 64;
  p.w = reinterpret_cast<const __nv_bfloat16*>(buf.get()) + 1;  // not 16-byte aligned
  EXPECT_THROW(ms::cuda::bf16_gemv(p, nullptr), ms::Error);
  p.w = reinterpret_cast<const __nv_bfloat16*>(buf.get());
  p.k = p.x_stride = p.w_stride = 8192;  // 8 slices: k splits, and the scratch is missing
  p.y = buf.get() + 40000;
  EXPECT_THROW(ms::cuda::bf16_gemv(p, nullptr), ms::Error);
}

// The op as the executor calls it, on decode row counts: rows [row0, row0 + n) of a weight, x a row view of
// a wider buffer (aligned, and one float off: the NVFP4 path then casts, the BF16 GEMV loads scalars), y a
// column slice of a wider output (a fused gate_up's half). Each format's GPU path against the double
// reference: 1e-2 of sum |terms| for the bf16-activation paths (BF16, FP8-block, NVFP4), called twice so the
// GEMV's split counters are seen left zero by the second call.
TEST(CudaLinearOp, DecodeRowsOfEveryFormatMatchReference) {
  MS_REQUIRE_GPU();
  ms::ops::CudaBackend backend;
  const ms::ops::Ctx ctx = backend.ctx(nullptr);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::NVFP4, WeightFormat::FP8Block})
    for (int64_t m : {1, 3, 8})
      for (int64_t x_off : {0, 1}) {
        const int64_t rows = 200, k = 2048, row0 = 64, n = 129, xs = k + 4, ys = 2 * n + 8, y_off = 4;
        TestWeight w(f, rows, k, 800 + static_cast<uint32_t>(m));
        const auto x = random_floats(static_cast<size_t>(m * xs), 801);
        std::vector<double> ref, abs_sum;
        reference(w, row0, n, x, xs, m, false, ref, abs_sum);
        std::vector<float> xbuf(static_cast<size_t>(m * xs + x_off), 0.f);
        std::copy(x.begin(), x.end(), xbuf.begin() + x_off);
        DeviceBuffer<float> d_x(xbuf), d_y(static_cast<size_t>(m * ys));
        ms::ops::LinearWeight lw;
        lw.name = "test." + name_of(f);
        lw.format = static_cast<ms::ops::WeightFormat>(static_cast<int>(f));
        lw.out = rows;
        lw.in = k;
        lw.scale2 = w.scale2;
        lw.block = 128;
        const auto cuda = ms::Device::CUDA;
        switch (f) {
          case WeightFormat::BF16:
            lw.weight = ms::Tensor::borrow(w.d_data->get(), {rows, k}, ms::DType::BF16, nullptr, cuda);
            break;
          case WeightFormat::NVFP4:
            lw.weight = ms::Tensor::borrow(w.d_data->get(), {rows, k / 2}, ms::DType::U8, nullptr, cuda);
            lw.scale =
                ms::Tensor::borrow(w.d_scale->get(), {rows, k / 16}, ms::DType::F8_E4M3, nullptr, cuda);
            break;
          default:
            lw.weight = ms::Tensor::borrow(w.d_data->get(), {rows, k}, ms::DType::F8_E4M3, nullptr, cuda);
            lw.scale = ms::Tensor::borrow(w.d_scale->get(), {(rows + 127) / 128, (k + 127) / 128},
                                          ms::DType::F32, nullptr, cuda);
            break;
        }
        const auto tx =
            ms::Tensor::borrow(d_x.get() + x_off, {m, xs}, ms::DType::F32, nullptr, cuda).slice(1, 0, k);
        const auto ty =
            ms::Tensor::borrow(d_y.get(), {m, ys}, ms::DType::F32, nullptr, cuda).slice(1, y_off, y_off + n);
        const std::string what =
            "linear_rows " + name_of(f) + " m=" + std::to_string(m) + " x_off=" + std::to_string(x_off);
        for (int call = 0; call < 2; ++call) {
          d_y.poison();
          ms::ops::linear_rows(ctx, tx, lw, row0, ty);
          const auto y = d_y.download();
          // Compare the slice; every column outside it must still be poison.
          std::vector<float> got(static_cast<size_t>(m * n));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ys; ++j) {
              const float v = y[static_cast<size_t>(i * ys + j)];
              if (j >= y_off && j < y_off + n)
                got[static_cast<size_t>(i * n + j - y_off)] = v;
              else
                ASSERT_TRUE(std::isnan(v)) << what << ": column " << j << " outside the slice written";
            }
          expect_linear_close(got, n, ref, abs_sum, m, n, 1e-2, what + " call " + std::to_string(call));
        }
      }
}

// fp8_block_gemv against the double reference on x rounded to bf16 and the exact dequantised weight (5e-5 of
// sum |terms|: fp8 values are exact in bf16, each 128-wide block's sum is scaled in f32) and on f32 x (1e-2).
// Rows [row0, row0 + n) of a taller weight (row0 not a multiple of 128: a tile's rows take scales of two
// row blocks), strided x and NaN-poisoned strided y; counters checked zero afterwards.
void check_fp8_gemv(int m, int rows, int row0, int n, int k, int64_t xs, int64_t ys, uint32_t seed,
                    const ms::cuda::bf16_gemv_config::Config* cfg = nullptr) {
  const std::string what =
      "fp8_block_gemv m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
      " row0=" + std::to_string(row0) +
      (cfg ? " warps=" + std::to_string(cfg->warps) + " spb=" + std::to_string(cfg->slices_per_block) +
                 " tpb=" + std::to_string(cfg->tiles_per_block)
           : std::string());
  TestWeight w(WeightFormat::FP8Block, rows, k, seed);
  const auto x = random_floats(static_cast<size_t>(m * xs), seed + 1);
  std::vector<double> ref, abs_sum, ref32, abs32;
  reference(w, row0, n, x, xs, m, true, ref, abs_sum, false);
  reference(w, row0, n, x, xs, m, false, ref32, abs32);
  DeviceBuffer<float> d_x(x), d_y(static_cast<size_t>(m * ys));
  const GemvScratch scratch(ms::cuda::fp8_block_gemv_scratch_bytes(m, n, k), cfg, m, n);
  ms::cuda::Fp8BlockGemvParams p;
  p.x = d_x.get();
  p.x_stride = xs;
  p.w = w.d_data->get();
  p.w_scale = reinterpret_cast<const float*>(w.d_scale->get());
  p.row0 = row0;
  p.y = d_y.get();
  p.y_stride = ys;
  p.m = m;
  p.n = n;
  p.k = k;
  p.partial = scratch.part.get();
  p.counters = scratch.cnt.get();
  if (cfg)
    ms::cuda::fp8_block_gemv_with(p, *cfg, nullptr);
  else
    ms::cuda::fp8_block_gemv(p, nullptr);
  const auto y = d_y.download();
  expect_gemv_result(y, ys, ref, abs_sum, ref32, abs32, m, n, scratch, what);
}

TEST(CudaFp8BlockGemv, MatchesReference) {
  MS_REQUIRE_GPU();
  for (int m = 1; m <= 8; ++m) check_fp8_gemv(m, 340, 37 + 20 * m, 129, 6144, 6148, 131, 740 + m);
  check_fp8_gemv(3, 90, 5, 77, 144, 144, 77, 750);  // k past one 128 block, under one warp's 256
  check_fp8_gemv(5, 40, 0, 33, 16, 17, 35, 751);    // one 16-wide load (x unaligned rows: scalar loads)
  check_fp8_gemv(2, 500, 130, 300, 2064, 2064, 301, 752);
  check_fp8_gemv(8, 576, 0, 576, 6144, 6144, 576, 753);  // GLM-5 kv_a
  check_fp8_gemv(4, 300, 60, 200, 12288, 12288, 200, 754);
}

TEST(CudaFp8BlockGemv, EveryTilingAndSplitMatches) {
  MS_REQUIRE_GPU();
  namespace bc = ms::cuda::bf16_gemv_config;
  const int n = 333, k = 4112;  // 17 chunks of 256 (the last one 16 wide)
  const int chunks = bc::ceil_div(k, bc::warp_k(bc::Weights::FP8Block)),
            tiles = bc::ceil_div(n, bc::kTileRows);
  int runs = 0;
  for (int warps : {8, 3, 1})
    for (int spb : {1, 2})
      for (int tpb : {1, 3, 8}) {
        bc::Config c;
        c.warps = warps;
        c.slices = bc::ceil_div(chunks, warps);
        if (spb > c.slices) continue;
        c.slices_per_block = spb;
        c.splits = bc::ceil_div(c.slices, spb);
        c.tiles_per_block = tpb;
        c.row_blocks = bc::ceil_div(tiles, tpb);
        check_fp8_gemv(1 + runs % 8, n + 140, 139, n, k, k, n + 1, 760 + runs, &c);
        ++runs;
      }
  EXPECT_GE(runs, 15);
}

// The MLA absorption products as the executor calls them (ops::mla_absorb_q / mla_out_v) with a BF16 kv_b
// and enough tokens to take one batched cuBLASLt GEMM over the heads: against the CPU op on the same inputs,
// within 1e-2 of the largest |output| (bf16 activations), every output element written (poisoned first).
TEST(CudaLinearOp, AbsorptionByBatchedGemmMatchesCpu) {
  MS_REQUIRE_GPU();
  ms::ops::CudaBackend backend;
  const ms::ops::Ctx ctx = backend.ctx(nullptr);
  const auto cuda = ms::Device::CUDA;
  struct Shape {
    int64_t heads, nope, rope, v, r;
  };
  for (const Shape sh : {Shape{8, 192, 64, 256, 512}, Shape{4, 128, 64, 128, 512}})
    for (int64_t m : {16, 64, 200}) {
      const int64_t rows = sh.heads * (sh.nope + sh.v);
      std::vector<uint16_t> wb(static_cast<size_t>(rows * sh.r));
      const auto wf = random_floats(wb.size(), 900 + static_cast<uint32_t>(m));
      std::vector<float> wq(wb.size());
      for (size_t i = 0; i < wb.size(); ++i) {
        wb[i] = ms::quant::f32_to_bf16(wf[i] * 0.05f);
        wq[i] = ms::quant::bf16_to_f32(wb[i]);
      }
      ms::ops::LinearWeight host_w;
      host_w.name = "test.kv_b";
      host_w.format = ms::ops::WeightFormat::BF16;
      host_w.out = rows;
      host_w.in = sh.r;
      host_w.weight = ms::Tensor::borrow(wb.data(), {rows, sh.r}, ms::DType::BF16);
      DeviceBuffer<uint16_t> d_w(wb);
      ms::ops::LinearWeight dev_w = host_w;
      dev_w.weight = ms::Tensor::borrow(d_w.get(), {rows, sh.r}, ms::DType::BF16, nullptr, cuda);
      const std::string what = "m=" + std::to_string(m) + " heads=" + std::to_string(sh.heads);
      auto check = [&](const std::vector<float>& got, const std::vector<float>& want, const std::string& op) {
        ASSERT_EQ(got.size(), want.size());
        double top = 0;
        for (float x : want) top = std::max(top, std::fabs(static_cast<double>(x)));
        int bad = 0;
        for (size_t i = 0; i < want.size(); ++i)
          if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= 1e-2 * top) && bad++ < 5)
            ADD_FAILURE() << op << " " << what << " [" << i << "]: gpu " << got[i] << " cpu " << want[i];
        EXPECT_EQ(bad, 0) << op << " " << what;
      };
      {  // absorb_q: q [m, heads, nope + rope] -> q_cat [m, heads, r + rope]
        auto q = random_floats(static_cast<size_t>(m * sh.heads * (sh.nope + sh.rope)), 910);
        std::vector<float> want(static_cast<size_t>(m * sh.heads * (sh.r + sh.rope)));
        ms::ops::mla_absorb_q(ms::ops::Ctx::cpu(),
                              ms::Tensor::borrow(q.data(), {m, sh.heads, sh.nope + sh.rope}, ms::DType::F32),
                              host_w, sh.nope, sh.v,
                              ms::Tensor::borrow(want.data(), {m, sh.heads, sh.r + sh.rope}, ms::DType::F32));
        DeviceBuffer<float> d_q(q), d_out(want.size());
        ms::ops::mla_absorb_q(
            ctx,
            ms::Tensor::borrow(d_q.get(), {m, sh.heads, sh.nope + sh.rope}, ms::DType::F32, nullptr, cuda),
            dev_w, sh.nope, sh.v,
            ms::Tensor::borrow(d_out.get(), {m, sh.heads, sh.r + sh.rope}, ms::DType::F32, nullptr, cuda));
        check(d_out.download(), want, "absorb_q");
      }
      {  // out_v: lat [m, heads, r] -> out [m, heads * v]
        auto lat = random_floats(static_cast<size_t>(m * sh.heads * sh.r), 920);
        std::vector<float> want(static_cast<size_t>(m * sh.heads * sh.v));
        ms::ops::mla_out_v(
            ms::ops::Ctx::cpu(), ms::Tensor::borrow(lat.data(), {m, sh.heads, sh.r}, ms::DType::F32), host_w,
            sh.nope, sh.v, ms::Tensor::borrow(want.data(), {m, sh.heads * sh.v}, ms::DType::F32));
        DeviceBuffer<float> d_lat(lat), d_out(want.size());
        ms::ops::mla_out_v(
            ctx, ms::Tensor::borrow(d_lat.get(), {m, sh.heads, sh.r}, ms::DType::F32, nullptr, cuda), dev_w,
            sh.nope, sh.v,
            ms::Tensor::borrow(d_out.get(), {m, sh.heads * sh.v}, ms::DType::F32, nullptr, cuda));
        check(d_out.download(), want, "out_v");
      }
    }
}

}  // namespace
