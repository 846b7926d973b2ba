// Scalar conversions between f32 and the 16- and 8-bit float formats, bit-exact with their definitions:
//   bf16 and f16 (IEEE 754 binary16): round to nearest even, NaN stays NaN (quiet), overflow goes to
//   infinity. fp8 e4m3 (OCP "E4M3FN": no infinities, S.1111.111 is NaN, max 448) and fp8 e5m2 (IEEE-like, max
//   57344): round to nearest even; out of range either saturates to the largest finite value (saturate=true,
//   what quantizers want) or becomes NaN (e4m3) / infinity (e5m2) as the OCP spec's non-saturating mode says.
#pragma once

#include <bit>
#include <cstdint>

namespace ms::quant {

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f, bool saturate = true);
float fp8_e5m2_to_f32(uint8_t v);
uint8_t f32_to_fp8_e5m2(float f, bool saturate = true);

// 256-entry decode table for fp8 e4m3, for hot loops.
const float* fp8_e4m3_table();

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

}  // namespace ms::quant
