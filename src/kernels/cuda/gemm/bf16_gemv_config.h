// Launch configurations of bf16_gemv, chosen on the host from the shape and the device's limits (no CUDA
// types: tested without a GPU in tests/unit/kernels/kernel_fit_test.cpp).
//
// Work units: k is cut into slices of `warps` x warp_k (each warp of a block owns warp_k of every slice), n
// into 16-row tiles. A block owns `tiles_per_block` consecutive tiles and `slices_per_block` consecutive
// slices; `splits` blocks share a row block along k and the last of them to finish adds their partial sums.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::cuda::bf16_gemv_config {

constexpr int kMaxWarps = 8;
constexpr int kMaxThreads = kMaxWarps * 32;
constexpr int kWarpK = 128;  // k per warp per slice: 4 lanes x 4 loads of 8 bf16
constexpr int kTileRows = 16;
constexpr int kMaxTilesPerBlock = 8;
constexpr int kMaxM = 8;
// Warps resident per multiprocessor: __launch_bounds__(kMaxThreads, 2) caps registers at 128 per thread.
constexpr int kWarpsPerSm = 16;

// The weight formats the kernel reads: bf16, or fp8 e4m3 with an f32 scale per 128 x 128 block (each warp
// then owns 256 of k, 4 lanes x 4 loads of 16 fp8: the same bytes per step).
enum class Weights : uint8_t { BF16, FP8Block };
constexpr int warp_k(Weights w) {
  return w == Weights::FP8Block ? 2 * kWarpK : kWarpK;
}
constexpr int weight_bytes(Weights w) {
  return w == Weights::FP8Block ? 1 : 2;
}

struct Config {
  int warps = 1;             // per block (blockDim.x / 32)
  int slices = 1;            // ceil(k / (warps * warp_k))
  int slices_per_block = 1;  // consecutive slices one block walks
  int splits = 1;            // blocks along k: gridDim.y = ceil(slices / slices_per_block)
  int tiles_per_block = 1;   // 16-row tiles per block
  int row_blocks = 1;        // gridDim.x = ceil(ceil(n / 16) / tiles_per_block)
};

constexpr int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// Rows of x the kernel template for m rows is instantiated with (1, 2, 4 or 8).
constexpr int m_template(int m) {
  return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
}

// The block's per-warp partial sums [warps][m_tmpl][red_row_stride] f32 (16 * tiles_per_block rows used).
constexpr int red_row_stride(const Config& c) {
  return kTileRows * c.tiles_per_block + 4;
}
constexpr size_t smem_bytes(int m_tmpl, const Config& c) {
  return static_cast<size_t>(c.warps) * m_tmpl * red_row_stride(c) * sizeof(float);
}

inline KernelNeed need(int m, const Config& c, Weights w = Weights::BF16) {
  return {fmt::format("{}_gemv m{} warps{} tiles{}", w == Weights::FP8Block ? "fp8_block" : "bf16",
                      m_template(m), c.warps, c.tiles_per_block),
          smem_bytes(m_template(m), c), 80, false};
}

// Scratch any device's choice fits in (the split count is at most `slices`, the row blocks at most the
// tiles).
inline int max_slices(int k, Weights w = Weights::BF16) {
  const int chunks = ceil_div(std::max(k, 1), warp_k(w));
  return ceil_div(chunks, std::min(kMaxWarps, chunks));
}
inline size_t partial_bytes_bound(int m, int n, int k, Weights w = Weights::BF16) {
  const int s = max_slices(k, w);
  return s > 1 ? static_cast<size_t>(s) * std::max(m, 0) * std::max(n, 0) * sizeof(float) : 0;
}
inline size_t counter_bytes_bound(int n, int k, Weights w = Weights::BF16) {
  return max_slices(k, w) > 1 ? static_cast<size_t>(ceil_div(std::max(n, 1), kTileRows)) * sizeof(uint32_t)
                              : 0;
}

// Why `c` cannot cover an [n, k] weight as the kernel walks it (empty when it can): warps 1..kMaxWarps, the
// slices and tiles the shape needs, the split and row-block counts they imply.
inline std::string why_invalid(const Config& c, int n, int k, Weights w = Weights::BF16) {
  if (n <= 0 || k <= 0) return fmt::format("n = {} and k = {} must be positive", n, k);
  if (c.warps < 1 || c.warps > kMaxWarps)
    return fmt::format("warps = {} outside [1, {}]", c.warps, kMaxWarps);
  const int chunks = ceil_div(k, warp_k(w)), tiles = ceil_div(n, kTileRows);
  if (c.slices != ceil_div(chunks, c.warps))
    return fmt::format("slices = {} but k = {} needs {} with {} warps", c.slices, k,
                       ceil_div(chunks, c.warps), c.warps);
  if (c.slices_per_block < 1 || c.splits != ceil_div(c.slices, c.slices_per_block))
    return fmt::format("splits = {} do not match {} slices of {} per block", c.splits, c.slices,
                       c.slices_per_block);
  if (c.tiles_per_block < 1 || c.tiles_per_block > kMaxTilesPerBlock ||
      c.row_blocks != ceil_div(tiles, c.tiles_per_block))
    return fmt::format("row_blocks = {} with {} tiles per block do not cover n = {}", c.row_blocks,
                       c.tiles_per_block, n);
  return {};
}

