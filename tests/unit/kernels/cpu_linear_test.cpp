// The CPU linear kernels against a plain double-precision product of the dequantised weights, on random
// inputs, for every instruction set this CPU has: batch sizes 1..9 and 17 (partial token blocks), k with a
// tail (not a multiple of 16 or 8), n with a partial row tile, a row window (row0 > 0) and strided x / y.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/linear.h"
#include "quant/float_formats.h"

namespace {

using namespace ms::kernels::cpu;

struct Case {
  int64_t m, n, k, row0;
};

std::vector<LinearIsa> isas_here() {
  std::vector<LinearIsa> v{LinearIsa::Reference};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v.push_back(LinearIsa::Avx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    v.push_back(LinearIsa::Avx512);
  return v;
}

void check_bf16(LinearIsa isa, const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Odd n: rows past the window exist (they must not reach y); even n: the window ends at the matrix end
  // (no read may pass it).
  const int64_t rows = c.row0 + c.n + (c.n % 2 ? 3 : 0);
  std::vector<uint16_t> w(static_cast<size_t>(rows * c.k));
  for (auto& v : w) v = ms::quant::f32_to_bf16(nd(rng));
  const int64_t xs = c.k + 5, ys = c.n + 7;
  std::vector<float> x(static_cast<size_t>(c.m * xs));
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(c.m * ys), std::numeric_limits<float>::quiet_NaN());

  LinearParams p;
  p.x = x.data();
  p.x_stride = xs;
  p.w.format = WeightFormat::BF16;
  p.w.rows = rows;
  p.w.cols = c.k;
  p.w.data = w.data();
  p.row0 = c.row0;
  p.n = c.n;
  p.y = y.data();
  p.y_stride = ys;
  p.m = c.m;
  force_linear_isa(isa);
  // A hint only: every tile, and one past the last, must stay inside the matrix and change nothing.
  for (int64_t t = 0; t <= linear_tiles(p); ++t) linear_prefetch_tile(p, t);
  linear(p);
  clear_forced_linear_isa();

  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double want = 0, mag = 0;
      for (int64_t q = 0; q < c.k; ++q) {
        const double prod =
            static_cast<double>(ms::quant::bf16_to_f32(w[(c.row0 + j) * c.k + q])) * x[i * xs + q];
        want += prod;
        mag += std::fabs(prod);
      }
      const float got = y[i * ys + j];
      ASSERT_FALSE(std::isnan(got)) << linear_isa_name(isa) << " m" << c.m << " n" << c.n << " k" << c.k
                                    << ": y[" << i << "," << j << "] not written";
      // f32 accumulation in any order: error bounded by k * eps * sum |products|.
      ASSERT_NEAR(got, want, 1e-6 * static_cast<double>(c.k) * mag + 1e-6)
          << linear_isa_name(isa) << " m" << c.m << " n" << c.n << " k" << c.k << " at " << i << "," << j;
    }
    for (int64_t j = c.n; j < ys; ++j)
      ASSERT_TRUE(std::isnan(y[i * ys + j])) << linear_isa_name(isa) << ": wrote past n at " << i << "," << j;
  }
}

TEST(CpuLinear, Bf16MatchesDoubleReferenceOnEveryIsa) {
  std::mt19937 rng(7);
  const std::vector<Case> cases = {
      {1, 37, 131, 0},
      {1, 64, 1024, 5},
      {2, 13, 40, 1},
      {3, 9, 17, 0},
      {4, 21, 128, 2},
      {5, 8, 200, 0},
      {6, 30, 64, 3},
      {7, 5, 9, 0},
      {8, 33, 256, 0},
      {9, 12, 100, 4},
      {17, 19, 77, 1},
      {1, 3, 5, 0},
      {12, 10, 48, 0},
      {24, 7, 33, 2},
      {16, 64, 300, 0},
      {8, 2, 16, 0},
      {1, 21, 96, 3},
      {1, 16, 64, 0},
      // Batches of 8+ in 32-row chunk tiles: several chunks, a partial last chunk, leftover tokens.
      {40, 70, 1030, 3},
      {13, 67, 128, 0},
      {8, 32, 48, 0},
      {11, 33, 17, 1}};
  for (LinearIsa isa : isas_here())
    for (const Case& c : cases) check_bf16(isa, c, rng);
}

