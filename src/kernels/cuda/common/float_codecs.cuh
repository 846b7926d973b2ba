// Device conversions bit-exact with quant/float_formats.h (the CPU codecs): bf16 round-to-nearest-even with
// quiet NaN, fp8 e4m3 ("E4M3FN") decode and saturating round-to-nearest-even encode, E2M1 decode. Written
// with integer operations so the GPU stores the very bytes the CPU reference stores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda::dev {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// E4M3FN: bias 7, no infinities, S.1111.111 is NaN; subnormals are man * 2^-9.
__device__ __forceinline__ float fp8_e4m3_to_f32(uint32_t v) {
  const uint32_t sign = (v >> 7) & 1u, exp = (v >> 3) & 0xfu, man = v & 7u;
  if (exp == 0xfu && man == 7u) return __uint_as_float((sign << 31) | 0x7fc00000u);
  float mag;
  if (exp == 0)
    mag = static_cast<float>(man) * 0x1p-9f;
  else
    mag = __uint_as_float(((exp + 120u) << 23) | (man << 20));  // 2^(exp-7) * (1 + man/8)
  return sign ? -mag : mag;
}

// Round to nearest even; NaN keeps its sign with the NaN code, everything beyond 448 (and infinity)
// saturates to +-448, f32 subnormals become (signed) zero: as quant::f32_to_fp8_e4m3(f, true).
__device__ __forceinline__ uint8_t f32_to_fp8_e4m3_sat(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 31) ? 0x80u : 0u;
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (au == 0x7f800000u) return static_cast<uint8_t>(sign | 0x7eu);
  if ((au >> 23) == 0) return static_cast<uint8_t>(sign);
  int te = static_cast<int>(au >> 23) - 127 + 7;  // target exponent field
  const uint32_t full = (au & 0x7fffffu) | 0x800000u;
  int shift = 20;  // keep 3 mantissa bits of the 24-bit significand
  if (te < 1) {
    shift = 20 + (1 - te);
    te = 0;
  }
  if (shift >= 32) return static_cast<uint8_t>(sign);
  uint32_t kept = full >> shift;
  const uint32_t rem = full & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (kept & 1u))) ++kept;
  // Normals: kept holds the implicit bit; a carry out of the mantissa moves the exponent up by itself.
  const uint32_t bits = te == 0 ? kept : (static_cast<uint32_t>(te) << 3) + (kept - 8u);
  if (bits > 0x7eu) return static_cast<uint8_t>(sign | 0x7eu);
  return static_cast<uint8_t>(sign | bits);
}

// Signed E2M1 value of a 4-bit code (bit 3 = sign).
__device__ __forceinline__ float e2m1_to_f32(uint32_t code) {
  // Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 in units of 0.5: 0,1,2,3,4,6,8,12.
  constexpr uint32_t kHalves = 0xc8643210u;  // nibble c = magnitude of code c in halves
  const float mag = static_cast<float>((kHalves >> (4 * (code & 7u))) & 0xfu) * 0.5f;
  return (code & 8u) ? -mag : mag;
}

}  // namespace ms::cuda::dev
