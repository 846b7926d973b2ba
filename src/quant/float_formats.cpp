#include "quant/float_formats.h"

#include <cmath>
#include <cstring>

namespace ms::quant {

namespace {

// Generic decode of a small float with `eb` exponent bits and `mb` mantissa bits (no sign in `bits`).
float decode_small(uint32_t sign, uint32_t exp, uint32_t man, int eb, int mb) {
  const int bias = (1 << (eb - 1)) - 1;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), 1 - bias - mb);
  } else {
    v = std::ldexp(static_cast<float>(man | (1u << mb)), static_cast<int>(exp) - bias - mb);
  }
  return sign ? -v : v;
}

// Round |f| (finite, not NaN) to a float with `eb` exponent bits, `mb` mantissa bits, nearest even.
// Returns the magnitude bits (exp << mb | man), possibly one past the largest normal when it overflows.
uint32_t encode_magnitude(float af, int eb, int mb) {
  const int bias = (1 << (eb - 1)) - 1;
  uint32_t u = std::bit_cast<uint32_t>(af);
  int e = static_cast<int>((u >> 23) & 0xff) - 127;
  uint32_t m = u & 0x7fffffu;
  if ((u >> 23) == 0) return 0;  // f32 subnormals are far below every small format's range
  // Target exponent; below the normal range we shift into a subnormal.
  int te = e + bias;
  uint32_t full = m | 0x800000u;  // 24-bit significand
  int shift;                      // right shift of the 24-bit significand to keep mb bits after the point
  if (te >= 1) {
    shift = 23 - mb;
  } else {
    shift = 23 - mb + (1 - te);
    te = 0;
  }
  if (shift >= 32) return 0;
  uint32_t kept = full >> shift;
  uint32_t rem = full & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (kept & 1u))) ++kept;
  // kept includes the implicit bit for normals; assemble exponent and mantissa, letting a carry move the
  // exponent.
  uint32_t bits;
  if (te == 0) {
    bits = kept;  // subnormal (or rounded up into the first normal, which the bit pattern encodes naturally)
  } else {
    bits = (static_cast<uint32_t>(te) << mb) + (kept - (1u << mb));
  }
  return bits;
}

}  // namespace

float f16_to_f32(uint16_t h) {
  uint32_t sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) {
    if (man) return std::bit_cast<float>((sign << 31) | 0x7fc00000u | (man << 13));
    return sign ? -INFINITY : INFINITY;
  }
  return decode_small(sign, exp, man, 5, 10);
}

uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  float af = std::fabs(f);
  if (std::isinf(af)) return sign | 0x7c00u;
  uint32_t bits = encode_magnitude(af, 5, 10);
  if (bits >= 0x7c00u) return sign | 0x7c00u;  // overflow to infinity
  return static_cast<uint16_t>(sign | bits);
}

float fp8_e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 0x7;
  if (exp == 0xf && man == 0x7) return sign ? -NAN : NAN;
  return decode_small(sign, exp, man, 4, 3);
}

uint8_t f32_to_fp8_e4m3(float f, bool saturate) {
  uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7f;
  float af = std::fabs(f);
  if (std::isinf(af)) return saturate ? (sign | 0x7e) : (sign | 0x7f);
  uint32_t bits = encode_magnitude(af, 4, 3);
  if (bits > 0x7e) return saturate ? (sign | 0x7e) : (sign | 0x7f);
  return static_cast<uint8_t>(sign | bits);
}

float fp8_e5m2_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 2) & 0x1f, man = v & 0x3;
  if (exp == 0x1f) {
    if (man) return sign ? -NAN : NAN;
    return sign ? -INFINITY : INFINITY;
  }
  return decode_small(sign, exp, man, 5, 2);
}

uint8_t f32_to_fp8_e5m2(float f, bool saturate) {
  uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7f;
  float af = std::fabs(f);
  if (std::isinf(af)) return saturate ? (sign | 0x7b) : (sign | 0x7c);
  uint32_t bits = encode_magnitude(af, 5, 2);
  if (bits > 0x7b) return saturate ? (sign | 0x7b) : (sign | 0x7c);
  return static_cast<uint8_t>(sign | bits);
}

const float* fp8_e4m3_table() {
  static const struct Table {
    float v[256];
    Table() {
      for (int i = 0; i < 256; ++i) v[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    }
  } table;
  return table.v;
}

}  // namespace ms::quant