// FP8 e4m3 with block scales: every byte code but the two NaNs (so subnormals and both signs occur), scales
// of varied magnitude; the reference is the dequantised row (the table of quant::fp8_e4m3_table) in double.
void check_fp8(LinearIsa isa, const Case& c, int block, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sd(0.001f, 4.0f);
  const int64_t rows = c.row0 + c.n + (c.n % 2 ? 3 : 0);
  std::vector<uint8_t> w(static_cast<size_t>(rows * c.k));
  for (auto& v : w) {
    int b = byte(rng);
    while ((b & 0x7f) == 0x7f) b = byte(rng);
    v = static_cast<uint8_t>(b);
  }
  const int64_t sr = (rows + block - 1) / block, sc = (c.k + block - 1) / block;
  std::vector<float> scale(static_cast<size_t>(sr * sc));
  for (auto& v : scale) v = sd(rng);
  const int64_t xs = c.k + 1, ys = c.n + 2;
  std::vector<float> x(static_cast<size_t>(c.m * xs));
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(c.m * ys), std::numeric_limits<float>::quiet_NaN());
  LinearParams p;
  p.x = x.data();
  p.x_stride = xs;
  p.w.format = WeightFormat::FP8Block;
  p.w.rows = rows;
  p.w.cols = c.k;
  p.w.data = w.data();
  p.w.scale = scale.data();
  p.w.block = block;
  p.row0 = c.row0;
  p.n = c.n;
  p.y = y.data();
  p.y_stride = ys;
  p.m = c.m;
  force_linear_isa(isa);
  linear(p);
  clear_forced_linear_isa();
  std::vector<float> wrow(static_cast<size_t>(c.k));
  for (int64_t j = 0; j < c.n; ++j) {
    dequantize_row(p.w, c.row0 + j, wrow.data());
    for (int64_t i = 0; i < c.m; ++i) {
      double want = 0, mag = 0;
      for (int64_t q = 0; q < c.k; ++q) {
        want += static_cast<double>(wrow[q]) * x[i * xs + q];
        mag += std::fabs(static_cast<double>(wrow[q]) * x[i * xs + q]);
      }
      const float got = y[i * ys + j];
      ASSERT_FALSE(std::isnan(got)) << linear_isa_name(isa) << " fp8 y[" << i << "," << j << "] not written";
      ASSERT_NEAR(got, want, 1e-6 * static_cast<double>(c.k) * mag + 1e-6)
          << linear_isa_name(isa) << " fp8 block " << block << " m" << c.m << " n" << c.n << " k" << c.k
          << " at " << i << "," << j;
    }
  }
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < ys; ++j) ASSERT_TRUE(std::isnan(y[i * ys + j])) << "fp8 wrote past n";
}

TEST(CpuLinear, Fp8BlockMatchesDequantisedRowsOnEveryIsa) {
  std::mt19937 rng(11);
  const std::vector<Case> cases = {{1, 37, 300, 0}, {1, 64, 256, 5}, {2, 13, 40, 1},  {4, 21, 128, 2},
                                   {5, 8, 200, 0},  {8, 33, 256, 0}, {9, 12, 100, 4}, {1, 3, 5, 0}};
  for (LinearIsa isa : isas_here())
    for (const Case& c : cases)
      for (int block : {16, 128}) check_fp8(isa, c, block, rng);
}

// dequantize_row's vector path for FP8 blocks against the table (value times scale), bit for bit, for every
// byte code but the two NaNs (a checkpoint holds none; the vector path reads them as 480), with row lengths
// that leave tails in a block and at the row's end.
TEST(CpuLinear, Fp8DequantizeRowEqualsTableTimesScale) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sd(1e-4f, 8.0f);
  const float* table = ms::quant::fp8_e4m3_table();
  for (int block : {16, 128})
    for (int64_t cols : {int64_t{5}, int64_t{37}, int64_t{128}, int64_t{300}}) {
      const int64_t rows = 3;
      std::vector<uint8_t> w(static_cast<size_t>(rows * cols));
      for (size_t i = 0; i < w.size(); ++i) {
        int b = static_cast<int>(i % 256 < 254 ? i % 256 : byte(rng));  // every code, then random ones
        while ((b & 0x7f) == 0x7f) b = byte(rng);
        w[i] = static_cast<uint8_t>(b);
      }
      const int64_t sc = (cols + block - 1) / block;
      std::vector<float> scale(static_cast<size_t>(sc));
      for (auto& v : scale) v = sd(rng);
      WeightView v;
      v.format = WeightFormat::FP8Block;
      v.rows = rows;
      v.cols = cols;
      v.data = w.data();
      v.scale = scale.data();
      v.block = block;
      std::vector<float> out(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(v, r, out.data());
        for (int64_t c = 0; c < cols; ++c) {
          const float want = table[w[r * cols + c]] * scale[c / block];
          ASSERT_EQ(std::memcmp(&out[c], &want, 4), 0)
              << "block " << block << " cols " << cols << " at " << r << "," << c << ": " << out[c] << " vs "
              << want << " (code " << int{w[r * cols + c]} << ")";
        }
      }
    }
}

