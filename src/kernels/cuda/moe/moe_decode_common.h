// What the two launch configurations of the NVFP4 decode paths of the routed experts share
// (moe_decode_config.h: register-streamed, moe_stream_config.h: cp.async ring): the shape they are chosen
// from, the regime checks, the e2m1 table's size and the blocks-per-multiprocessor arithmetic. Host-only, no
// CUDA types (tests/unit/kernels/kernel_fit_test.cpp).
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::cuda::moe_decode_common {

constexpr int kMaxExperts = 1024;                          // expert ids fit 10 bits of a work-list entry
constexpr size_t kLutBytes = 256 * 32 * sizeof(uint32_t);  // byte -> bf16x2, replicated per lane

struct Shape {
  bool nvfp4 = false;
  int hidden = 0, inter = 0, m = 0, top_k = 0, n_experts = 0;
};

// Why s is outside a path's regime (format, m in [1, max_m], m * top_k <= max_slots, n_experts in
// [1, kMaxExperts]), or nullopt; `path` names the path in the NVFP4 message ("decode", "streamed").
inline std::optional<std::string> why_outside(const Shape& s, const char* path, int max_m, int max_slots) {
  if (!s.nvfp4) return fmt::format("the {} path reads NVFP4 experts only", path);
  if (s.m < 1 || s.m > max_m) return fmt::format("m = {} is outside the decode regime [1, {}]", s.m, max_m);
  if (s.top_k < 1 || static_cast<int64_t>(s.m) * s.top_k > max_slots)
    return fmt::format("m * top_k = {} exceeds {}", static_cast<int64_t>(s.m) * s.top_k, max_slots);
  if (s.n_experts < 1 || s.n_experts > kMaxExperts)
    return fmt::format("n_experts = {} is outside [1, {}]", s.n_experts, kMaxExperts);
  return std::nullopt;
}

// Blocks of `smem` bytes that fit one multiprocessor (1 KB of each block's shared memory is reserved).
inline int blocks_per_sm(size_t smem, const DeviceLimits& dev) {
  return static_cast<int>((dev.smem_per_block_optin + 1024) / (smem + 1024));
}

}  // namespace ms::cuda::moe_decode_common
