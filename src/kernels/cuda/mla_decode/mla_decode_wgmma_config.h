// Tile, split and shared-memory choice of the warpgroup-MMA MLA decode kernel (mla_decode_wgmma.h), free of
// CUDA types so that its fit on a device is decided and tested without a GPU (and listed by `moeserve
// backends`).
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90_config.h"

namespace ms::cuda {

namespace mla_wgmma {

constexpr int kDim = 576;      // latent 512 + rope 64
constexpr int kLatent = 512;   // the value part and the output width
constexpr int kRows = 64;      // query rows of one block (the M of every wgmma)
constexpr int kTileKeys = 64;  // keys per pipeline tile (the N of S, the K of P V)
constexpr int kThreads = 384;  // two consumer warpgroups + the producer warpgroup (one warp of it copies)
constexpr int kMaxSplits = 128;

constexpr size_t kQBytes = size_t{2} * kRows * kDim;      // Q [64][576] f16
constexpr size_t kKBytes = size_t{2} * kTileKeys * kDim;  // a widened key tile [64][576] f16
constexpr size_t kRawBytes = size_t{kTileKeys} * kDim;    // a raw fp8 tile [64][576]

// Shared memory (bytes, from a 1024-aligned base; the seesaw schedule, mla_decode_wgmma.cu): Q [64][576] f16
// and one key tile buffer a consumer warpgroup (B0, B1: [64 keys][576] f16 each, swizzled, laid out as
// mla_decode_wgmma.cu says), the raw fp8 tile landing in the first 36,864 bytes of its buffer and widened
// there in place (no separate ring: Q + two widened tiles are 221,184 of the 232,448 bytes, a raw stage would
// need 36,864 more); the P exchange [4 k steps][128 threads][4] f16x2; the published row maxima [2][64] f32;
// row positions [64]; 6 mbarriers.
//   Q 73,728 + B0 73,728 + B1 73,728 + P 8,192 + maxima 512 + positions 256 + barriers 48 + reduction 64
//   = 230,256, + 1,024 to align the base = 231,280 <= 232,448.
constexpr size_t kSwOffB0 = kQBytes;
constexpr size_t kSwOffB1 = kSwOffB0 + kKBytes;
constexpr size_t kSwOffPx = kSwOffB1 + kKBytes;
constexpr size_t kSwPxBytes = size_t{4} * 128 * 16;
constexpr size_t kSwOffRowMax = kSwOffPx + kSwPxBytes;
constexpr size_t kSwOffRowPos = kSwOffRowMax + size_t{4} * 2 * kRows;
constexpr size_t kSwOffBars = kSwOffRowPos + size_t{4} * kRows;
constexpr size_t kSwOffRed = kSwOffBars + size_t{8} * 6;
constexpr size_t kSeesawSmemBytes = kSwOffRed + 64 + 1024;
static_assert(kRawBytes <= 5 * size_t{64} * 128, "the raw tile lands in the first 5 blocks of its buffer");

// The block's dynamic shared memory.
constexpr size_t kSmemBytes = kSeesawSmemBytes;

struct Config {
  int q_per_unit = 1;       // query tokens per sequence
  int heads_per_block = 0;  // 0: the kernel does not apply; rows = heads_per_block * q_per_unit <= 64
  int head_groups = 0;
  int units = 0;       // sequences
  int max_splits = 0;  // grid = (max_splits, head_groups, units)
  // Fewest 64-key tiles in a split. It binds only where the grid has more splits than the longest sequence
  // has tiles per split (short contexts, few sequences: the machine would idle); 2 against 4 measured on an
  // H200 at 64 heads: batch 1 x 512 keys 23.8 -> 17.8 us, 1 x 4k 25.3 -> 21.9, 8 x 512 24.4 -> 18.7, the
  // rest unchanged; 1 was faster at 512 keys (17.0) but slower at 4k (24.5), where 64 splits' partial
  // outputs (128 KB of f32 each, against a tile's 36 KB of keys) and their combine cost more than they save.
  int min_tiles_per_split = 2;
  size_t smem = kSmemBytes;
  size_t workspace = 0;  // partial outputs and log-sum-exps (mla_sm90::workspace_bytes layout), bytes
};

// sm_90a only (wgmma, bulk copies), about 226 KB of shared memory.
inline KernelNeed need() {
  return {"mla_decode_wgmma (sm_90a warpgroup MMA, fp8 pages)", kSmemBytes, 90, true};
}

// heads_per_block = 0 when the kernel does not apply (not sm_90, q_per_seq outside 1..4, no room).
inline Config choose(int n_seqs, int q_per_seq, int heads, const DeviceLimits& dev) {
  Config c;
  c.q_per_unit = q_per_seq;
  c.units = n_seqs;
  if (n_seqs <= 0 || q_per_seq < 1 || q_per_seq > 4 || heads <= 0 || dev.arch != 90 ||
      kSmemBytes > dev.smem_per_block_optin)
    return c;
  int hb = 64;
  while (hb > 1 && (hb * q_per_seq > kRows || hb >= 2 * heads)) hb /= 2;
  c.heads_per_block = hb;
  c.head_groups = (heads + hb - 1) / hb;
  const int base = n_seqs * c.head_groups;
  c.max_splits = std::clamp(std::max(1, dev.multiprocessors) / base, 1, kMaxSplits);
  c.workspace = c.max_splits > 1 ? mla_sm90::workspace_bytes(n_seqs, c.max_splits, q_per_seq * heads) : 0;
  return c;
}

}  // namespace mla_wgmma

}  // namespace ms::cuda
