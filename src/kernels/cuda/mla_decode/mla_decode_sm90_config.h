// Tile and split choice of the tensor-core MLA decode kernel (mla_decode_sm90.h), free of CUDA types so that
// its fit on a device is decided and tested without a GPU.
//
// A block owns one unit (a sequence with its 1-4 query tokens, or one token attending to its DSA selection),
// one group of heads and one split of the unit's keys. Its rows (the M dimension of the matrix products) are
// heads_per_block x query tokens, padded to 16 x row_groups. Keys go through shared memory 32 at a time in a
// ring of `stages` tiles.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::cuda {

namespace mla_sm90 {

constexpr int kDim = 576;             // latent 512 + rope 64: what a KV row holds and q is dotted with
constexpr int kLatent = 512;          // the value part and the output width
constexpr int kTileKeys = 32;         // keys per pipeline tile
constexpr int kThreads = 256;         // 8 warps
constexpr int kRowStride = kDim + 8;  // bf16 elements per shared row (1168 bytes: ldmatrix conflict-free)
constexpr int kMaxRows = 64;          // rows of one block: O of 64 rows x 512 f32 is half the register file
constexpr int kMaxSplits = 128;
constexpr int kMaxStages = 6;
constexpr int kScoreRows = 128;  // partial score rows: 8 warps / row groups k-shares x 16 rows each

// Shared memory of one block: q [rows][584] bf16, the bf16 tile an fp8 tile is widened into, the ring of raw
// tiles, partial scores [128][36] f32, P [rows][40] bf16, per-row state and the key metadata ring.
constexpr size_t smem_bytes(int rows, bool fp8, int stages) {
  const size_t q = size_t{2} * rows * kRowStride;
  const size_t conv = fp8 ? size_t{2} * kTileKeys * kRowStride : 0;
  const size_t stage = fp8 ? size_t{kTileKeys} * kDim : size_t{2} * kTileKeys * kRowStride;
  const size_t scores = size_t{4} * kScoreRows * (kTileKeys + 4);
  const size_t p = size_t{2} * rows * (kTileKeys + 8);
  const size_t rowstate = size_t{4} * 4 * kMaxRows;
  const size_t meta = size_t{8} * (stages + 1) * kTileKeys;
  return q + conv + stages * stage + scores + p + rowstate + meta + 64;
}

// The narrow kernel (fp8 pages, at most 32 rows: 8-32 heads, or fewer heads with several query tokens):
// the keys are the M of its products and the rows their N, so rows pad to 8 rather than 16, and the raw fp8
// rows are widened in registers on their way into the MMAs instead of into a widened copy of the tile.
constexpr int kNarrowKeys = 64;  // keys per step
constexpr int kNarrowRowBytes =
    kDim + 16;  // 592: a raw row in shared memory; ldmatrix of 8 rows hits 8 banks
constexpr int kNarrowMaxRows = 32;
constexpr int kNarrowQStride =
    2 * kDim + 64;  // bytes per row of q (1216; 16-byte loads of 8 lanes, no conflict)
constexpr int kNarrowPartStride = kNarrowKeys + 4;  // floats per row of a partial score tile
constexpr int kNarrowPStride = kNarrowKeys + 8;     // f16 per row of P (144 bytes: ldmatrix conflict-free)

// Shared memory of one narrow block with 8 * nt rows: q [rows][1216 B], the ring of raw tiles [64][592 B],
// the two k-halves' partial scores [2][rows][68] f32, P [rows][72] f16 and the correction [32] (twice each,
// by step parity, for the warp-specialised schedule `ws`), per-row state and the key metadata.
constexpr size_t narrow_smem_bytes(int nt, int stages, bool ws = false) {
  const size_t rows = size_t{8} * nt, bufs = ws ? 2 : 1;
  return rows * kNarrowQStride + size_t(stages) * kNarrowKeys * kNarrowRowBytes +
         bufs * (size_t{2} * rows * kNarrowPartStride * 4 + rows * kNarrowPStride * 2 +
                 size_t{4} * kNarrowMaxRows) +
         size_t{4} * 3 * kNarrowMaxRows + size_t{8} * (stages + 1) * kNarrowKeys + 64;
}

struct Config {
  int q_per_unit = 1;       // query tokens per unit (1 for DSA)
  int heads_per_block = 0;  // heads of one block; rows = heads_per_block * q_per_unit
  int row_groups = 0;       // 1, 2 or 4: rows padded to 16 * row_groups
  int narrow_nt = 0;        // > 0: the narrow kernel, rows padded to 8 * narrow_nt (1, 2 or 4)
  // The narrow kernel's warp-specialised schedule (16 warps: 0-7 scores and softmax, 8-15 P V and the
  // copies): one block a multiprocessor, a ring of 3+ steps.
  bool narrow_ws = false;
  int head_groups = 0;  // blocks along the heads
  int stages = 0;
  int blocks_per_sm = 0;  // what the shared memory and registers allow
  int units = 0;
  int max_splits = 0;  // grid = (max_splits, head_groups, units); the device plan uses up to this many
  // Fewest 32-key tiles in a split: a split writes rows x 512 f32 of partial output, so it must read several
  // times that in keys (rows / 8 tiles of fp8 keys = 2.25x) to be worth its partials.
  int min_tiles_per_split = 2;
  size_t smem = 0;
  size_t workspace = 0;  // partial outputs and log-sum-exps, bytes
};

inline size_t workspace_bytes(int units, int max_splits, int rows_per_unit) {
  const size_t n = size_t(units) * max_splits * rows_per_unit;
  return (n * kLatent * 4 + 255) / 256 * 256 + (n * 4 + 255) / 256 * 256;
}

// The narrow configuration c (c.narrow_nt > 0, made by choose for `heads` heads) on its warp-specialised
// schedule: one block a multiprocessor with the deepest ring of 3+ steps that fits, splits for one block a
// multiprocessor. narrow_nt = 0 where no such ring fits.
inline Config narrow_ws_of(Config c, int heads, const DeviceLimits& dev) {
  if (c.narrow_nt <= 0) return c;
  c.narrow_ws = true;
  c.blocks_per_sm = 1;
  c.stages = 0;
  for (int s = kMaxStages; s >= 3 && c.stages == 0; --s)
    if (narrow_smem_bytes(c.narrow_nt, s, true) <= dev.smem_per_block_optin) c.stages = s;
  if (c.stages == 0) {
    c.narrow_nt = 0;
    c.narrow_ws = false;
    return c;
  }
  c.smem = narrow_smem_bytes(c.narrow_nt, c.stages, true);
  c.max_splits = std::clamp(std::max(1, dev.multiprocessors) / (c.units * c.head_groups), 1, kMaxSplits);
  c.workspace = c.max_splits > 1 ? workspace_bytes(c.units, c.max_splits, c.q_per_unit * heads) : 0;
  return c;
}

// units: sequences (dense) or tokens (DSA); q_per_unit: query tokens of a unit. Returns heads_per_block = 0
// when nothing fits (the caller names the limit).
// The heads-per-block cap the launchers use. A DSA token reads at most topk_width keys, so with very few
// tokens the key range cannot be split finely enough to fill the GPU with 64-head blocks (each split must
// amortise its partial output); blocks of 16 heads give four times the blocks for the same keys (each head
// group reads them again, mostly from L2). Measured on an H200 (64 heads, top-2048 of 32k, fp8): batch 1
// took 44.5 us with 64-head blocks where 16 heads alone take 15.9 us; at batch 32, 16-head blocks took
// 119 us against 83 us with 64: so only a handful of tokens (about SMs / 32 per 64 heads) take 16.
inline int auto_heads_cap(bool dsa, int units, int heads, int multiprocessors) {
  return dsa && static_cast<long long>(units) * ((heads + 63) / 64) * 32 <= multiprocessors ? 16 : 64;
}

// max_heads_per_block (16, 32 or 64) caps the heads of one block below the 64 it would otherwise take.
// allow_narrow = false keeps fp8 launches of at most 32 rows on the kernel that widens whole tiles in shared
// memory (for comparison and timing).
inline Config choose(int units, int q_per_unit, int heads, bool fp8, const DeviceLimits& dev,
                     int max_heads_per_block = 64, bool allow_narrow = true) {
  Config c;
  c.q_per_unit = q_per_unit;
  c.units = units;
  if (units <= 0 || q_per_unit < 1 || q_per_unit > 4 || heads <= 0 || dev.arch < 80) return c;
  int hb = std::clamp(max_heads_per_block, 1, 64);
  while (hb > 1 && (hb * q_per_unit > kMaxRows || hb >= 2 * heads)) hb /= 2;
  const int rows = hb * q_per_unit;
  c.heads_per_block = hb;
  c.row_groups = rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
  c.head_groups = (heads + hb - 1) / hb;
  const int padded = 16 * c.row_groups;
  const int sms = std::max(1, dev.multiprocessors);
  // fp8 pages, at most 32 rows, hardware e4m3 conversions (sm_89+): the narrow kernel, two blocks a
  // multiprocessor when two rings of two stages fit (up to 16 rows), else one with the deepest ring that
  // fits.
  if (fp8 && allow_narrow && dev.arch >= 89 && rows <= kNarrowMaxRows) {
    const int nt = rows <= 8 ? 1 : rows <= 16 ? 2 : 4;
    for (int blocks : {2, 1}) {
      if (blocks == 2 && nt == 4) continue;  // 32 rows: built for one block (its O^T takes 64 registers)
      for (int s = kMaxStages; s >= 2 && c.stages == 0; --s)
        if (narrow_smem_bytes(nt, s) + (blocks == 2 ? 1024 : 0) <= dev.smem_per_block_optin / blocks) {
          c.stages = s;
          c.blocks_per_sm = blocks;
        }
      if (c.stages) break;
    }
    if (c.stages) {
      c.narrow_nt = nt;
      c.smem = narrow_smem_bytes(nt, c.stages);
      c.max_splits = std::clamp(sms * c.blocks_per_sm / (units * c.head_groups), 1, kMaxSplits);
      // A split writes rows x 512 f32 of partial output: at least 64 keys, and 4 x 32 keys from 32 rows on.
      c.min_tiles_per_split = std::max(2, nt);
      c.workspace = c.max_splits > 1 ? workspace_bytes(units, c.max_splits, q_per_unit * heads) : 0;
      // One block a multiprocessor (32 rows): the warp-specialised schedule, whose phases overlap (with
      // warps 0-3 and 4-7 it was 1.16-1.27x the one-block schedule at 32 heads, batch 32-64, on an H200).
      if (c.blocks_per_sm == 1) {
        const Config ws = narrow_ws_of(c, heads, dev);
        if (ws.narrow_nt > 0) return ws;
      }
      return c;
    }
  }
  // Two blocks per multiprocessor for 16 rows (the kernel is built for two within the register file there)
  // when two rings of two stages fit; else one block with the deepest ring that fits.
  c.stages = 0;
  if (c.row_groups == 1) {
    for (int s = kMaxStages; s >= 2; --s)
      if (smem_bytes(padded, fp8, s) + 1024 <= dev.smem_per_block_optin / 2) {
        c.stages = s;
        c.blocks_per_sm = 2;
        break;
      }
  }
  if (c.stages == 0)
    for (int s = kMaxStages; s >= 2; --s)
      if (smem_bytes(padded, fp8, s) <= dev.smem_per_block_optin) {
        c.stages = s;
        c.blocks_per_sm = 1;
        break;
      }
  if (c.stages == 0) {
    c.heads_per_block = 0;
    c.smem = smem_bytes(padded, fp8, 2);
    return c;
  }
  c.smem = smem_bytes(padded, fp8, c.stages);
  // One wave: at most as many blocks as the multiprocessors hold at once (a second, partial wave of splits
  // would cost a whole split's time for a few blocks).
  const int slots = std::max(1, dev.multiprocessors) * c.blocks_per_sm;
  const int base = units * c.head_groups;
  c.max_splits = std::clamp(slots / base, 1, kMaxSplits);
  c.min_tiles_per_split = std::max(2, padded / 8);
  c.workspace = c.max_splits > 1 ? workspace_bytes(units, c.max_splits, q_per_unit * heads) : 0;
  return c;
}

// The smallest configuration (16 rows, two stages, the larger of fp8 and bf16): what `moeserve backends`
// judges a device by; mla_attention_choose checks each shape's own configuration.
inline KernelNeed need() {
  return {"mla_decode_sm90 (tensor cores, 512 + 64 wide)",
          std::max(smem_bytes(16, true, 2), smem_bytes(16, false, 2)), 80, false};
}

}  // namespace mla_sm90
}  // namespace ms::cuda
