// Exhaustive checks of the float codecs against their definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

using namespace ms::quant;

namespace {
// Reference decode written from the format definition, independent of the codec's helper.
double ref_decode(uint32_t code, int eb, int mb) {
  int sign = (code >> (eb + mb)) & 1;
  int exp = (code >> mb) & ((1 << eb) - 1);
  int man = code & ((1 << mb) - 1);
  int bias = (1 << (eb - 1)) - 1;
  double v = exp == 0 ? std::ldexp(man, 1 - bias - mb) : std::ldexp((1 << mb) + man, exp - bias - mb);
  return sign ? -v : v;
}
// Nearest-even rounding by brute force over all finite codes of a format (magnitudes sorted by code).
uint32_t ref_round(double x, int eb, int mb, uint32_t max_mag_code) {
  uint32_t best = 0;
  double bd = INFINITY;
  for (uint32_t c = 0; c <= max_mag_code; ++c) {
    double d = std::fabs(std::fabs(x) - ref_decode(c, eb, mb));
    if (d < bd || (d == bd && (c & 1) == 0)) {
      bd = d;
      best = c;
    }
  }
  return best;
}
}  // namespace

TEST(Bf16, EveryCodeRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), h) << h;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // Halfway between two bf16 codes, the even one wins.
  uint32_t base = 0x3f800000u;  // 1.0
  float half_up = std::bit_cast<float>(base | 0x8000u);
  EXPECT_EQ(f32_to_bf16(half_up), 0x3f80);
  float half_odd = std::bit_cast<float>(0x3f818000u);
  EXPECT_EQ(f32_to_bf16(half_odd), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(3.4e38f), 0x7f80);  // rounds to infinity
}

TEST(F16, EveryCodeRoundTripsAndMatchesDefinition) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    uint32_t exp = (h >> 10) & 0x1f;
    if (exp == 0x1f) {
      if (h & 0x3ff) {
        EXPECT_TRUE(std::isnan(f));
      } else {
        EXPECT_TRUE(std::isinf(f));
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ref_decode(h, 5, 10)) << h;
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
}

TEST(F16, RoundingMidpointsAndOverflow) {
  // Midpoints between consecutive positive f16 values round to the even code.
  for (uint32_t h = 0; h < 0x7bff; h += 7) {
    double a = ref_decode(h, 5, 10), b = ref_decode(h + 1, 5, 10);
    float mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(f32_to_f16(mid), (h & 1) ? h + 1 : h) << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // past max after rounding: infinity
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
}

TEST(Fp8E4M3, EveryCodeMatchesDefinition) {
  for (uint32_t c = 0; c < 256; ++c) {
    float f = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(fp8_e4m3_table()[c]));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ref_decode(c, 4, 3)) << c;
    ASSERT_EQ(fp8_e4m3_table()[c], f);
    ASSERT_EQ(f32_to_fp8_e4m3(f), c) << c;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
}

TEST(Fp8E4M3, RoundingAgainstBruteForce) {
  for (int i = -20000; i <= 20000; ++i) {
    float x = static_cast<float>(i) * 0.0231f;
    if (std::fabs(x) > 448.0f) continue;
    uint32_t want = ref_round(x, 4, 3, 0x7e) | (std::signbit(x) ? 0x80 : 0);
    ASSERT_EQ(f32_to_fp8_e4m3(x), want) << x;
  }
  // Midpoints tie to even.
  for (uint32_t c = 0; c < 0x7e; ++c) {
    float mid = static_cast<float>((ref_decode(c, 4, 3) + ref_decode(c + 1, 4, 3)) / 2);
    ASSERT_EQ(f32_to_fp8_e4m3(mid), (c & 1) ? c + 1 : c) << c;
  }
}

TEST(Fp8E4M3, SaturationAndNaN) {
  EXPECT_EQ(f32_to_fp8_e4m3(460.0f, true), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f, false), 0x7e);  // the midpoint rounds down to the even 448
  EXPECT_EQ(f32_to_fp8_e4m3(465.0f, false), 0x7f);  // non-saturating overflow is NaN
  EXPECT_EQ(f32_to_fp8_e4m3(1e6f, true), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e6f, true), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(INFINITY, false), 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(1e-12f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
}

