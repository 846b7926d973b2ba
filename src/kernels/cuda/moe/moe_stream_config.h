// Launch configuration of the streamed decode path of the routed experts (moe_experts_stream.h), chosen on
// the host from the shape and the device's limits alone (no CUDA types:
// tests/unit/kernels/kernel_fit_test.cpp runs it against the sm_90, sm_100 and sm_120 presets). The kernels
// carve their shared memory with the same functions, so what is checked here is what is launched.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/moe/moe_decode_common.h"

namespace ms::cuda::moe_stream_config {

using moe_decode_common::blocks_per_sm;
using moe_decode_common::kLutBytes;
using moe_decode_common::kMaxExperts;
using moe_decode_common::Shape;

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = 8;
constexpr int kStages = 3;     // cp.async ring depth
constexpr int kTokChunk = 32;  // most positions of one expert per pass (4 mma n-tiles of 8)
constexpr int kGuKc = 512;     // gate_up: k per stage (8 warps x 64)
constexpr int kGuIdx = 32;     // gate_up: intermediate indices per work item (64 weight rows)
constexpr int kGuRows = 2 * kGuIdx;
constexpr int kDownRows = 16;     // down: output rows per block
constexpr int kDownKcMax = 2048;  // down: k per stage
constexpr int kMaxM = 256;        // decode regime: tokens per step
constexpr int kMaxSlots = 4096;   // m * top_k
constexpr int kMaxEc = 1536;      // (expert, chunk of >= 8 positions) pairs: <= min(E, slots) + slots / 8

constexpr int down_kc(int inter) {
  return inter <= kDownKcMax ? inter : kDownKcMax;
}
// Shared-memory rows are padded by 16 bytes so the 8 rows one mma fragment reads fall in distinct banks.
constexpr size_t data_ld(int kc) {
  return static_cast<size_t>(kc) / 2 + 16;
}
constexpr size_t scale_ld(int kc) {
  return static_cast<size_t>(kc) / 16 + 16;
}
constexpr size_t stage_bytes(int rows, int kc) {
  return rows * (data_ld(kc) + scale_ld(kc));
}
constexpr size_t gate_up_red_bytes() {
  return static_cast<size_t>(4) * kTokChunk * 16 * sizeof(float);
}
constexpr size_t down_red_bytes() {
  return static_cast<size_t>(kTokChunk) * 16 * sizeof(float);
}
constexpr size_t ec_bytes() {
  return static_cast<size_t>(kMaxEc) * sizeof(int32_t);
}
// Layouts: lut | ring | red | ec (| out tile [m][16] f32 for down).
constexpr size_t gate_up_smem() {
  return kLutBytes + kStages * stage_bytes(kGuRows, kGuKc) + gate_up_red_bytes() + ec_bytes();
}
constexpr size_t down_smem(int inter, int m) {
  return kLutBytes + kStages * stage_bytes(kDownRows, down_kc(inter)) + down_red_bytes() + ec_bytes() +
         static_cast<size_t>(m) * kDownRows * sizeof(float);
}

struct Config {
  bool use = false;
  std::string why;  // when !use: why the old grouped kernels run instead
  int nt = 1;       // mma n-tiles of 8 positions a pass holds: 1, 2 or 4
  size_t smem_gate_up = 0, smem_down = 0;
  int grid_gate_up = 0, grid_down = 0;
};

inline KernelNeed need_gate_up() {
  return {"moe_stream_gate_up", gate_up_smem(), 80, false};
}
inline KernelNeed need_down(int inter, int m) {
  return {"moe_stream_down", down_smem(inter, m), 80, false};
}

inline Config choose(const Shape& s, const DeviceLimits& dev) {
  Config c;
  auto no = [&](std::string why) {
    c.use = false;
    c.why = std::move(why);
    return c;
  };
  if (auto why = moe_decode_common::why_outside(s, "streamed", kMaxM, kMaxSlots)) return no(*why);
  if (s.hidden <= 0 || s.hidden % kGuKc != 0)
    return no(fmt::format("hidden = {} is not a multiple of {}", s.hidden, kGuKc));
  if (s.inter <= 0 || s.inter % kGuKc != 0 || s.inter % down_kc(s.inter) != 0)
    return no(
        fmt::format("inter = {} is not a multiple of {} (or of {} above it)", s.inter, kGuKc, kDownKcMax));
  for (const KernelNeed& n : {need_gate_up(), need_down(s.inter, s.m)})
    if (auto why = why_cannot_run(n, dev)) return no(*why);
  c.use = true;
  c.nt = s.m <= 8 ? 1 : s.m <= 16 ? 2 : 4;
  c.smem_gate_up = gate_up_smem();
  c.smem_down = down_smem(s.inter, s.m);
  const int fit = std::clamp(blocks_per_sm(c.smem_gate_up, dev), 1, 2);  // registers allow 2 of 256 threads
  c.grid_gate_up = fit * std::max(dev.multiprocessors, 1);               // persistent
  c.grid_down = s.hidden / kDownRows;                                    // one block per row tile
  return c;
}

}  // namespace ms::cuda::moe_stream_config
