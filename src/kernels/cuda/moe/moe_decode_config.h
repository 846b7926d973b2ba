// Launch configuration of the register-streamed NVFP4 decode experts (moe_experts_decode.h), chosen on the
// host from the shape and the device's limits alone (no CUDA types: tests/unit/kernels/kernel_fit_test.cpp
// runs it against the sm_90, sm_100 and sm_120 presets). The kernels carve their shared memory with the same
// functions, so what is checked here is what is launched.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/moe/moe_decode_common.h"

namespace ms::cuda::moe_decode_config {

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
using moe_decode_common::Shape;

// Tokens per step: the down kernel keeps per-warp output tiles [4 warps][m][16] f32 in shared memory (32 KB
// at 128 tokens: down_smem(128) is ~40 KB, three blocks still share an H200 multiprocessor and one fits
// sm_120's 99 KB). Above 128 the streamed path (moe_stream_config.h) or the grouped GEMMs take the step.
constexpr int kMaxM = 128;
// down: 4 warps a block and up to 3 blocks a multiprocessor (registers: <= 170 a thread), so that the
// hidden / 16 blocks of a GLM-5 or DeepSeek-V3 layer (384, 448) are all resident at once on an H200 (132 x 3
// slots) instead of running in two waves of 8-warp blocks, the second half empty.
constexpr int kDownMinBlocks = 3;
constexpr int kDownKr = 512;  // down: k of one (expert, k-range) piece; a lane streams 128 of it
constexpr int kGuUnroll = 3;  // gate_up: 32-k steps whose weights a lane loads before using them
// whole (moe_experts_decode.h): 128-k steps a lane keeps in flight, and blocks a multiprocessor.
constexpr int kWholeSlots = 6, kWholeMinBlocks = 1;
// tile (moe_experts_decode.h): gate_up blocks of 4 warps (one 16-row gate or up tile each, all of k), 128-k
// steps in flight a lane, and the blocks a multiprocessor its registers allow (<= 102 a thread) and its x
// rows are chosen for; down blocks of 8 warps on 16 output rows (<= 85 registers: 3 blocks).
constexpr int kTileWarps = 4, kTileThreads = 32 * kTileWarps, kTileDepth = 4, kTileMinBlocks = 5;
constexpr int kDownTileWarps = 8, kDownTileThreads = 32 * kDownTileWarps, kDownTileMinBlocks = 3;

// The cp.async ring variant (decode_ring): each lane copies its own weight and scale bytes of a step into its
// own slots of a per-warp ring in shared memory, `depth` steps ahead of its math and across work items, and
// reads back only what it copied. Per lane and step: gate_up 4 rows x (16 weight bytes + the 4-byte word that
// holds the lane's 2 scale bytes), down 2 rows x (16 + 4).
// Not the default: on an H200 (GLM-5 shapes) it was 5-9% faster than the register kernels' base variant at 8
// to 64 tokens and 21% slower at one, and the register kernels' sc8 variant (moe_experts_decode.h) now
// matches or beats it at every size (8 tokens 639 against 665 us, 64 tokens 2290 against 2295 us).
constexpr int kRingMinDepth = 3;  // fewer steps in flight than the register kernels keep: not worth a ring
constexpr int kRingMaxDepth = 8;  // the kernels' cp.async.wait_group switch covers 0 .. kRingMaxDepth - 1
constexpr int kGuRingRows = 4, kDownRingRows = 2;
constexpr size_t ring_step_bytes(int rows,
                                 int warps) {  // one step of the block: warps x rows x 32 lanes x 20
  return static_cast<size_t>(warps) * rows * 32 * (16 + 4);
}

// gate_up stages the chunk's x rows as f16 in shared memory, in B order (moe_decode_math.cuh: b_order), rows
// hidden + 16 elements apart (32 bytes past a multiple of 128), with the four 16-byte pieces of every 64-byte
// group g stored in the order q ^ ((g >> 1) & 1): the 16-byte B reads of one quarter-warp (rows r, r + 1;
// lane quarters t = 0..3 reading the same piece of groups 4 s + t) then fall in eight distinct 16-byte bank
// groups.
constexpr int64_t xs_ld(int hidden) {
  return hidden + 16;
}
// red (moe_decode_common.h: gate_up_red_bytes): [8 warps][2 gate/up][8 positions][16 rows] f32; the half
// variants' [2 groups][4 warps][2][8][16] take the same bytes, so one layout (and one choice of x_rows)
// serves every variant of the register kernels.
constexpr int kHalfGroups = 2;                    // half: groups of warps a block, each on its own work item
constexpr int kHalfWarps = kWarps / kHalfGroups;  // half: warps of a group, splitting its item's k
// Layouts: xs [x_rows][xs_ld] f16 | red | ec (moe_decode_common.h), down's likewise.
constexpr size_t gate_up_smem(int hidden, int x_rows) {
  return moe_decode_common::gate_up_smem_ld(xs_ld(hidden), x_rows);
}

// tile: xs [x_rows][xld] f16 | red [4 warps][8 positions][16 rows] f32 (the block's entry is found by a scan,
// no work list is kept); down: out_w [8 warps][m][16] f32 | scratch [8 warps][8 positions][16] f32 | ec.
constexpr size_t gate_up_tile_smem(int hidden, int x_rows) {
  return static_cast<size_t>(x_rows) * xs_ld(hidden) * 2 +
         static_cast<size_t>(kTileWarps) * kChunk * 16 * sizeof(float);
}
constexpr size_t down_tile_smem(int m) {
  return static_cast<size_t>(kDownTileWarps) * (m + kChunk) * moe_decode_common::kDownRows * sizeof(float) +
         moe_decode_common::ec_bytes();
}

// Ring layouts: the register kernels' layout, then the ring [warps][depth][rows][32 lanes] 16-byte weight
// slots followed by [warps][depth][rows][32 lanes] 4-byte scale slots (a warp's 16-byte copies and reads of
// one row fill 512 contiguous bytes: four conflict-free wavefronts; its scale words 128 bytes: one).
constexpr size_t gate_up_ring_smem(int hidden, int x_rows, int depth) {
  return gate_up_smem(hidden, x_rows) + static_cast<size_t>(depth) * ring_step_bytes(kGuRingRows, kWarps);
}
constexpr size_t down_ring_smem(int m, int depth) {
  return down_smem(m) + static_cast<size_t>(depth) * ring_step_bytes(kDownRingRows, kDownWarps);
}

struct Config {
  bool use = false;
  std::string why;  // when !use: why the other kernels run instead
  int x_rows = 1;   // gate_up: positions of one expert per pass (x rows staged), 1..8
  size_t smem_gate_up = 0, smem_down = 0;
  int grid_gate_up = 0, grid_down = 0;
  // The cp.async ring variant (same x_rows and grid_down): fits when ring is set; else ring_why says why and
  // the register kernels run where it is asked for.
  bool ring = false;
  std::string ring_why;
  int ring_depth_gate_up = 0, ring_depth_down = 0;  // steps in flight per lane, kRingMinDepth..kRingMaxDepth
  size_t smem_gate_up_ring = 0, smem_down_ring = 0;
  int grid_gate_up_ring = 0;  // persistent: blocks per multiprocessor x multiprocessors
};

constexpr size_t kStaticSmem = 16;  // the kernels' own __shared__ variables
inline KernelNeed need_gate_up(int hidden, int x_rows) {
  return {"moe_decode_gate_up", gate_up_smem(hidden, x_rows) + kStaticSmem, 80, false};
}
inline KernelNeed need_down(int m) {
  return {"moe_decode_down", down_smem(m) + kStaticSmem, 80, false};
}

inline KernelNeed need_gate_up_tile(int hidden, int x_rows) {
  return {"moe_decode_gate_up_tile", gate_up_tile_smem(hidden, x_rows) + kStaticSmem, 80, false};
}
inline KernelNeed need_down_tile(int m) {
  return {"moe_decode_down_tile", down_tile_smem(m) + kStaticSmem, 80, false};
}

inline KernelNeed need_gate_up_ring(int hidden, int x_rows, int depth) {
  return {"moe_decode_gate_up_ring", gate_up_ring_smem(hidden, x_rows, depth) + kStaticSmem, 80, false};
}
inline KernelNeed need_down_ring(int m, int depth) {
  return {"moe_decode_down_ring", down_ring_smem(m, depth) + kStaticSmem, 80, false};
}

// The ring depth for a kernel whose ring-less layout takes `base` bytes and whose ring takes `step` bytes a
// step: of one or two blocks per multiprocessor, the choice with the most steps in flight per multiprocessor,
// blocks x (depth - 1) (more blocks on a tie: more warps to hide the math); {0, 0} when no depth fits.
struct RingFit {
  int depth = 0, blocks = 0;
};
inline RingFit ring_fit(size_t base, size_t step, const DeviceLimits& dev, int max_blocks) {
  RingFit best;
  for (int bps = max_blocks; bps >= 1; --bps) {
    const int64_t budget =
        std::min<int64_t>(static_cast<int64_t>(dev.smem_per_block_optin + 1024) / bps - 1024,
                          static_cast<int64_t>(dev.smem_per_block_optin)) -
        static_cast<int64_t>(kStaticSmem) - static_cast<int64_t>(base);
    if (budget < static_cast<int64_t>(step) * kRingMinDepth) continue;
    const int d = static_cast<int>(std::min<int64_t>(kRingMaxDepth, budget / static_cast<int64_t>(step)));
    if (best.depth == 0 || bps * (d - 1) > best.blocks * (best.depth - 1)) best = {d, bps};
  }
  return best;
}

// How a register variant's gate_up splits a work item's k: over the block's 8 warps (base, acc2, sc8,
// acc2sc8), over the 4 warps of a group (half, halfsc8), or not at all (whole: one warp an item of 16 gate
// and 16 up rows; tile: one warp a 16-row tile, blocks of its own shape, moe_experts_decode.h).
enum class KSplit { kBlock, kGroup, kWarp, kTile };
constexpr int k_split_warps(KSplit k) {
  return k == KSplit::kBlock ? kWarps : k == KSplit::kGroup ? kHalfWarps : 1;
}

// tile: an upper bound on the work-list entries of a step, which sizes its fixed gate_up grid. Each entry
// holds at least one of the m * top_k positions, and the touched experts' chunks of x_rows number at most
// positions / x_rows + the touched experts (sum of ceil(count / x_rows) <= sum of count / x_rows + 1).
constexpr int tile_max_entries(const Shape& s, int x_rows) {
  const int64_t slots = static_cast<int64_t>(s.m) * s.top_k;
  const int64_t by_chunks = (slots + x_rows - 1) / x_rows + std::min<int64_t>(s.n_experts, slots);
  return static_cast<int>(std::min<int64_t>({slots, by_chunks, moe_decode_common::kMaxEc}));
}

// The configuration for the register kernels' variants (moe_experts_decode.h): hidden a multiple of the
// k of one step of every warp on an item (1024, 512 for half, 128 for whole), the same shared-memory layout
// (whole leaves red unused); the ring (8 warps on one item) is offered only where hidden is a multiple of
// 1024. choose(s, dev) is choose_variant(s, dev, KSplit::kBlock): the 8-warp variants (one name, so tests can
// pass it on).
inline Config choose_variant(const Shape& s, const DeviceLimits& dev, KSplit ksplit) {
  Config c;
  auto no = [&](std::string why) {
    c.use = false;
    c.why = std::move(why);
    return c;
  };
  if (auto why = moe_decode_common::why_outside(s, "decode", kMaxM, kMaxSlots)) return no(*why);
  const int split = k_split_warps(ksplit) * 4 * 32;  // k of one step of every warp on an item
  if (s.hidden <= 0 || s.hidden % split != 0)
    return no(fmt::format("hidden = {} is not a multiple of {} ({} warp{} x 4 lanes x 32 k)", s.hidden, split,
                          split / 128, split == 128 ? "" : "s"));
  if (s.inter <= 0 || s.inter % kDownKr != 0 || s.inter % kGuIdx != 0)
    return no(fmt::format("inter = {} is not a multiple of {}", s.inter, kDownKr));
  const int want = std::min(s.m, kChunk);
  if (ksplit == KSplit::kTile) {
    // The most x rows per pass (up to min(m, 8)) that leave kTileMinBlocks blocks a multiprocessor (their
    // warps are what keeps the bytes in flight); else one.
    const int rows = moe_decode_common::most_x_rows(want, kTileMinBlocks, dev,
                                                    [&](int r) { return gate_up_tile_smem(s.hidden, r); });
    for (const KernelNeed& n : {need_gate_up_tile(s.hidden, rows), need_down_tile(s.m)})
      if (auto why = why_cannot_run(n, dev)) return no(*why);
    c.use = true;
    c.x_rows = rows;
    c.smem_gate_up = gate_up_tile_smem(s.hidden, rows);
    c.smem_down = down_tile_smem(s.m);
    // One block per (entry, 32 intermediate indices); blocks past the step's entries return at once.
    c.grid_gate_up = tile_max_entries(s, rows) * (s.inter / (2 * kGuIdx));
    c.grid_down = s.hidden / kDownRows;
    c.ring_why = "the cp.async ring runs the 8-warp kernels' split, not tile's";
    return c;
  }
  // gate_up: the most x rows per pass (up to min(m, 8)) that still let two blocks share a multiprocessor;
  // else the fewest rows in one block.
  const int rows =
      moe_decode_common::most_x_rows(want, 2, dev, [&](int r) { return gate_up_smem(s.hidden, r); });
  for (const KernelNeed& n : {need_gate_up(s.hidden, rows), need_down(s.m)})
    if (auto why = why_cannot_run(n, dev)) return no(*why);
  c.use = true;
  c.x_rows = rows;
  c.smem_gate_up = gate_up_smem(s.hidden, rows);
  c.smem_down = down_smem(s.m);
  const int fit = std::clamp(blocks_per_sm(c.smem_gate_up, dev), 1, 2);  // registers allow 2 of 256 threads
  c.grid_gate_up = (ksplit == KSplit::kWarp ? std::min(fit, kWholeMinBlocks) : fit) *
                   std::max(dev.multiprocessors, 1);  // persistent
  c.grid_down = s.hidden / kDownRows;                 // one block per row tile
  if (s.hidden % (kWarps * 4 * 32) != 0) {
    c.ring_why =
        fmt::format("the cp.async ring of moe_decode_gate_up_ring needs hidden a multiple of {}, not {}",
                    kWarps * 4 * 32, s.hidden);
    return c;
  }
  const RingFit gu = ring_fit(c.smem_gate_up, ring_step_bytes(kGuRingRows, kWarps), dev, 2);
  const RingFit dn = ring_fit(c.smem_down, ring_step_bytes(kDownRingRows, kDownWarps), dev, kDownMinBlocks);
  if (gu.depth == 0 || dn.depth == 0) {
    c.ring_why =
        fmt::format("the cp.async ring of {} needs {} bytes of shared memory per block but {} allows {}",
                    gu.depth == 0 ? "moe_decode_gate_up_ring" : "moe_decode_down_ring",
                    gu.depth == 0 ? c.smem_gate_up + kRingMinDepth * ring_step_bytes(kGuRingRows, kWarps)
                                  : c.smem_down + kRingMinDepth * ring_step_bytes(kDownRingRows, kDownWarps),
                    dev.name, dev.smem_per_block_optin);
    return c;
  }
  c.ring = true;
  c.ring_depth_gate_up = gu.depth;
  c.ring_depth_down = dn.depth;
  c.smem_gate_up_ring = gate_up_ring_smem(s.hidden, rows, gu.depth);
  c.smem_down_ring = down_ring_smem(s.m, dn.depth);
  c.grid_gate_up_ring = gu.blocks * std::max(dev.multiprocessors, 1);
  return c;
}

// half: true for the half variants' split, false for the 8-warp one.
inline Config choose_variant(const Shape& s, const DeviceLimits& dev, bool half) {
  return choose_variant(s, dev, half ? KSplit::kGroup : KSplit::kBlock);
}

inline Config choose(const Shape& s, const DeviceLimits& dev) {
  return choose_variant(s, dev, KSplit::kBlock);
}

}  // namespace ms::cuda::moe_decode_config
