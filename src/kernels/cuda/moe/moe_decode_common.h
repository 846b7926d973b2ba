// What the launch configurations of the decode paths of the routed experts share (moe_decode_config.h:
// NVFP4 register-streamed, moe_stream_config.h: NVFP4 cp.async ring, moe_decode_fp8_config.h: FP8-block
// register-streamed): the NVFP4 shape, the regime checks, the e2m1 table's size and the
// blocks-per-multiprocessor arithmetic; and the work split and shared-memory layouts of the two
// register-streamed paths. Host-only, no CUDA types (tests/unit/kernels/kernel_fit_test.cpp).
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

// Why a step is outside a path's regime (m in [1, max_m], m * top_k <= max_slots, n_experts in
// [1, kMaxExperts]), or nullopt.
inline std::optional<std::string> why_outside_regime(int m, int top_k, int n_experts, int max_m,
                                                     int max_slots) {
  if (m < 1 || m > max_m) return fmt::format("m = {} is outside the decode regime [1, {}]", m, max_m);
  if (top_k < 1 || static_cast<int64_t>(m) * top_k > max_slots)
    return fmt::format("m * top_k = {} exceeds {}", static_cast<int64_t>(m) * top_k, max_slots);
  if (n_experts < 1 || n_experts > kMaxExperts)
    return fmt::format("n_experts = {} is outside [1, {}]", n_experts, kMaxExperts);
  return std::nullopt;
}

// Why s is outside an NVFP4 path's regime (format, then why_outside_regime), or nullopt; `path` names the
// path in the NVFP4 message ("decode", "streamed").
inline std::optional<std::string> why_outside(const Shape& s, const char* path, int max_m, int max_slots) {
  if (!s.nvfp4) return fmt::format("the {} path reads NVFP4 experts only", path);
  return why_outside_regime(s.m, s.top_k, s.n_experts, max_m, max_slots);
}

// Blocks of `smem` bytes that fit one multiprocessor (1 KB of each block's shared memory is reserved).
inline int blocks_per_sm(size_t smem, const DeviceLimits& dev) {
  return static_cast<int>((dev.smem_per_block_optin + 1024) / (smem + 1024));
}

// The most x rows a pass, up to `want`, whose gate_up layout (smem_of(rows) bytes) still lets `min_blocks`
// blocks share a multiprocessor; one where none does.
template <typename SmemOf>
int most_x_rows(int want, int min_blocks, const DeviceLimits& dev, SmemOf&& smem_of) {
  for (int r = want; r > 1; --r)
    if (blocks_per_sm(smem_of(r), dev) >= min_blocks) return r;
  return 1;
}

// ---- the register-streamed paths (NVFP4: moe_decode_config.h, FP8-block: moe_decode_fp8_config.h) ------
// Both split the work alike: gate_up blocks of 8 warps on items of (expert chunk, 16 intermediate indices),
// down blocks of 4 warps on 16 output rows, and carve their shared memory alike; only the stride of the
// staged x rows (their xs_ld) differs.

constexpr int kThreads = 256;  // gate_up: 8 warps
constexpr int kWarps = 8;
constexpr int kMaxSlots =
    1152;  // m * top_k: 128 tokens x (top-8 + the fused shared expert) of GLM-5 / DeepSeek-V3
// (expert, chunk) pairs of the work list: every pair holds at least one of the m * top_k positions, so there
// are at most kMaxSlots of them.
constexpr int kMaxEc = 1536;
static_assert(kMaxEc >= kMaxSlots, "a work list of one position per pair must fit");
// Work-list entry: expert | chunk << 10 (chunk < kMaxSlots, so it stays far below the sign bit).
static_assert(kMaxExperts <= 1024 && static_cast<int64_t>(kMaxSlots) << 10 <= INT32_MAX,
              "expert ids fit 10 bits and chunk << 10 fits an int");
constexpr int kChunk = 8;      // positions of one expert per pass (one mma n-tile)
constexpr int kGuIdx = 16;     // gate_up: intermediate indices per work item (16 gate + 16 up rows)
constexpr int kDownRows = 16;  // down: output rows per block
// down: 4 warps a block (and several blocks a multiprocessor: each path's kDownMinBlocks says why).
constexpr int kDownWarps = 4;
constexpr int kDownThreads = 32 * kDownWarps;

constexpr size_t gate_up_red_bytes() {  // [8 warps][2 gate/up][8 positions][16 rows] f32
  return static_cast<size_t>(kWarps) * 2 * kChunk * 16 * sizeof(float);
}
constexpr size_t ec_bytes() {
  return static_cast<size_t>(kMaxEc) * sizeof(int32_t);
}
// Layouts: xs [x_rows][xld] f16 | red | ec (xld: the path's xs_ld(hidden)).
constexpr size_t gate_up_smem_ld(int64_t xld, int x_rows) {
  return static_cast<size_t>(x_rows) * xld * 2 + gate_up_red_bytes() + ec_bytes();
}
// Layouts: out_w [4 warps][m][16] f32 | scratch [4 warps][8 positions][16] f32 | ec.
constexpr size_t down_smem(int m) {
  return static_cast<size_t>(kDownWarps) * m * kDownRows * sizeof(float) +
         static_cast<size_t>(kDownWarps) * kChunk * kDownRows * sizeof(float) + ec_bytes();
}

}  // namespace ms::cuda::moe_decode_common
