#include "profiler/ceilings.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"

namespace ms::profiler {
namespace {

// The matrix ceiling is only as honest as its GEMM: check it against the plain triple loop on sizes that
// are not multiples of the register tile, accumulating into a non-zero C.
TEST(Ceilings, BlockedGemmMatchesNaive) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto [m, n, k] : {std::tuple{1, 1, 1}, {7, 33, 5}, {13, 70, 300}, {64, 64, 64}, {100, 17, 513}}) {
    std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n),
        c(static_cast<size_t>(m) * n);
    for (auto& x : a) x = dist(rng);
    for (auto& x : b) x = dist(rng);
    for (auto& x : c) x = dist(rng);
    std::vector<double> want(c.begin(), c.end());
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        for (int p = 0; p < k; ++p) want[i * n + j] += double(a[i * k + p]) * b[p * n + j];
    detail::gemm_f32(m, n, k, a.data(), b.data(), c.data());
    for (size_t i = 0; i < c.size(); ++i) {
      ASSERT_NEAR(c[i], want[i], 1e-5 * k + 1e-5) << "m=" << m << " n=" << n << " k=" << k << " at " << i;
    }
  }
  float x = 0;
  EXPECT_THROW(detail::gemm_f32(0, 1, 1, &x, &x, &x), Error);
}

TEST(Ceilings, MeasuredArePositiveSaneAndQuick) {
  EXPECT_GT(detail::last_level_cache_bytes(), 0u);
  Ceilings c = measure_ceilings();
  EXPECT_EQ(c.source, "measured");
  // Sane for anything from a small VM to a large server: DRAM between 0.5 GB/s and 2 TB/s, fp32 GEMM between
  // 0.5 GFLOP/s and 100 TFLOP/s.
  EXPECT_GT(c.mem_gbps, 0.5);
  EXPECT_LT(c.mem_gbps, 2000);
  EXPECT_GT(c.matrix_gflops, 0.5);
  EXPECT_LT(c.matrix_gflops, 1e5);
  EXPECT_DOUBLE_EQ(c.mem_gbps, std::max(c.mem_read_gbps, c.mem_copy_gbps));
  // The buffer is larger than the last-level cache (4x, within the clamp) so DRAM is what is measured.
  EXPECT_GE(c.mem_buffer_bytes,
            std::min<size_t>(4 * detail::last_level_cache_bytes(), size_t{512} << 20) - 4096);
  EXPECT_EQ(c.gemm_n, 512);
  EXPECT_GT(c.threads, 0);
  // Budget about 1.5 s; a loaded shared test machine gets slack.
  EXPECT_LT(c.measure_seconds, 5.0);
  std::string d = describe(c);
  EXPECT_NE(d.find("measured in"), std::string::npos) << d;
  std::printf("%s\n", d.c_str());
}

TEST(Ceilings, SmallBufferOptionAndBadGemmSize) {
  CeilingOptions o;
  o.buffer_bytes = 8 << 20;
  o.mem_repeats = 1;
  o.gemm_n = 64;
  o.gemm_seconds = 0.01;
  Ceilings c = measure_ceilings(o);
  EXPECT_EQ(c.mem_buffer_bytes, size_t{8} << 20);
  EXPECT_GT(c.mem_gbps, 0);
  EXPECT_GT(c.matrix_gflops, 0);
  o.gemm_n = 100;
  EXPECT_THROW(measure_ceilings(o), Error);
}

}  // namespace
}  // namespace ms::profiler
