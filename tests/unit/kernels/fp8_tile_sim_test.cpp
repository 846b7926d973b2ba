// The simulated per-token, per-128-tile fp8 cache format (kv::KvCacheDType::FP8E4M3Tile128Sim): each tile's
// largest magnitude decodes exactly (its scale is amax / 448), every value within e4m3's rounding of the tile
// scale, a zero tile stays zero, the rope tail is bf16-rounded; written through cache_write into f32 pages.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/paged_cache.h"
#include "quant/float_formats.h"

namespace ms::kernels::cpu {
namespace {

TEST(Fp8TileSim, TilesScaleByTheirOwnMaximumAndRopeIsBf16) {
  const int64_t width = 576, rope = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(width), out(width, NAN);
  for (int64_t i = 0; i < width; ++i) x[i] = nd(rng) * (i < 128 ? 100.0f : i < 256 ? 0.01f : 1.0f);
  for (int64_t i = 256; i < 384; ++i) x[i] = 0.0f;  // a zero tile
  fp8_tile128_round_row(x.data(), width, rope, out.data());
  for (int64_t t0 = 0; t0 < width - rope; t0 += 128) {
    float amax = 0;
    int64_t at = t0;
    for (int64_t i = t0; i < t0 + 128; ++i)
      if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), at = i;
    if (amax == 0) {
      for (int64_t i = t0; i < t0 + 128; ++i) EXPECT_EQ(out[i], 0.0f) << i;
      continue;
    }
    EXPECT_NEAR(out[at], x[at], 1e-6f * amax) << "tile " << t0 << ": its largest value decodes exactly";
    const float s = amax / 448.0f;
    for (int64_t i = t0; i < t0 + 128; ++i) {
      // e4m3: 3 mantissa bits (relative step 1/8, half of it as error) above the subnormals (step 2^-9 x s).
      const float tol = std::max(std::fabs(x[i]) / 16.0f, s * std::ldexp(1.0f, -10));
      EXPECT_LE(std::fabs(out[i] - x[i]), tol * 1.0001f) << i;
    }
  }
  for (int64_t i = width - rope; i < width; ++i)
    EXPECT_EQ(out[i], quant::bf16_to_f32(quant::f32_to_bf16(x[i]))) << i;
  // The small tile keeps its precision (a per-layer scale of 1 would flush most of it to e4m3 subnormals).
  double err = 0, mag = 0;
  for (int64_t i = 128; i < 256; ++i) err += std::fabs(out[i] - x[i]), mag += std::fabs(x[i]);
  EXPECT_LT(err / mag, 0.04);
}

TEST(Fp8TileSim, CacheWriteRoundsRowsIntoF32Pages) {
  const int64_t width = 80, rope = 16;  // a 64-wide latent: one partial tile
  std::vector<float> pages(2 * 4 * width, NAN), x(2 * width), want(width);
  for (int64_t i = 0; i < 2 * width; ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  const int64_t slots[] = {5, 2};
  CacheWriteParams p;
  p.cache.data = pages.data();
  p.cache.format = CacheFormat::F32;
  p.cache.fp8_tile_sim_rope = rope;
  p.cache.num_pages = 2;
  p.cache.page_size = 4;
  p.cache.width = width;
  p.x = x.data();
  p.x_stride = width;
  p.slots = slots;
  p.m = 2;
  cache_write(p);
  for (int r = 0; r < 2; ++r) {
    fp8_tile128_round_row(x.data() + r * width, width, rope, want.data());
    std::vector<float> got(width);
    cache_read_row(p.cache, slots[r], got.data());
    for (int64_t i = 0; i < width; ++i) EXPECT_EQ(got[i], want[i]) << "row " << r << " value " << i;
  }
}

}  // namespace
}  // namespace ms::kernels::cpu
