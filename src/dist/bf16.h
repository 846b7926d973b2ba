// bf16 <-> f32 for the CPU communicators' sums (LocalGroup, TcpComm), which add bf16 buffers in f32 in rank
// order. The same conversions as quant/float_formats.h (a room dist may not include): round to nearest even,
// NaN stays a quiet NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace ms::dist {

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace ms::dist