// A token's row does not depend on the batch it runs in (1, 2..7 or 8+ tokens take different micro-kernels):
// bit for bit, since an expert's token count changes with other sequences' routing.
TEST(CpuLinear, Bf16RowsAreBatchInvariant) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 45, k = 200, m = 19;
  std::vector<uint16_t> w(static_cast<size_t>(n * k));
  for (auto& v : w) v = ms::quant::f32_to_bf16(nd(rng));
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = nd(rng);
  auto run = [&](int64_t row, int64_t rows, float* y) {
    LinearParams p;
    p.x = x.data() + row * k;
    p.x_stride = k;
    p.w.format = WeightFormat::BF16;
    p.w.rows = n;
    p.w.cols = k;
    p.w.data = w.data();
    p.n = n;
    p.y = y;
    p.y_stride = n;
    p.m = rows;
    linear(p);
  };
  for (LinearIsa isa : isas_here()) {
    force_linear_isa(isa);
    std::vector<float> all(static_cast<size_t>(m * n)), part(static_cast<size_t>(m * n));
    run(0, m, all.data());
    for (int64_t chunk : {1, 3, 4, 8}) {
      for (int64_t i = 0; i < m; i += chunk) run(i, std::min(chunk, m - i), part.data() + i * n);
      EXPECT_EQ(std::memcmp(all.data(), part.data(), all.size() * 4), 0)
          << linear_isa_name(isa) << ": batch of " << m << " vs chunks of " << chunk;
    }
    clear_forced_linear_isa();
  }
}

// The same for FP8 blocks: a row window starting at row 3 with 16-row scale blocks puts some tiles across a
// block edge (rows with different scales in one tile) and others inside one block.
TEST(CpuLinear, Fp8RowsAreBatchInvariant) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sd(0.01f, 2.0f);
  const int64_t rows = 50, n = 45, k = 200, m = 19, block = 16;
  std::vector<uint8_t> w(static_cast<size_t>(rows * k));
  for (auto& v : w) {
    int b = byte(rng);
    while ((b & 0x7f) == 0x7f) b = byte(rng);
    v = static_cast<uint8_t>(b);
  }
  std::vector<float> scale(static_cast<size_t>(((rows + block - 1) / block) * ((k + block - 1) / block)));
  for (auto& v : scale) v = sd(rng);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = nd(rng);
  auto run = [&](int64_t row, int64_t cnt, float* y) {
    LinearParams p;
    p.x = x.data() + row * k;
    p.x_stride = k;
    p.w.format = WeightFormat::FP8Block;
    p.w.rows = rows;
    p.w.cols = k;
    p.w.data = w.data();
    p.w.scale = scale.data();
    p.w.block = static_cast<int>(block);
    p.row0 = 3;
    p.n = n;
    p.y = y;
    p.y_stride = n;
    p.m = cnt;
    linear(p);
  };
  for (LinearIsa isa : isas_here()) {
    force_linear_isa(isa);
    std::vector<float> all(static_cast<size_t>(m * n)), part(static_cast<size_t>(m * n));
    run(0, m, all.data());
    for (int64_t chunk : {1, 3, 4, 8}) {
      for (int64_t i = 0; i < m; i += chunk) run(i, std::min(chunk, m - i), part.data() + i * n);
      EXPECT_EQ(std::memcmp(all.data(), part.data(), all.size() * 4), 0)
          << linear_isa_name(isa) << ": fp8 batch of " << m << " vs chunks of " << chunk;
    }
    clear_forced_linear_isa();
  }
}

TEST(CpuLinear, DetectedIsaIsOneThisCpuHas) {
  const auto here = isas_here();
  EXPECT_EQ(linear_isa(), here.back()) << linear_isa_name(linear_isa());
}

}  // namespace