// A rough time model of one launch, in microseconds, for choosing between configurations (constants of an
// H200; the choice, not the figure, is what matters). The weights stream at the lowest of the HBM bandwidth,
// what the resident warps keep in flight (one or two 16-row steps each) over a loaded round trip (2 us: what
// the NVFP4 GEMV's runs on an H200 imply, 32 KB in flight per multiprocessor giving 2.1 TB/s), and a share of
// the HBM rate that falls once fewer than about all multiprocessors have a block; x re-read by every row
// block and the partial sums written and read back cost L2 bandwidth; each warp needs a round trip per two of
// its steps; splitting k adds the last block's fence, counter and re-read at the end.
struct TimeModel {
  double hbm_bytes_per_us = 4.3e6;
  double l2_over_hbm = 2.5;
  double latency_us = 2.0;
  double warp_bytes_in_flight = 1.5 * kTileRows * kWarpK * 2;  // one or two 16-row steps
  double busy_sm_share_for_full_rate = 0.93;                   // below it, the rate falls with the busy share
  double split_tail_us = 1.0;
};

inline double estimate_us(int m, int n, int k, const Config& c, const DeviceLimits& dev,
                          Weights w = Weights::BF16, const TimeModel& t = {}) {
  const long sms = std::max(dev.multiprocessors, 1);
  const long slots = sms * std::max(kWarpsPerSm / c.warps, 1);
  const long blocks = static_cast<long>(c.row_blocks) * c.splits;
  const long resident = std::min(blocks, slots);
  const double busy_share = static_cast<double>(std::min(resident, sms)) / static_cast<double>(sms);
  const double bw = std::min({t.hbm_bytes_per_us, resident * c.warps * t.warp_bytes_in_flight / t.latency_us,
                              t.hbm_bytes_per_us * busy_share / t.busy_sm_share_for_full_rate});
  const double l2_bytes = static_cast<double>(c.row_blocks) * m * k * 4.0 +
                          (c.splits > 1 ? 2.0 * c.splits * m * static_cast<double>(n) * 4.0 : 0.0);
  const double stream_us = (weight_bytes(w) * n * static_cast<double>(k) + l2_bytes / t.l2_over_hbm) / bw;
  const long rounds = (blocks + slots - 1) / slots;
  const double latency_bound_us =
      static_cast<double>(rounds) * (c.tiles_per_block * c.slices_per_block + 1) * t.latency_us / 2;
  return std::max(stream_us, latency_bound_us) + (c.splits > 1 ? t.split_tail_us : 0.0);
}

// The configuration of least estimate_us among those that fit the device (warps: one per warp_k(w) of k, at
// most kMaxWarps); ties go to fewer splits, then to more rows per block.
inline Config choose(int m, int n, int k, const DeviceLimits& dev, Weights w = Weights::BF16) {
  const int chunks = ceil_div(std::max(k, 1), warp_k(w));
  const int warps = std::min(kMaxWarps, chunks);
  const int slices = ceil_div(chunks, warps);
  const int tiles = ceil_div(std::max(n, 1), kTileRows);
  Config best{warps, slices, slices, 1, 1, tiles};  // the smallest tiles, when nothing else fits
  double best_us = 0;
  bool have = false;
  for (int spb = slices; spb >= 1; --spb) {
    const int splits = ceil_div(slices, spb);
    if (spb < slices && ceil_div(slices, spb + 1) == splits) continue;  // same split, more slices each
    for (int tpb = std::min(kMaxTilesPerBlock, tiles); tpb >= 1; --tpb) {
      const Config c{warps, slices, spb, splits, tpb, ceil_div(tiles, tpb)};
      if (why_cannot_run(need(m, c, w), dev)) continue;
      const double us = estimate_us(m, n, k, c, dev, w);
      if (!have || us < best_us * (1 - 1e-6)) {
        best = c;
        best_us = us;
        have = true;
      }
    }
  }
  return best;
}

}  // namespace ms::cuda::bf16_gemv_config