TEST(Fp8E5M2, EveryCodeMatchesDefinition) {
  for (uint32_t c = 0; c < 256; ++c) {
    float f = fp8_e5m2_to_f32(static_cast<uint8_t>(c));
    uint32_t exp = (c >> 2) & 0x1f;
    if (exp == 0x1f) {
      EXPECT_TRUE((c & 3) ? std::isnan(f) : std::isinf(f));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ref_decode(c, 5, 2)) << c;
    ASSERT_EQ(f32_to_fp8_e5m2(f), c) << c;
  }
  for (uint32_t c = 0; c < 0x7b; ++c) {
    float mid = static_cast<float>((ref_decode(c, 5, 2) + ref_decode(c + 1, 5, 2)) / 2);
    ASSERT_EQ(f32_to_fp8_e5m2(mid), (c & 1) ? c + 1 : c) << c;
  }
  EXPECT_EQ(f32_to_fp8_e5m2(1e6f, true), 0x7b);
  EXPECT_EQ(f32_to_fp8_e5m2(1e6f, false), 0x7c);  // infinity
  EXPECT_EQ(f32_to_fp8_e5m2(INFINITY, false), 0x7c);
}

TEST(E2M1, EveryCodeAndTies) {
  for (uint8_t c = 0; c < 16; ++c) {
    float f = e2m1_to_f32(c);
    EXPECT_EQ(f32_to_e2m1(f), c);  // -0 keeps its sign bit: code 8
  }
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(5.01f), 7);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);
  EXPECT_EQ(f32_to_e2m1(-3.0f), 13);
}

TEST(Nvfp4, LayoutAndScalesAsPublished) {
  // One row, 32 columns: two blocks. Block 0 holds exact multiples so it round-trips exactly.
  std::vector<float> w(32, 0.0f);
  for (int i = 0; i < 16; ++i) w[i] = kE2M1Values[i % 8] * ((i % 2) ? -1.0f : 1.0f);
  for (int i = 16; i < 32; ++i) w[i] = 0.01f * static_cast<float>(i - 16);
  auto q = nvfp4_quantize(w.data(), 1, 32);
  ASSERT_EQ(q.packed.size(), 16u);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_FLOAT_EQ(q.scale2, 6.0f / (6.0f * 448.0f));
  // block scale = block_amax / (6 * scale2) = 6 / (6 / 448) = 448
  EXPECT_EQ(fp8_e4m3_to_f32(q.scales[0]), 448.0f);
  // element 0 in the low nibble of byte 0, element 1 in the high nibble.
  EXPECT_EQ(q.packed[0] & 0xf, f32_to_e2m1(w[0]));
  EXPECT_EQ(q.packed[0] >> 4, f32_to_e2m1(w[1]));
  std::vector<float> back(32);
  nvfp4_dequantize_row(q.packed.data(), q.scales.data(), q.scale2, 32, back.data());
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(back[i], w[i]) << i;
  for (int i = 16; i < 32; ++i) EXPECT_NEAR(back[i], w[i], 0.15f * 0.15f + 0.02f) << i;
}

TEST(Nvfp4, ErrorWithinFormatBudget) {
  std::vector<float> w(64 * 128);
  uint32_t s = 1;
  for (auto& x : w) {
    s = s * 1664525u + 1013904223u;
    x = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 2.0f;
  }
  auto q = nvfp4_quantize(w.data(), 64, 128);
  std::vector<float> row(128);
  for (int r = 0; r < 64; ++r) {
    nvfp4_dequantize_row(q.packed.data() + r * 64, q.scales.data() + r * 8, q.scale2, 128, row.data());
    for (int b = 0; b < 8; ++b) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(w[r * 128 + b * 16 + i]));
      // E2M1 steps are at most 2 apart at the top of the range (4 -> 6): error <= 1/6 of the block max,
      // plus the e4m3 rounding of the block scale (2^-4 relative).
      for (int i = 0; i < 16; ++i)
        ASSERT_LE(std::fabs(row[b * 16 + i] - w[r * 128 + b * 16 + i]), amax * (1.0f / 6.0f) * 1.07f + 1e-7f);
    }
  }
}

TEST(Fp8Block, QuantizeDequantize) {
  const int rows = 200, cols = 300;
  std::vector<float> w(rows * cols);
  for (int i = 0; i < rows * cols; ++i) w[i] = std::sin(static_cast<float>(i) * 0.37f) * (1 + (i % 7));
  auto q = fp8_block_quantize(w.data(), rows, cols);
  EXPECT_EQ(q.scale_inv.size(), 2u * 3u);
  std::vector<float> row(cols);
  for (int r = 0; r < rows; ++r) {
    fp8_block_dequantize_row(q.data.data() + r * cols, q.scale_inv.data() + (r / 128) * q.scale_cols(), cols,
                             row.data());
    for (int c = 0; c < cols; ++c) {
      float s = q.scale_inv[(r / 128) * 3 + c / 128];
      // e4m3 has 3 mantissa bits: relative error <= 2^-4, absolute floor from subnormals.
      ASSERT_LE(std::fabs(row[c] - w[r * cols + c]),
                std::fabs(w[r * cols + c]) / 16 + s * std::ldexp(1.0f, -9))
          << r << "," << c;
    }
  }
}
