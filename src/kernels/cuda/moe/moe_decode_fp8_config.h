// Launch configuration of the register-streamed FP8-block decode experts (moe_experts_decode_fp8.h: e4m3
// weights with one f32 scale per 128x128 block, DeepSeek-V3's format), chosen on the host from the shape and
// the device's limits alone (no CUDA types: tests/unit/kernels/kernel_fit_test.cpp runs it against the sm_90,
// sm_100 and sm_120 presets). The kernels carve their shared memory with the same functions, so what is
// checked here is what is launched.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/moe/moe_decode_common.h"

namespace ms::cuda::moe_decode_fp8_config {

using moe_decode_common::blocks_per_sm;
using moe_decode_common::down_smem;
using moe_decode_common::ec_bytes;
using moe_decode_common::gate_up_red_bytes;
using moe_decode_common::kChunk;
using moe_decode_common::kDownRows;
using moe_decode_common::kDownThreads;
using moe_decode_common::kDownWarps;
using moe_decode_common::kGuIdx;
using moe_decode_common::kMaxEc;
using moe_decode_common::kMaxExperts;
using moe_decode_common::kMaxSlots;
using moe_decode_common::kThreads;
using moe_decode_common::kWarps;

// down: 4 warps a block and up to 4 blocks a multiprocessor (registers: <= 128 a thread), so that the hidden
// / 16 row tiles of a DeepSeek-V3 or GLM-5 layer (448, 384) are resident at once on an H200 (132 x 4 slots)
// instead of running in two waves of 8-warp blocks (264 slots).
constexpr int kDownMinBlocks = 4;
// Tokens per step: the down kernel keeps per-warp output tiles [4 warps][m][16] f32 in shared memory (32 KB
// at 128 tokens: down_smem(128) is ~40 KB, two blocks a multiprocessor on sm_120's 99 KB, four on an H200).
// Above 128 the grouped GEMMs or the CUDA-core kernels take the step.
constexpr int kMaxM = 128;
constexpr int kBlock = 128;  // the scale block edge the kernels apply (one warp step = one block of k)
constexpr int kGuAhead = 2;  // gate_up: 128-k steps whose weights a lane holds in flight (4 rows x 32 B each)
constexpr int kDownAhead = 4;  // down: 128-k pieces whose weights a lane holds in flight (2 rows x 32 B each)

struct Shape {
  bool fp8_block = false;  // format FP8Block
  int block = 0;           // its scale block edge
  int hidden = 0, inter = 0, m = 0, top_k = 0, n_experts = 0;
};

// gate_up stages the chunk's x rows as f16 in shared memory, in k order, rows hidden + 8 elements apart (16
// bytes past a multiple of 128 bytes, hidden being a multiple of 128): a quarter-warp's 16-byte B reads (rows
// r, r + 1; lanes t = 0..3 reading elements 64 h + 16 t + 8 p of a block, 32 t + 16 p bytes: slots 2 t + p of
// the 128-byte bank line) then fill the eight distinct 16-byte slots (row r + 1 shifted by one).
constexpr int64_t xs_ld(int hidden) {
  return hidden + 8;
}
// Layouts: xs [x_rows][xs_ld] f16 | red | ec (moe_decode_common.h), down's likewise.
constexpr size_t gate_up_smem(int hidden, int x_rows) {
  return moe_decode_common::gate_up_smem_ld(xs_ld(hidden), x_rows);
}

struct Config {
  bool use = false;
  std::string why;  // when !use: why the other kernels run instead
  int x_rows = 1;   // gate_up: positions of one expert per pass (x rows staged), 1..8
  size_t smem_gate_up = 0, smem_down = 0;
  int grid_gate_up = 0, grid_down = 0;
};

constexpr size_t kStaticSmem = 16;  // the kernels' own __shared__ variables
inline KernelNeed need_gate_up(int hidden, int x_rows) {
  return {"moe_decode_fp8_gate_up", gate_up_smem(hidden, x_rows) + kStaticSmem, 80, false};
}
inline KernelNeed need_down(int m) {
  return {"moe_decode_fp8_down", down_smem(m) + kStaticSmem, 80, false};
}

// Why s is outside the path's regime or shape rule, or nullopt.
inline std::optional<std::string> why_outside(const Shape& s) {
  if (!s.fp8_block) return std::string("the FP8 decode path reads FP8Block experts only");
  if (s.block != kBlock)
    return fmt::format("fp8_block = {}: the FP8 decode path applies 128x128 block scales only", s.block);
  if (auto why = moe_decode_common::why_outside_regime(s.m, s.top_k, s.n_experts, kMaxM, kMaxSlots))
    return why;
  // A warp step covers one whole 128-k scale block of a 16-row tile (which lies in one 128-row block), so
  // the k of both GEMMs and the row counts must be whole blocks.
  if (s.hidden <= 0 || s.hidden % kBlock != 0)
    return fmt::format("hidden = {} is not a multiple of {} (the scale block)", s.hidden, kBlock);
  if (s.inter <= 0 || s.inter % kBlock != 0)
    return fmt::format("inter = {} is not a multiple of {} (the scale block)", s.inter, kBlock);
  return std::nullopt;
}

inline Config choose(const Shape& s, const DeviceLimits& dev) {
  Config c;
  auto no = [&](std::string why) {
    c.use = false;
    c.why = std::move(why);
    return c;
  };
  if (auto why = why_outside(s)) return no(*why);
  // gate_up: the most x rows per pass (up to min(m, 8)) that still let two blocks share a multiprocessor;
  // else the fewest rows in one block.
  const int want = std::min(s.m, kChunk);
  const int rows = moe_decode_common::most_x_rows(
      want, 2, dev, [&](int r) { return gate_up_smem(s.hidden, r) + kStaticSmem; });
  for (const KernelNeed& n : {need_gate_up(s.hidden, rows), need_down(s.m)})
    if (auto why = why_cannot_run(n, dev)) return no(*why);
  c.use = true;
  c.x_rows = rows;
  c.smem_gate_up = gate_up_smem(s.hidden, rows);
  c.smem_down = down_smem(s.m);
  const int fit =
      std::clamp(blocks_per_sm(c.smem_gate_up + kStaticSmem, dev), 1, 2);  // registers allow 2 of 256 threads
  c.grid_gate_up = fit * std::max(dev.multiprocessors, 1);                 // persistent
  c.grid_down = s.hidden / kDownRows;                                      // one block per row tile
  return c;
}

}  // namespace ms::cuda::moe_decode_fp8_config
