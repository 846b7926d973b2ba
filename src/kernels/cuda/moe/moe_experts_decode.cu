// Register-streamed NVFP4 experts for decode (see moe_experts_decode.h).
//
// Warp tile: 16 weight rows x one k-range, mma.sync m16n8k16 in f16 (weights as A, up to 8 positions as the
// n8 B tile, f32 accumulation). Lane (g = lane / 4, t = lane % 4) owns rows g and g + 8; a step of the warp
// covers 128 k of its range, of which lane t takes the 32 k from 32 t: one 16-byte load per row (bytes of k
// .. k + 31, so the four lanes of a quad read 64 contiguous bytes of the row: whole 32-byte sectors per load
// instruction) and one 2-byte load of the row's two e4m3 scales. The k order inside a lane's 32 is permuted
// (a dot product does not care), identically for A and B: word j2 (0..3) of a row's 16 bytes holds the codes
// of its k + 8 j2 .. + 7 (code i in bits 4 i .. 4 i + 3); mma 2 j2 takes codes (0, 2) as a0 / a1 and (1, 3)
// as a2 / a3 (rows g / g + 8), mma 2 j2 + 1 codes (4, 6) and (5, 7), and B of both is the position's 8
// values in the order x0 x2 x1 x3 x4 x6 x5 x7 (moe_decode_math.cuh: b_order), one 16-byte piece.
// Decode (moe_decode_math.cuh): seven integer operations turn a word's eight e2m1 codes into e4m3 bytes of
// the same values x 2^-6, one hardware conversion per pair gives exact f16, one f16 multiply by the row's
// e4m3 scale keeps it exact (subnormal scales included; the scale must multiply A: the four lanes of a quad
// feed one mma from four different 16-k groups). No shared-memory table, no staging of weights and no barrier
// inside a work item's k loop; each lane keeps kGuUnroll steps (gate_up: 3 x 4 rows x 16 bytes, each register
// slot reloaded right after its math, the next item's first steps loaded before this item's epilogue) or the
// next piece (down: 4 x 2 rows x 16 bytes, one piece ahead of the math in a second register buffer) in
// flight.
//
// gate_up: work item = (expert chunk of <= x_rows positions, 16 indices = 16 gate + 16 up rows); block b of
// the persistent grid takes a contiguous run of items (so consecutive tiles of one chunk reuse its staged x
// rows). Warp w takes k [w H / 8, (w + 1) H / 8) of both tiles (one B fragment feeds both). The chunk's x
// rows are staged as f16 in shared memory (moe_decode_config.h: xs layout) while the first weight loads are
// in flight; warps' partial sums meet in shared memory in warp order. down: block = 16 output rows; pieces
// (expert chunk of <= 8 positions, k-range of 512) in ascending order, warp w takes a contiguous run of them
// and keeps its sum in registers while the chunk stays the same; at a chunk change it adds the chunk's rows x
// down_scale2 into its own tile out_w[warp][token][16] (positions in order); the block then sums the 8 tiles
// in warp order and adds to out once.
//
// Variants of both register kernels (template V, moe_experts_decode.h: MoeDecodeVariant), same work split:
// acc2 feeds the two mmas of every weight word into two accumulator sets (set 0 + set 1 at the end of a
// gate_up item, at a down warp's chunk flush); sc8 has lane t of a quad load the quad's 8 scale bytes of step
// 4 b + t per row and swaps them into each lane's own 2 bytes of steps 4 b .. 4 b + 3 (moe_decode_math.cuh:
// quad_scales). To stay within gate_up's 128 registers without spills the variants address rows g + 8 from
// rows g, sc8 finds its scale rows again from the expert table at each 8-byte load, and acc2sc8 reads its B
// pieces one at a time. The half variants have a gate_up kernel of their own (described at it: two groups of
// 4 warps on two items at a time) and run the down kernel of base (half) or sc8 (halfsc8).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/common/cp_async.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/moe/moe_decode_math.cuh"
#include "kernels/cuda/moe/moe_device_common.cuh"
#include "kernels/cuda/moe/moe_experts_decode.h"

namespace ms::cuda {
namespace {

using namespace moe_decode_config;

using dev::ld_stream16;
using dev::ld_stream2;
using dev::ld_stream8;
using moe_decode_dev::b_order;
using moe_decode_dev::kCodeScale;
using moe_decode_dev::tile_step;
using moe_decode_dev::tile_step_split;

// ---- gate_up --------------------------------------------------------------------------------------------

// An item's epilogue (8-warp kernels): the warps' sums of the gate tile acc_g and the up tile acc_u (C
// fragments: rows g / g + 8, positions 2t / 2t + 1) meet in red [warp][gate / up][position][16 rows], then
// thread (position r, index i) writes act = silu(gate) x up x routing weight of its position.
__device__ __forceinline__ void gate_up_epilogue(const MoeExpertsParams& p, float* red,
                                                 const float (&acc_g)[4], const float (&acc_u)[4],
                                                 const MoeExpertWeights& ew, int pos0, int rows, int tile,
                                                 uint16_t* acth, int warp, int g, int t) {
  const int tid = threadIdx.x;
  float* rw = red + warp * 2 * kChunk * 16;
  moe_dev::store_c_tile(rw, acc_g, g, t);
  moe_dev::store_c_tile(rw + kChunk * 16, acc_u, g, t);
  __syncthreads();  // also: every warp is done reading xs, so the next item may restage it
  if (tid < rows * 16) {
    const int r = tid >> 4, i = tid & 15;
    const float2 sums = moe_dev::sum_gate_up_tiles<kWarps, kChunk>(red, r, i);
    const float gs = sums.x, us = sums.y;
    const float gv = gs * (ew.gate_scale2 * kCodeScale), uv = us * (ew.up_scale2 * kCodeScale);
    const float wt = p.topk_weights[p.sorted_slots[pos0 + r]];
    const float v = gv / (1.0f + expf(-gv)) * uv * wt;
    // act in f16 (saturated), each 4 in B order: down's 16-byte B pieces come straight from global memory.
    acth[static_cast<int64_t>(pos0 + r) * p.inter + tile * kGuIdx + b_order(i)] = tc::f16_sat_bits(v);
  }
}

// sc8 (both gate_up kernels): lane t's 8 bytes of a scale block (those of step 4 b + t of the quad) of rows
// gate g, gate g + 8, up g, up g + 8 (srow8 bytes below g) into raw, from `off` bytes into the expert's
// gate / up scales; zeros where step 4 b + t is past the item's last (`have` false).
template <typename Off>
__device__ __forceinline__ void load_quad_block(uint2 (&raw)[4], const MoeExpertWeights& ew, Off off,
                                                int srow8, bool have) {
  const uint8_t* gs = static_cast<const uint8_t*>(ew.gate_scale) + off;
  const uint8_t* us = static_cast<const uint8_t*>(ew.up_scale) + off;
#pragma unroll
  for (int r = 0; r < 4; ++r)
    raw[r] = have ? ld_stream8((r < 2 ? gs : us) + (r & 1) * srow8) : make_uint2(0u, 0u);
}

// sc8, step v of the unrolled loop (v % 4: the step's place in its scale block): at a block's first step the
// quad's bytes in raw become each lane's own 2 bytes of its 4 steps in quad (quad_scales; every lane of the
// warp runs the same steps, so the shuffles see all 32), at its second the next block goes in flight
// (load_next), and every step takes its rows' scales scs from quad.
template <typename LoadNext>
__device__ __forceinline__ void sc8_step_scales(uint2 (&quad)[4], const uint2 (&raw)[4], uint32_t (&scs)[4],
                                                int v, int t, LoadNext&& load_next) {
  if (v % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) quad[r] = moe_decode_dev::quad_scales(raw[r], t);
  }
  if (v % 4 == 1) load_next();
#pragma unroll
  for (int r = 0; r < 4; ++r) scs[r] = moe_decode_dev::quad_scale_of(quad[r], v % 4);
}

// V: MoeDecodeVariant (moe_experts_decode.h); base (0) is the code path described above.
template <int V>
__global__ void __launch_bounds__(kThreads, 2)
    moe_decode_gate_up_kernel(const MoeExpertsParams p, int x_rows) {
  constexpr bool kAcc2 = (V & kMoeDecodeAcc2) != 0, kSc8 = (V & kMoeDecodeSc8) != 0;
  constexpr int kSets = kAcc2 ? 2 : 1;
  extern __shared__ __align__(16) uint8_t smem[];
  const int H = p.hidden;
  const int64_t xld = xs_ld(H);
  __half* xs;
  float* red;
  int32_t* ec;
  moe_dev::carve_gate_up(smem, x_rows, xld, xs, red, ec);
  __shared__ int s_nec;

  moe_dev::build_ec<kMaxEc>(p, x_rows, ec, &s_nec);
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tiles = p.inter / kGuIdx;
  const int items = s_nec * tiles;
  const int steps = H / 1024;  // 128-k steps of a warp's eighth of k
  // Step s of lane (g, t) covers k [k_lane + 128 s, + 32) with k_lane = warp H / 8 + 32 t: the four lanes of
  // a quad read 64 contiguous weight bytes of their row per step.
  const int k_lane = warp * (H / 8) + 32 * t;
  const int64_t row_bytes = H / 2, srow_bytes = H / 16;
  // The lane's B row (x row g), at its 64-byte group k_lane / 32; pieces are swizzled by bit 1 of the group
  // index, which is t >> 1 for every step (H / 256 and 4 s are multiples of 4).
  const __half* xs_lane = xs + g * xld + k_lane;
  const int sw = (t >> 1) & 1;
  uint16_t* acth = reinterpret_cast<uint16_t*>(p.act);
  // Block b takes the contiguous items [it0, it1): consecutive tiles of one (expert, chunk) share the staged
  // x rows.
  const int it0 = moe_dev::run_start(items, blockIdx.x, gridDim.x);
  const int it1 = moe_dev::run_start(items, blockIdx.x + 1, gridDim.x);

  // The weights of the item being loaded: rows gate g, gate g + 8, up g, up g + 8 from the lane's k.
  // The variants keep one pointer per matrix (rows g; rows g + 8 at a 32-bit offset), and sc8 none for the
  // scales (it finds them again from the expert table once every 4 steps): registers for their extra
  // accumulators or scale words under the 128 that two blocks a multiprocessor allow.
  constexpr bool kSlim = V != kMoeDecodeBase;
  constexpr int kPtrs = kSlim ? 2 : 4;
  const int row8 = 8 * (H / 2), srow8 = 8 * (H / 16);
  const uint8_t* wp[kPtrs];
  const uint8_t* sp[kSc8 ? 1 : kPtrs];
  auto point = [&](int item) {
    const MoeExpertWeights& ew = p.experts[ec[item / tiles] & 1023];
    const int64_t idx = static_cast<int64_t>(item % tiles) * kGuIdx + g;
#pragma unroll
    for (int r = 0; r < kPtrs; ++r) {
      const bool gate = kSlim ? r == 0 : r < 2;
      const int64_t row = idx + (kSlim ? 0 : (r & 1) * 8);
      wp[r] = static_cast<const uint8_t*>(gate ? ew.gate : ew.up) + row * row_bytes + k_lane / 2;
      if constexpr (!kSc8)
        sp[r] =
            static_cast<const uint8_t*>(gate ? ew.gate_scale : ew.up_scale) + row * srow_bytes + k_lane / 16;
    }
  };
  // Rows gate g, gate g + 8, up g, up g + 8 (r = 0..3).
  auto wrow = [&](int r) { return kSlim ? wp[r >> 1] + (r & 1) * row8 : wp[r]; };
  // Register slot u holds the steps s with s % kGuUnroll == u; a slot is reloaded with step s + kGuUnroll
  // right after step s's math, and an item's first kGuUnroll steps are loaded before the previous item's
  // epilogue (the first item's before its x rows are staged), so a lane's loads stay in flight across steps
  // and items instead of arriving in bursts.
  uint4 w[kGuUnroll][4];
  uint32_t sc[kSc8 ? 1 : kGuUnroll][4];
  auto load = [&](int s, int u) {
    if (s < steps) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        w[u][r] = ld_stream16(wrow(r) + s * 64);
        if constexpr (!kSc8) sc[u][r] = ld_stream2((kSlim ? sp[r >> 1] + (r & 1) * srow8 : sp[r]) + s * 8);
      }
    }
  };
  // sc8: raw[r] holds the 8 bytes lane t loaded for steps 4 b .. 4 b + 3 (those of step 4 b + t, the whole
  // quad's), quad[r] the lane's own 2 bytes of each of them after the exchange (quad_scales). Block b + 1 is
  // loaded at step 4 b + 1, 3 steps ahead of its use like the weights' slots (and the steps of quad
  // already used free registers for it: no spills under 128 with acc2), an item's block 0 with its first
  // weights.
  uint2 raw[kSc8 ? 4 : 1], quad[kSc8 ? 4 : 1];
  auto load_scales = [&](int item, int b) {
    if constexpr (kSc8) {
      if (4 * b < steps) {
        const bool have = 4 * b + t < steps;
        const MoeExpertWeights& ew = p.experts[ec[item / tiles] & 1023];
        // The quad's scale bytes of row g start at (k_lane - 32 t) / 16; lane t reads those of step 4 b + t.
        const int64_t off =
            (static_cast<int64_t>(item % tiles) * kGuIdx + g) * srow_bytes + k_lane / 16 + 6 * t + 32 * b;
        load_quad_block(raw, ew, off, srow8, have);
      }
    }
  };
  // The first steps of item i go in flight (sc8: the previous item's last block was exchanged at its first
  // step).
  auto start = [&](int i) {
    point(i);
#pragma unroll
    for (int u = 0; u < kGuUnroll; ++u) load(u, u);
    load_scales(i, 0);
  };
  if (it0 < it1) start(it0);
  int staged = -1;  // the work-list entry whose x rows xs holds
  for (int item = it0; item < it1; ++item) {
    const int eci = item / tiles;
    const int code = ec[eci];
    const int e = code & 1023, chunk = code >> 10, tile = item % tiles;
    const int count = p.expert_counts[e], off = p.expert_offsets[e];
    const int rows = min(x_rows, count - chunk * x_rows);
    const int pos0 = off + chunk * x_rows;
    const MoeExpertWeights& ew = p.experts[e];
    if (eci != staged) {
      moe_decode_dev::stage_x_rows(p, pos0, rows, xs, xld, tid, kThreads);
      staged = eci;
    }
    __syncthreads();
    const __half* xb = xs_lane - (g - moe_dev::b_row(g, rows)) * xld;  // b_row: no branch per load
    float acc[kSets][2][4] = {};
    // sc8 unrolls 12 steps (the register slots' 3 times the scale blocks' 4): slot and place in the block
    // are then known at compile time.
    constexpr int kLoop = kSc8 ? 12 : kGuUnroll;
    for (int s0 = 0; s0 < steps; s0 += kLoop) {
#pragma unroll
      for (int v = 0; v < kLoop; ++v) {
        const int u = v % kGuUnroll, s = s0 + v;
        if (s >= steps) break;
        uint4 b[4];
#pragma unroll
        for (int j2 = 0; j2 < 4; ++j2) b[j2] = *reinterpret_cast<const uint4*>(xb + s * 128 + 8 * (j2 ^ sw));
        uint32_t scs[4];
        if constexpr (kSc8) {
          sc8_step_scales(quad, raw, scs, v, t, [&] { load_scales(item, (s >> 2) + 1); });
        } else {
#pragma unroll
          for (int r = 0; r < 4; ++r) scs[r] = sc[u][r];
        }
        if constexpr (kAcc2 && kSc8) {
          // One B piece at a time for both tiles (its 4 registers instead of all 16 of the step live).
#pragma unroll
          for (int j2 = 0; j2 < 4; ++j2) {
            const uint4 bj = *reinterpret_cast<const uint4*>(xb + s * 128 + 8 * (j2 ^ sw));
            moe_decode_dev::word_step_split(acc[0][0], acc[1][0], w[u][0], w[u][1], scs[0], scs[1], j2, bj);
            moe_decode_dev::word_step_split(acc[0][1], acc[1][1], w[u][2], w[u][3], scs[2], scs[3], j2, bj);
          }
        } else if constexpr (kAcc2) {
          tile_step_split(acc[0][0], acc[1][0], w[u][0], w[u][1], scs[0], scs[1], b);
          tile_step_split(acc[0][1], acc[1][1], w[u][2], w[u][3], scs[2], scs[3], b);
        } else {
          tile_step(acc[0][0], w[u][0], w[u][1], scs[0], scs[1], b);
          tile_step(acc[0][1], w[u][2], w[u][3], scs[2], scs[3], b);
        }
        load(s + kGuUnroll, u);  // the slot's next step goes in flight behind this one's math
      }
    }
    // Every slot is free: the next item's first steps go in flight now.
    if (item + 1 < it1) start(item + 1);
    if constexpr (kAcc2) {  // the sets meet in a fixed order: set 0 + set 1
#pragma unroll
      for (int tl = 0; tl < 2; ++tl)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][tl][i] += acc[1][tl][i];
    }
    gate_up_epilogue(p, red, acc[0][0], acc[0][1], ew, pos0, rows, tile, acth, warp, g, t);
    // red is rewritten only after the next item's staging barrier, which every reader above has passed.
  }
}

// ---- gate_up, whole variant ------------------------------------------------------------------------------
//
// Each warp takes whole work items (all of k of its 16 gate and 16 up rows: H / 128 steps) and writes the
// item's act from its own C fragments: no partial sums across warps, no barrier per item. Work is handed out
// in units of 8 consecutive tiles of one work-list entry, one a warp, a contiguous run of units a block, so
// every warp of a block is always on the same entry: the block restages xs only where the entry changes (two
// __syncthreads), and no warp's item waits behind another entry's items. Each warp's next item has its first
// steps in flight before the previous item's epilogue and before any restaging. Lane (g, t)
// streams k [32 t + 128 s, + 32) of rows gate g, gate g + 8, up g, up g + 8 (the quad reads 64 contiguous
// bytes of a row), its two scale bytes a row and step by a 2-byte load, kWholeSlots steps in flight (one
// block a multiprocessor, whose registers allow twice the 8-warp kernel's slots). On an H200 with GLM-5's
// experts (docs/PERFORMANCE.md): 7-15% faster than halfsc8 at 8 and 32 tokens, 20% slower than sc8 at one.
__global__ void __launch_bounds__(kThreads, kWholeMinBlocks)
    moe_decode_gate_up_whole_kernel(const MoeExpertsParams p, int x_rows) {
  constexpr int kSlots = kWholeSlots;
  extern __shared__ __align__(16) uint8_t smem[];
  const int H = p.hidden;
  const int64_t xld = xs_ld(H);
  __half* xs;
  float* red;
  int32_t* ec;
  moe_dev::carve_gate_up(smem, x_rows, xld, xs, red, ec);
  __shared__ int s_nec;

  moe_dev::build_ec<kMaxEc>(p, x_rows, ec, &s_nec);
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tiles = p.inter / kGuIdx;
  const int steps = H / 128;
  const int64_t row_bytes = H / 2, srow_bytes = H / 16;
  // The lane's B row (x row g) at its 64-byte group t + 4 s: the pieces' swizzle bit is t >> 1 every step.
  const __half* xs_lane = xs + g * xld + 32 * t;
  const int sw = (t >> 1) & 1;
  uint16_t* acth = reinterpret_cast<uint16_t*>(p.act);
  // Units of work: kWarps consecutive tiles of one work-list entry, one a warp (the last unit of an entry may
  // hold fewer); block b takes a contiguous run of units.
  const int unit_tiles = (tiles + kWarps - 1) / kWarps;  // units an entry
  const int units = s_nec * unit_tiles;
  const int u0 = moe_dev::run_start(units, blockIdx.x, gridDim.x);
  const int u1 = moe_dev::run_start(units, blockIdx.x + 1, gridDim.x);
  // This warp's tile in unit u (tiles when it has none there).
  auto tile_of = [&](int u) { return min((u % unit_tiles) * kWarps + warp, tiles); };

  // Rows gate g and up g of the item being loaded, from the lane's k (rows g + 8 at a 32-bit offset: two
  // pointers fewer keep the kernel within its 128 registers).
  const int row8 = 8 * (H / 2), srow8 = 8 * (H / 16);
  const uint8_t* wp[2];
  const uint8_t* sp[2];
  auto point = [&](int eci, int tile) {
    const MoeExpertWeights& ew = p.experts[ec[eci] & 1023];
    const int64_t row = static_cast<int64_t>(tile) * kGuIdx + g;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      wp[r] = static_cast<const uint8_t*>(r == 0 ? ew.gate : ew.up) + row * row_bytes + 16 * t;
      sp[r] = static_cast<const uint8_t*>(r == 0 ? ew.gate_scale : ew.up_scale) + row * srow_bytes + 2 * t;
    }
  };
  // Rows gate g, gate g + 8, up g, up g + 8 (r = 0..3).
  uint4 w[kSlots][4];
  uint32_t sc[kSlots][4];
  auto load = [&](int s, int u) {
    if (s < steps) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        w[u][r] = ld_stream16(wp[r >> 1] + (r & 1) * row8 + s * 64);
        sc[u][r] = ld_stream2(sp[r >> 1] + (r & 1) * srow8 + s * 8);
      }
    }
  };
  // The first steps of this warp's item in unit u go in flight (none where it has no tile there).
  auto start = [&](int u) {
    const int tile = tile_of(u);
    if (tile >= tiles) return;
    point(u / unit_tiles, tile);
#pragma unroll
    for (int v = 0; v < kSlots; ++v) load(v, v);
  };
  if (u0 < u1) start(u0);
  int staged = -1;        // the work-list entry whose x rows xs holds
  moe_dev::EcEntry en{};  // and its expert and positions
  for (int un = u0; un < u1; ++un) {
    const int eci = un / unit_tiles, tile = tile_of(un);
    if (eci != staged) {
      // Every warp of the block is on the same unit, so none waits here behind another entry's items.
      en = moe_dev::ec_entry(p, ec[eci], x_rows);
      __syncthreads();  // every warp is done with the previous entry's x rows
      moe_decode_dev::stage_x_rows<4>(p, en.pos0, en.rows, xs, xld, tid, kThreads);
      __syncthreads();
      staged = eci;
    }
    if (tile >= tiles) continue;
    const __half* xb = xs_lane - (g - moe_dev::b_row(g, en.rows)) * xld;  // b_row: no branch per load
    float acc[2][4] = {};
    for (int s0 = 0; s0 < steps; s0 += kSlots) {
#pragma unroll
      for (int u = 0; u < kSlots; ++u) {
        const int s = s0 + u;
        if (s >= steps) break;
        uint4 b[4];
#pragma unroll
        for (int j2 = 0; j2 < 4; ++j2) b[j2] = *reinterpret_cast<const uint4*>(xb + s * 128 + 8 * (j2 ^ sw));
        tile_step(acc[0], w[u][0], w[u][1], sc[u][0], sc[u][1], b);
        tile_step(acc[1], w[u][2], w[u][3], sc[u][2], sc[u][3], b);
        load(s + kSlots, u);  // the slot's next step goes in flight behind this one's math
      }
    }
    if (un + 1 < u1) start(un + 1);  // in flight behind this item's epilogue
    // The warp's C fragments are the item's whole sums: c = 0, 1 rows g at positions 2 t, 2 t + 1; c = 2, 3
    // rows g + 8.
    const MoeExpertWeights& ew = p.experts[en.e];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 2 * t + (c & 1), i = g + 8 * (c >> 1);
      if (r < en.rows) {
        const float gv = acc[0][c] * (ew.gate_scale2 * kCodeScale);
        const float uv = acc[1][c] * (ew.up_scale2 * kCodeScale);
        const float wt = p.topk_weights[p.sorted_slots[en.pos0 + r]];
        const float v = gv / (1.0f + expf(-gv)) * uv * wt;
        acth[static_cast<int64_t>(en.pos0 + r) * p.inter + tile * kGuIdx + b_order(i)] = tc::f16_sat_bits(v);
      }
    }
  }
}

// ---- gate_up, tile variant -------------------------------------------------------------------------------
//
// Block b (4 warps) takes work-list entry b / pairs and its intermediate indices 32 (b % pairs) .. + 31:
// warp w the 16-row tile 2 (b % pairs) + w / 2 of gate (w even) or up (w odd), all of k. The entry is found
// by a scan of the expert counts (find_ec: no list is kept), blocks past the step's entries return, the
// first kTileDepth steps go in flight before the entry's x rows are staged, and after the k loop the four
// warps' C fragments meet in red behind one barrier for the act of both index tiles. Lane (g, t) streams k
// [32 t + 128 s, + 32) of rows g and g + 8 of its tile (the quad reads 64 contiguous bytes of a row) and the
// rows' 2 scale bytes a step.
__global__ void __launch_bounds__(kTileThreads, kTileMinBlocks)
    moe_decode_gate_up_tile_kernel(const MoeExpertsParams p, int x_rows) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int H = p.hidden;
  const int64_t xld = xs_ld(H);
  __half* xs = reinterpret_cast<__half*>(smem);
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(x_rows) * xld * 2);
  __shared__ int s_code, s_n;
  const int pairs = p.inter / (2 * kGuIdx);
  const int want = static_cast<int>(blockIdx.x) / pairs, pair = static_cast<int>(blockIdx.x) - want * pairs;
  if (threadIdx.x < 32) moe_dev::find_ec(p, x_rows, want, &s_code, &s_n);
  __syncthreads();
  if (want >= s_n) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const moe_dev::EcEntry en = moe_dev::ec_entry(p, s_code, x_rows);
  const MoeExpertWeights& ew = p.experts[en.e];
  const bool up = (warp & 1) != 0;
  const int64_t row = static_cast<int64_t>(2 * pair + (warp >> 1)) * kGuIdx + g;
  const int64_t row_bytes = H / 2, srow_bytes = H / 16;
  const uint8_t* wp = static_cast<const uint8_t*>(up ? ew.up : ew.gate) + row * row_bytes + 16 * t;
  const uint8_t* sp =
      static_cast<const uint8_t*>(up ? ew.up_scale : ew.gate_scale) + row * srow_bytes + 2 * t;
  const int64_t row8 = 8 * row_bytes, srow8 = 8 * srow_bytes;
  const int steps = H / 128;
  uint4 w[kTileDepth][2];
  uint32_t sc[kTileDepth][2];
  // Step s of rows g / g + 8 from the cursors wq (weights) and sq (scales), which advance by a group of
  // kTileDepth steps at a time: inside a group the offsets are compile-time constants.
  const uint8_t* wq = wp;
  const uint8_t* sq = sp;
  auto load_at = [&](int u, int ahead) {  // step (group + ahead) x kTileDepth + u into slot u
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      w[u][r] = ld_stream16(wq + r * row8 + (ahead * kTileDepth + u) * 64);
      sc[u][r] = ld_stream2(sq + r * srow8 + (ahead * kTileDepth + u) * 8);
    }
  };
  auto load = [&](int s, int u) {
    if (s < steps) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        w[u][r] = ld_stream16(wp + r * row8 + s * 64);
        sc[u][r] = ld_stream2(sp + r * srow8 + s * 8);
      }
    }
  };
#pragma unroll
  for (int u = 0; u < kTileDepth; ++u) load(u, u);
  moe_decode_dev::stage_x_rows<4>(p, en.pos0, en.rows, xs, xld, tid, kTileThreads);
  __syncthreads();
  // The lane's B row (x row g) at its 64-byte group t + 4 s: the pieces' swizzle bit is t >> 1 every step.
  const __half* xs_lane = xs + g * xld + 32 * t;
  const int sw = (t >> 1) & 1;
  const __half* xb = xs_lane - (g - moe_dev::b_row(g, en.rows)) * xld;  // b_row: no branch per load
  float acc[4] = {};
  // Step u of the slots with B from xq: tile_step's mmas in its order, one B piece at a time (4 registers of
  // it live instead of 16).
  auto step = [&](int u, const __half* xq) {
    const uint32_t s0 = moe_decode_dev::scales_f16x2(sc[u][0]), s1 = moe_decode_dev::scales_f16x2(sc[u][1]);
#pragma unroll
    for (int j2 = 0; j2 < 4; ++j2) {
      const uint4 bj = *reinterpret_cast<const uint4*>(xq + 8 * (j2 ^ sw));
      moe_decode_dev::word_mmas(acc, acc, w[u][0], w[u][1], s0, s1, j2, bj);
    }
  };
  // Whole groups whose next group exists: no guards, cursors advanced once a group.
  int s0 = 0;
  for (; s0 + 2 * kTileDepth <= steps; s0 += kTileDepth) {
#pragma unroll
    for (int u = 0; u < kTileDepth; ++u) {
      step(u, xb + (s0 + u) * 128);
      load_at(u, 1);  // the slot's next step goes in flight behind this one's math
    }
    wq += kTileDepth * 64;
    sq += kTileDepth * 8;
  }
  // The last one or two groups (steps past the end neither loaded nor multiplied).
  for (; s0 < steps; s0 += kTileDepth) {
#pragma unroll
    for (int u = 0; u < kTileDepth; ++u) {
      const int s = s0 + u;
      if (s >= steps) break;
      step(u, xb + s * 128);
      load(s + kTileDepth, u);
    }
  }
  // red [warp][position][16 rows]: warps 0 / 1 gate / up of index tile 0, warps 2 / 3 of index tile 1.
  moe_dev::store_c_tile(red + warp * kChunk * 16, acc, g, t);
  __syncthreads();
  uint16_t* acth = reinterpret_cast<uint16_t*>(p.act);
  const float gs2 = ew.gate_scale2 * kCodeScale, us2 = ew.up_scale2 * kCodeScale;
  for (int i = tid; i < 2 * en.rows * 16; i += kTileThreads) {
    const int j = i / (en.rows * 16), r = (i >> 4) - j * en.rows, idx = i & 15;
    const float gv = red[(2 * j * kChunk + r) * 16 + idx] * gs2;
    const float uv = red[((2 * j + 1) * kChunk + r) * 16 + idx] * us2;
    const float wt = p.topk_weights[p.sorted_slots[en.pos0 + r]];
    const float v = gv / (1.0f + expf(-gv)) * uv * wt;
    acth[static_cast<int64_t>(en.pos0 + r) * p.inter + (2 * pair + j) * kGuIdx + b_order(idx)] =
        tc::f16_sat_bits(v);
  }
}

// ---- gate_up, half variants ------------------------------------------------------------------------------
//
// Group q = warp / 4 of the block (bar.sync id 1 + q of its 128 threads; id 0 stays __syncthreads) takes
// its own items; its warp w = warp % 4 takes k [w H / 4, (w + 1) H / 4) of both tiles (H / 512 steps).
// The block's contiguous run of items is cut into segments of one work-list entry (one set of staged x
// rows); in a segment, group 0 takes its items 0, 2, 4, .., group 1 items 1, 3, 5, .. (two neighbouring
// 16-row stripes of one expert at a time). The block restages xs only between segments, at __syncthreads
// (both groups have finished every item of the old rows: the same barrier count for both, since both walk
// the same segments). Per item a group meets twice, back to back, at its named barrier: before its warps
// write their partial sums into the group's red (its previous item's epilogue has read them) and after.
// The entry's rows, positions, scales and routing weights are read once per segment.

// Named barrier 1 + grp of the 128 threads of group grp (immediate ids: the kernel reserves 3 barriers).
__device__ __forceinline__ void group_barrier(int grp) {
  if (grp == 0)
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
}

template <int V>
__global__ void __launch_bounds__(kThreads, 2)
    moe_decode_gate_up_half_kernel(const MoeExpertsParams p, int x_rows) {
  static_assert((V & kMoeDecodeHalf) != 0 && (V & kMoeDecodeAcc2) == 0, "half, with or without sc8");
  constexpr bool kSc8 = (V & kMoeDecodeSc8) != 0;
  constexpr int kGw = kHalfWarps, kGThreads = 32 * kHalfWarps;
  static_assert(kHalfGroups == 2, "the items of a segment alternate between two groups");
  extern __shared__ __align__(16) uint8_t smem[];
  const int H = p.hidden;
  const int64_t xld = xs_ld(H);
  __half* xs = reinterpret_cast<__half*>(smem);
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(x_rows) * xld * 2);
  int32_t* ec = reinterpret_cast<int32_t*>(red + kWarps * 2 * kChunk * 16);
  // The segment's constants, written with its x rows (read back where needed instead of held in registers
  // through the k loop): seg_c the routing weights of its positions, then gate_scale2 and up_scale2 x
  // kCodeScale; seg_i its first position and its expert. They live in the work list's tail, which a list
  // never reaches (at most kMaxSlots entries: every entry holds a position).
  float* seg_c = reinterpret_cast<float*>(ec + kMaxSlots);
  int* seg_i = ec + kMaxSlots + kChunk + 2;
  static_assert(kMaxEc - kMaxSlots >= kChunk + 4, "the segment constants fit the work list's tail");
  __shared__ int s_nec;

  moe_dev::build_ec<kMaxEc>(p, x_rows, ec, &s_nec);
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int grp = warp / kGw, gw = warp % kGw, gtid = tid % kGThreads;
  static_assert(kGThreads == 128, "group_barrier counts 128 threads");
  float* red_g = red + grp * kGw * 2 * kChunk * 16;  // [4 warps][gate / up][position][16 rows]
  const int tiles = p.inter / kGuIdx;
  const int items = s_nec * tiles;
  const int steps = H / (kGw * 128);  // 128-k steps of a warp's quarter of k
  // Step s of lane (g, t) covers k [k_lane + 128 s, + 32); the swizzle bit of its 64-byte groups
  // k_lane / 32 + 4 s is t >> 1 (H / 128 is a multiple of 4).
  const int k_lane = gw * (H / kGw) + 32 * t;
  const int64_t row_bytes = H / 2, srow_bytes = H / 16;
  const __half* xs_lane = xs + g * xld + k_lane;
  const int sw = (t >> 1) & 1;
  uint16_t* acth = reinterpret_cast<uint16_t*>(p.act);
  const int it0 = moe_dev::run_start(items, blockIdx.x, gridDim.x);
  const int it1 = moe_dev::run_start(items, blockIdx.x + 1, gridDim.x);

  // The end of the segment that holds item i; the group's first item at or after segment start i; the
  // group's item after item i (it1: none).
  auto seg_end = [&](int i) { return min(it1, (i / tiles + 1) * tiles); };
  auto first_from = [&](int i) {
    while (i < it1) {
      const int e = seg_end(i);
      if (i + grp < e) return i + grp;
      i = e;
    }
    return it1;
  };
  // The group's item after item i of the segment that ends at se.
  auto next_of = [&](int i, int se) { return i + 2 < se ? i + 2 : first_from(se); };

  // Rows gate g, up g (rows g + 8 at a 32-bit offset), from the lane's k.
  const int row8 = 8 * (H / 2), srow8 = 8 * (H / 16);
  const uint8_t* wp[2];
  const uint8_t* sp[kSc8 ? 1 : 2];
  // Item (expert e, tile).
  auto point = [&](int e, int tile) {
    const MoeExpertWeights& ew = p.experts[e];
    const int64_t row = static_cast<int64_t>(tile) * kGuIdx + g;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      wp[r] = static_cast<const uint8_t*>(r == 0 ? ew.gate : ew.up) + row * row_bytes + k_lane / 2;
      if constexpr (!kSc8)
        sp[r] = static_cast<const uint8_t*>(r == 0 ? ew.gate_scale : ew.up_scale) + row * srow_bytes +
                k_lane / 16;
    }
  };
  // Rows gate g, gate g + 8, up g, up g + 8 (r = 0..3); register slots as in the 8-warp kernel.
  uint4 w[kGuUnroll][4];
  uint32_t sc[kSc8 ? 1 : kGuUnroll][4];
  auto load = [&](int s, int u) {
    if (s < steps) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        w[u][r] = ld_stream16(wp[r >> 1] + (r & 1) * row8 + s * 64);
        if constexpr (!kSc8) sc[u][r] = ld_stream2(sp[r >> 1] + (r & 1) * srow8 + s * 8);
      }
    }
  };
  uint2 raw[kSc8 ? 4 : 1], quad[kSc8 ? 4 : 1];
  // sc8: soff (scale_off(tile)) is where lane t's bytes of block 0 of row gate / up g start.
  auto scale_off = [&](int tile) {
    return static_cast<int>((static_cast<int64_t>(tile) * kGuIdx + g) * srow_bytes + k_lane / 16 + 6 * t);
  };
  auto load_scales = [&](int e, int soff, int b) {
    if constexpr (kSc8) {
      if (4 * b < steps) {
        const bool have = 4 * b + t < steps;
        const MoeExpertWeights& ew = p.experts[e];
        load_quad_block(raw, ew, soff + 32 * b, srow8, have);
      }
    }
  };
  // The first steps of item i (its expert from the work list) go in flight.
  auto start = [&](int i) {
    const int e = ec[i / tiles] & 1023, tile = i % tiles;
    point(e, tile);
#pragma unroll
    for (int u = 0; u < kGuUnroll; ++u) load(u, u);
    load_scales(e, scale_off(tile), 0);
  };
  int item = first_from(it0);
  if (item < it1) start(item);
  // Epilogue thread of the group: position r_e, index i_e of the tile.
  const int r_e = gtid >> 4, i_e = gtid & 15;
  for (int seg = it0; seg < it1;) {
    const int se = seg_end(seg);
    const moe_dev::EcEntry en = moe_dev::ec_entry(p, ec[seg / tiles], x_rows);
    const int e = en.e, rows = en.rows, pos0 = en.pos0;
    if (seg != it0) __syncthreads();  // both groups are done with the old rows and constants
    moe_decode_dev::stage_x_rows(p, pos0, rows, xs, xld, tid, kThreads);
    if (tid < rows) seg_c[tid] = p.topk_weights[p.sorted_slots[pos0 + tid]];
    if (tid == kThreads - 1) {
      seg_c[kChunk] = p.experts[e].gate_scale2 * kCodeScale;
      seg_c[kChunk + 1] = p.experts[e].up_scale2 * kCodeScale;
      seg_i[0] = pos0;
      seg_i[1] = e;
    }
    __syncthreads();
    const bool have_pos = r_e < rows;
    const __half* xb = xs_lane - (g - moe_dev::b_row(g, rows)) * xld;  // b_row: no branch per load
    for (; item < se;) {
      const int soff = kSc8 ? scale_off(item % tiles) : 0;
      float acc[2][4] = {};
      constexpr int kLoop = kSc8 ? 12 : kGuUnroll;
      for (int s0 = 0; s0 < steps; s0 += kLoop) {
#pragma unroll
        for (int v = 0; v < kLoop; ++v) {
          const int u = v % kGuUnroll, s = s0 + v;
          if (s >= steps) break;
          uint32_t scs[4];
          if constexpr (kSc8) {
            sc8_step_scales(quad, raw, scs, v, t, [&] { load_scales(seg_i[1], soff, (s >> 2) + 1); });
            // One B piece at a time for both tiles (its 4 registers instead of all 16 of the step live): the
            // same mmas into each tile in the same order as tile_step (bit-identical to half).
#pragma unroll
            for (int j2 = 0; j2 < 4; ++j2) {
              const uint4 bj = *reinterpret_cast<const uint4*>(xb + s * 128 + 8 * (j2 ^ sw));
              moe_decode_dev::word_step_split(acc[0], acc[0], w[u][0], w[u][1], scs[0], scs[1], j2, bj);
              moe_decode_dev::word_step_split(acc[1], acc[1], w[u][2], w[u][3], scs[2], scs[3], j2, bj);
            }
          } else {
            uint4 b[4];
#pragma unroll
            for (int j2 = 0; j2 < 4; ++j2)
              b[j2] = *reinterpret_cast<const uint4*>(xb + s * 128 + 8 * (j2 ^ sw));
#pragma unroll
            for (int r = 0; r < 4; ++r) scs[r] = sc[u][r];
            tile_step(acc[0], w[u][0], w[u][1], scs[0], scs[1], b);
            tile_step(acc[1], w[u][2], w[u][3], scs[2], scs[3], b);
          }
          load(s + kGuUnroll, u);
        }
      }
      const int nxt = next_of(item, se);
      if (nxt < it1) start(nxt);  // the group's next item's first steps go in flight before the reduction
      group_barrier(grp);         // the previous item's epilogue has read red_g
      float* rw = red_g + gw * 2 * kChunk * 16;
      moe_dev::store_c_tile(rw, acc[0], g, t);
      moe_dev::store_c_tile(rw + kChunk * 16, acc[1], g, t);
      group_barrier(grp);
      if (have_pos) {
        // sum_gate_up_tiles' order (warps 0..3), from one base address.
        const float* rr = red_g + r_e * 16 + i_e;
        float gs = 0.f, us = 0.f;
#pragma unroll
        for (int w2 = 0; w2 < kGw; ++w2) {
          gs += rr[w2 * 2 * kChunk * 16];
          us += rr[(w2 * 2 + 1) * kChunk * 16];
        }
        const float gv = gs * seg_c[kChunk], uv = us * seg_c[kChunk + 1];
        const float v = gv / (1.0f + expf(-gv)) * uv * seg_c[r_e];
        acth[static_cast<int64_t>(seg_i[0] + r_e) * p.inter + (item % tiles) * kGuIdx + b_order(i_e)] =
            tc::f16_sat_bits(v);
      }
      item = nxt;
    }
    seg = se;
  }
}

// ---- down (+ routing weight, already in act, + combine) --------------------------------------------------

template <int V>
__global__ void __launch_bounds__(kDownThreads, kDownMinBlocks)
    moe_decode_down_kernel(const MoeExpertsParams p) {
  constexpr bool kAcc2 = (V & kMoeDecodeAcc2) != 0, kSc8 = (V & kMoeDecodeSc8) != 0;
  constexpr int kSets = kAcc2 ? 2 : 1;
  extern __shared__ __align__(16) uint8_t smem[];
  const int m = p.m;
  float *out_w, *scr;
  int32_t* ec;
  moe_dev::carve_down(smem, m, out_w, scr, ec);
  __shared__ int s_nec;

  moe_dev::build_ec<kMaxEc>(p, kChunk, ec, &s_nec);
  for (int i = threadIdx.x; i < kDownWarps * m * kDownRows; i += kDownThreads) out_w[i] = 0.f;
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kDownRows;
  const int ks_per = p.inter / kDownKr;
  const int pieces = s_nec * ks_per;
  const int p_begin = moe_dev::run_start(pieces, warp, kDownWarps);
  const int p_end = moe_dev::run_start(pieces, warp + 1, kDownWarps);
  const int64_t row_bytes = p.inter / 2, srow_bytes = p.inter / 16;
  const __half* acth = reinterpret_cast<const __half*>(p.act);
  float* scr_w = scr + warp * kChunk * kDownRows;
  float* out_ww = out_w + warp * m * kDownRows;

  int cur = -1, rows = 0, pos0 = 0;
  float s2 = 0.f;
  float acc[kSets][4] = {};
  auto flush = [&]() {
    if constexpr (kAcc2) {  // the sets meet in a fixed order: set 0 + set 1
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][i] += acc[1][i];
    }
    moe_dev::store_c_tile(scr_w, acc[0], g, t);
    __syncwarp();
    if (lane < kDownRows) {
      // Positions in order: a token met twice (a repeated expert in its top-k) adds in a fixed order.
      for (int q = 0; q < rows; ++q) {
        const int tok = p.sorted_slots[pos0 + q] / p.top_k;
        out_ww[tok * kDownRows + lane] += scr_w[q * 16 + lane] * s2;
      }
    }
    __syncwarp();
  };
  // Step s of a piece: lane (g, t) covers k [k0 + 128 s + 32 t, + 32) of rows row0 + g, + 8 (a quad reads 64
  // contiguous bytes of its row); a piece's 8 loads are issued one piece ahead of its math (two register
  // buffers), so a warp always has the next piece's bytes in flight.
  constexpr int kSteps = kDownKr / 128;
  static_assert(kSteps == 4, "sc8: one 8-byte scale load per lane and row covers a piece");
  // Scales of a piece: base 2 bytes a step and row (sc[st][r]); sc8 the 8 bytes of step t of the quad per row
  // (sc[0][r] | sc[1][r] << 32), exchanged inside the quad when the piece's math starts.
  using Sc = uint32_t[kSteps][2];
  auto load = [&](int pc, uint4(&w)[kSteps][2], Sc& sc) {
    const int ei = pc / ks_per, ks = pc - ei * ks_per;
    const MoeExpertWeights& ew = p.experts[ec[ei] & 1023];
    const int64_t k0 = static_cast<int64_t>(ks) * kDownKr + 32 * t;
    const uint8_t* wb =
        static_cast<const uint8_t*>(ew.down) + static_cast<int64_t>(row0 + g) * row_bytes + k0 / 2;
    const uint8_t* sb =
        static_cast<const uint8_t*>(ew.down_scale) + static_cast<int64_t>(row0 + g) * srow_bytes + k0 / 16;
#pragma unroll
    for (int st = 0; st < kSteps; ++st)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        w[st][r] = ld_stream16(wb + r * 8 * row_bytes + 64 * st);
        if constexpr (!kSc8) sc[st][r] = ld_stream2(sb + r * 8 * srow_bytes + 8 * st);
      }
    if constexpr (kSc8) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // the quad's bytes start at sb - 2 t; step t's 8 at + 8 t
        const uint2 v = ld_stream8(sb + r * 8 * srow_bytes + 6 * t);
        sc[0][r] = v.x;
        sc[1][r] = v.y;
      }
    }
  };
  auto process = [&](int pc, const uint4(&w)[kSteps][2], const Sc& sc) {
    const int ei = pc / ks_per, ks = pc - ei * ks_per;
    if (ei != cur) {
      if (cur >= 0) flush();
      cur = ei;
      const int code = ec[ei];
      const int e = code & 1023, chunk = code >> 10;
      const int count = p.expert_counts[e];
      rows = min(kChunk, count - chunk * kChunk);
      pos0 = p.expert_offsets[e] + chunk * kChunk;
      s2 = p.experts[e].down_scale2 * kCodeScale;
#pragma unroll
      for (int k = 0; k < kSets; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[k][i] = 0.f;
    }
    const __half* arow =
        acth + static_cast<int64_t>(pos0 + moe_dev::b_row(g, rows)) * p.inter + ks * kDownKr + 32 * t;
    uint2 quad[2];
    if constexpr (kSc8) {
#pragma unroll
      for (int r = 0; r < 2; ++r) quad[r] = moe_decode_dev::quad_scales(make_uint2(sc[0][r], sc[1][r]), t);
    }
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      uint4 b[4];
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2) b[j2] = __ldg(reinterpret_cast<const uint4*>(arow + 128 * st + 8 * j2));
      const uint32_t sc0 = kSc8 ? moe_decode_dev::quad_scale_of(quad[0], st) : sc[st][0];
      const uint32_t sc1 = kSc8 ? moe_decode_dev::quad_scale_of(quad[1], st) : sc[st][1];
      if constexpr (kAcc2)
        tile_step_split(acc[0], acc[1], w[st][0], w[st][1], sc0, sc1, b);
      else
        tile_step(acc[0], w[st][0], w[st][1], sc0, sc1, b);
    }
  };
  uint4 wa[kSteps][2], wb2[kSteps][2];
  uint32_t sa[kSteps][2], sb2[kSteps][2];  // sc8: only [0..1][2] used
  if (p_begin < p_end) load(p_begin, wa, sa);
  for (int pc = p_begin; pc < p_end; pc += 2) {
    if (pc + 1 < p_end) load(pc + 1, wb2, sb2);
    process(pc, wa, sa);
    if (pc + 1 >= p_end) break;
    if (pc + 2 < p_end) load(pc + 2, wa, sa);
    process(pc + 1, wb2, sb2);
  }
  if (cur >= 0) flush();
  __syncthreads();
  moe_dev::add_down_tiles(p, out_w, m, row0, tid);
}

// ---- down, tile variant ---------------------------------------------------------------------------------
//
// The work split of the down kernel above (block = 16 output rows, pieces (expert chunk, 512 k) in ascending
// order, a contiguous run of them a warp, its sum kept while the chunk stays the same) with 8 warps a block
// and a leaner pipeline: one register buffer of a piece (4 steps, rows g and g + 8, 2-byte scale loads),
// step st of the next piece loaded right after step st's math, so a warp always has one piece in flight and
// the kernel stays within 85 registers (3 blocks, 24 warps a multiprocessor).
__global__ void __launch_bounds__(kDownTileThreads, kDownTileMinBlocks)
    moe_decode_down_tile_kernel(const MoeExpertsParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int m = p.m;
  float* out_w = reinterpret_cast<float*>(smem);  // [kDownTileWarps][m][16]
  float* scr = out_w + kDownTileWarps * m * kDownRows;
  int32_t* ec = reinterpret_cast<int32_t*>(scr + kDownTileWarps * kChunk * kDownRows);
  __shared__ int s_nec;

  moe_dev::build_ec<kMaxEc>(p, kChunk, ec, &s_nec);
  for (int i = threadIdx.x; i < kDownTileWarps * m * kDownRows; i += kDownTileThreads) out_w[i] = 0.f;
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kDownRows;
  const int ks_per = p.inter / kDownKr;
  const int pieces = s_nec * ks_per;
  const int p_begin = moe_dev::run_start(pieces, warp, kDownTileWarps);
  const int p_end = moe_dev::run_start(pieces, warp + 1, kDownTileWarps);
  const int64_t row_bytes = p.inter / 2, srow_bytes = p.inter / 16;
  const __half* acth = reinterpret_cast<const __half*>(p.act);
  // The warp's scratch and output tiles, found again at each flush (two pointers fewer held in the k loop).
  auto flush = [&](const float(&a)[4], int rows, int pos0, float s2) {
    moe_dev::flush_down_chunk<true>(p, a, scr + warp * kChunk * kDownRows, out_w + warp * m * kDownRows, rows,
                                    pos0, s2, lane, g, t);
  };
  constexpr int kSteps = kDownKr / 128;

  // Piece pc's bytes of the lane: k [ks 512 + 128 st + 32 t, + 32) of rows row0 + g and + 8 (offsets from
  // the expert's matrices: an expert's down matrix is far below 2^31 bytes).
  const uint32_t woff = static_cast<uint32_t>((row0 + g) * row_bytes + 16 * t);
  const uint32_t soff = static_cast<uint32_t>((row0 + g) * srow_bytes + 2 * t);
  const uint8_t* wb = nullptr;
  const uint8_t* sb = nullptr;
  auto point = [&](int ei, int ks) {
    const MoeExpertWeights& ew = p.experts[ec[ei] & 1023];
    wb = static_cast<const uint8_t*>(ew.down) + (woff + static_cast<uint32_t>(ks) * (kDownKr / 2));
    sb = static_cast<const uint8_t*>(ew.down_scale) + (soff + static_cast<uint32_t>(ks) * (kDownKr / 16));
  };
  uint4 w[kSteps][2];
  uint32_t sc[kSteps];  // rows g (bits 0..15) and g + 8 (16..31): their two scale bytes of the step
  auto load = [&](int st) {
#pragma unroll
    for (int r = 0; r < 2; ++r) w[st][r] = ld_stream16(wb + r * 8 * row_bytes + 64 * st);
    sc[st] = ld_stream2(sb + 8 * st) | (ld_stream2(sb + 8 * srow_bytes + 8 * st) << 16);
  };
  // The piece being multiplied, (entry ei, k-range ks), and the one after it, stepped without divisions.
  int ei = p_begin / ks_per, ks = p_begin - ei * ks_per;
  if (p_begin < p_end) {
    point(ei, ks);
#pragma unroll
    for (int st = 0; st < kSteps; ++st) load(st);
  }
  int cur = -1, rows = 0, pos0 = 0;
  float s2 = 0.f;
  float acc[4] = {};
  for (int pc = p_begin; pc < p_end; ++pc) {
    const int nks = ks + 1 == ks_per ? 0 : ks + 1, nei = nks == 0 ? ei + 1 : ei;
    if (ei != cur) {
      if (cur >= 0) flush(acc, rows, pos0, s2);
      cur = ei;
      const moe_dev::EcEntry en = moe_dev::ec_entry(p, ec[ei], kChunk);
      rows = en.rows;
      pos0 = en.pos0;
      s2 = p.experts[en.e].down_scale2 * kCodeScale;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = 0.f;
    }
    const bool more = pc + 1 < p_end;
    if (more) point(nei, nks);
    const __half* arow =
        acth + static_cast<int64_t>(pos0 + moe_dev::b_row(g, rows)) * p.inter + ks * kDownKr + 32 * t;
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      const uint32_t s0 = moe_decode_dev::scales_f16x2(sc[st] & 0xffffu);
      const uint32_t s1 = moe_decode_dev::scales_f16x2(sc[st] >> 16);
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2) {
        const uint4 bj = __ldg(reinterpret_cast<const uint4*>(arow + 128 * st + 8 * j2));
        moe_decode_dev::word_mmas(acc, acc, w[st][0], w[st][1], s0, s1, j2, bj);
      }
      if (more) load(st);  // the next piece's step st goes in flight behind this one's math
    }
    ei = nei;
    ks = nks;
  }
  if (cur >= 0) flush(acc, rows, pos0, s2);
  __syncthreads();
  moe_dev::add_down_tiles<kDownTileWarps>(p, out_w, m, row0, tid);
}

// ---- the cp.async ring variant ---------------------------------------------------------------------------
//
// The same work split, math and summation orders as the kernels above (bit-identical outputs); only the way
// a lane's weight and scale bytes reach its registers differs. Lane l of warp w copies its bytes of step q
// (16 weight bytes per row, and the aligned 4-byte word that holds its 2 scale bytes: the quad's lanes 2 j,
// 2 j + 1 copy the same word, each keeping its half) with cp.async (L2 only for the 16-byte pieces) into its
// slots of the warp's ring, slot q % depth, one commit group per step, depth - 1 steps ahead of its math and
// across work items (the issue cursor runs ahead through the warp's item or piece list). Before using step q
// it waits until at most depth - 1 groups are pending and reads back exactly the bytes it copied: the copies
// are visible to the thread that waited, and no other thread reads them, so the ring needs neither a block
// nor a warp barrier. Step q + depth - 1 reuses the slot of step q - 1, whose values this lane has already
// consumed (the math of step q - 1 has used the registers loaded from it) before issuing the copy.

using dev::cp_async16;
using dev::cp_async4;
using dev::cp_async_commit;
using dev::cp_async_wait;
using dev::cp_async_wait_pending;
static_assert(kRingMaxDepth <= 8, "cp_async_wait_pending counts up to 7 pending groups");
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}

__global__ void __launch_bounds__(kThreads, 2)
    moe_decode_gate_up_ring_kernel(const MoeExpertsParams p, int x_rows, int depth) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int H = p.hidden;
  const int64_t xld = xs_ld(H);
  __half* xs;
  float* red;
  int32_t* ec;
  moe_dev::carve_gate_up(smem, x_rows, xld, xs, red, ec);
  uint8_t* ring = reinterpret_cast<uint8_t*>(ec + kMaxEc);  // moe_decode_config.h: gate_up_ring_smem
  __shared__ int s_nec;

  moe_dev::build_ec<kMaxEc>(p, x_rows, ec, &s_nec);
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tiles = p.inter / kGuIdx;
  const int items = s_nec * tiles;
  const int steps = H / 1024;
  const int k_lane = warp * (H / 8) + 32 * t;
  const int64_t row_bytes = H / 2, srow_bytes = H / 16;
  const __half* xs_lane = xs + g * xld + k_lane;
  const int sw = (t >> 1) & 1;
  uint16_t* acth = reinterpret_cast<uint16_t*>(p.act);
  const int it0 = moe_dev::run_start(items, blockIdx.x, gridDim.x);
  const int it1 = moe_dev::run_start(items, blockIdx.x + 1, gridDim.x);

  // The lane's slots: weights of (slot d, row r) at ring_w + (d * 4 + r) * 512, scale words at ring_s + (d *
  // 4 + r) * 128 (layout: [8 warps][depth][4 rows][32 lanes] x 16 bytes, then the same x 4 bytes).
  const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint32_t ring_w = ring0 + static_cast<uint32_t>((warp * depth * kGuRingRows * 32 + lane) * 16);
  const uint32_t ring_s = ring0 + static_cast<uint32_t>(kWarps * depth * kGuRingRows * 32 * 16) +
                          static_cast<uint32_t>((warp * depth * kGuRingRows * 32 + lane) * 4);
  const int half = 16 * (t & 1);  // the lane's 2 scale bytes in the copied word

  // Issue cursor: step i_s of item i_item, ring slot i_slot; i_q steps issued of the block's total.
  const int total = (it1 - it0) * steps;
  int i_q = 0, i_item = it0, i_s = 0, i_slot = 0;
  const uint8_t* iw[4];
  const uint8_t* is[4];
  auto issue_next = [&]() {
    if (i_q < total) {
      if (i_s == 0) {
        const int code = ec[i_item / tiles];
        const MoeExpertWeights& ew = p.experts[code & 1023];
        const int64_t idx = (i_item % tiles) * kGuIdx + g;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int64_t row = idx + (r & 1) * 8;
          iw[r] = static_cast<const uint8_t*>(r < 2 ? ew.gate : ew.up) + row * row_bytes + k_lane / 2;
          is[r] = static_cast<const uint8_t*>(r < 2 ? ew.gate_scale : ew.up_scale) + row * srow_bytes +
                  ((k_lane / 16) & ~3);
        }
      }
      const uint32_t sl = static_cast<uint32_t>(i_slot * kGuRingRows);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        cp_async16(ring_w + (sl + r) * 512u, iw[r] + i_s * 64);
        cp_async4(ring_s + (sl + r) * 128u, is[r] + i_s * 8);
      }
      if (++i_s == steps) {
        i_s = 0;
        ++i_item;
      }
      i_slot = i_slot + 1 == depth ? 0 : i_slot + 1;
    }
    ++i_q;
    cp_async_commit();  // empty past the end: every step owns one group
  };
  for (int i = 0; i + 1 < depth; ++i) issue_next();

  int c_slot = 0;
  int staged = -1;
  for (int item = it0; item < it1; ++item) {
    const int eci = item / tiles;
    const int code = ec[eci], tile = item % tiles;
    const moe_dev::EcEntry en = moe_dev::ec_entry(p, code, x_rows);
    const int e = en.e, rows = en.rows, pos0 = en.pos0;
    const MoeExpertWeights& ew = p.experts[e];
    if (eci != staged) {
      moe_decode_dev::stage_x_rows(p, pos0, rows, xs, xld, tid, kThreads);
      staged = eci;
    }
    __syncthreads();
    const __half* xb = xs_lane - (g - moe_dev::b_row(g, rows)) * xld;  // b_row: no branch per load
    float acc[2][4] = {};
    for (int s = 0; s < steps; ++s) {
      issue_next();
      cp_async_wait_pending(depth - 1);  // this step's group has landed
      const uint32_t sl = static_cast<uint32_t>(c_slot * kGuRingRows);
      uint4 w[4];
      uint32_t sc[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        w[r] = lds128(ring_w + (sl + r) * 512u);
        sc[r] = lds32(ring_s + (sl + r) * 128u) >> half;
      }
      c_slot = c_slot + 1 == depth ? 0 : c_slot + 1;
      uint4 b[4];
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2) b[j2] = *reinterpret_cast<const uint4*>(xb + s * 128 + 8 * (j2 ^ sw));
      tile_step(acc[0], w[0], w[1], sc[0], sc[1], b);
      tile_step(acc[1], w[2], w[3], sc[2], sc[3], b);
    }
    gate_up_epilogue(p, red, acc[0], acc[1], ew, pos0, rows, tile, acth, warp, g, t);
  }
  cp_async_wait<0>();  // nothing real is pending (every issued step was read); leave no copy behind
}

__global__ void __launch_bounds__(kDownThreads, kDownMinBlocks)
    moe_decode_down_ring_kernel(const MoeExpertsParams p, int depth) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int m = p.m;
  float *out_w, *scr;
  int32_t* ec;
  moe_dev::carve_down(smem, m, out_w, scr, ec);
  uint8_t* ring = reinterpret_cast<uint8_t*>(ec + kMaxEc);  // moe_decode_config.h: down_ring_smem
  __shared__ int s_nec;

  moe_dev::build_ec<kMaxEc>(p, kChunk, ec, &s_nec);
  for (int i = threadIdx.x; i < kDownWarps * m * kDownRows; i += kDownThreads) out_w[i] = 0.f;
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kDownRows;
  const int ks_per = p.inter / kDownKr;
  const int pieces = s_nec * ks_per;
  const int p_begin = moe_dev::run_start(pieces, warp, kDownWarps);
  const int p_end = moe_dev::run_start(pieces, warp + 1, kDownWarps);
  const int64_t row_bytes = p.inter / 2, srow_bytes = p.inter / 16;
  const __half* acth = reinterpret_cast<const __half*>(p.act);
  float* scr_w = scr + warp * kChunk * kDownRows;
  float* out_ww = out_w + warp * m * kDownRows;
  constexpr int kSteps = kDownKr / 128;

  const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint32_t ring_w = ring0 + static_cast<uint32_t>((warp * depth * kDownRingRows * 32 + lane) * 16);
  const uint32_t ring_s = ring0 + static_cast<uint32_t>(kDownWarps * depth * kDownRingRows * 32 * 16) +
                          static_cast<uint32_t>((warp * depth * kDownRingRows * 32 + lane) * 4);
  const int half = 16 * (t & 1);

  const int total = (p_end - p_begin) * kSteps;
  int i_q = 0, i_pc = p_begin, i_st = 0, i_slot = 0;
  const uint8_t* iw = nullptr;
  const uint8_t* is = nullptr;
  auto issue_next = [&]() {
    if (i_q < total) {
      if (i_st == 0) {
        const int ei = i_pc / ks_per, ks = i_pc - ei * ks_per;
        const MoeExpertWeights& ew = p.experts[ec[ei] & 1023];
        const int64_t k0 = static_cast<int64_t>(ks) * kDownKr + 32 * t;
        iw = static_cast<const uint8_t*>(ew.down) + static_cast<int64_t>(row0 + g) * row_bytes + k0 / 2;
        is = static_cast<const uint8_t*>(ew.down_scale) + static_cast<int64_t>(row0 + g) * srow_bytes +
             ((k0 / 16) & ~int64_t{3});
      }
      const uint32_t sl = static_cast<uint32_t>(i_slot * kDownRingRows);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        cp_async16(ring_w + (sl + r) * 512u, iw + r * 8 * row_bytes + 64 * i_st);
        cp_async4(ring_s + (sl + r) * 128u, is + r * 8 * srow_bytes + 8 * i_st);
      }
      if (++i_st == kSteps) {
        i_st = 0;
        ++i_pc;
      }
      i_slot = i_slot + 1 == depth ? 0 : i_slot + 1;
    }
    ++i_q;
    cp_async_commit();
  };
  for (int i = 0; i + 1 < depth; ++i) issue_next();

  int cur = -1, rows = 0, pos0 = 0, c_slot = 0;
  float s2 = 0.f;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  auto flush = [&]() { moe_dev::flush_down_chunk<true>(p, acc, scr_w, out_ww, rows, pos0, s2, lane, g, t); };
  for (int pc = p_begin; pc < p_end; ++pc) {
    const int ei = pc / ks_per, ks = pc - ei * ks_per;
    if (ei != cur) {
      if (cur >= 0) flush();
      cur = ei;
      const int code = ec[ei];
      const int e = code & 1023, chunk = code >> 10;
      const int count = p.expert_counts[e];
      rows = min(kChunk, count - chunk * kChunk);
      pos0 = p.expert_offsets[e] + chunk * kChunk;
      s2 = p.experts[e].down_scale2 * kCodeScale;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = 0.f;
    }
    const __half* arow =
        acth + static_cast<int64_t>(pos0 + moe_dev::b_row(g, rows)) * p.inter + ks * kDownKr + 32 * t;
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      issue_next();
      cp_async_wait_pending(depth - 1);
      const uint32_t sl = static_cast<uint32_t>(c_slot * kDownRingRows);
      const uint4 w0 = lds128(ring_w + sl * 512u), w1 = lds128(ring_w + (sl + 1) * 512u);
      const uint32_t sc0 = lds32(ring_s + sl * 128u) >> half, sc1 = lds32(ring_s + (sl + 1) * 128u) >> half;
      c_slot = c_slot + 1 == depth ? 0 : c_slot + 1;
      uint4 b[4];
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2) b[j2] = __ldg(reinterpret_cast<const uint4*>(arow + 128 * st + 8 * j2));
      tile_step(acc, w0, w1, sc0, sc1, b);
    }
  }
  if (cur >= 0) flush();
  cp_async_wait<0>();
  __syncthreads();
  moe_dev::add_down_tiles(p, out_w, m, row0, tid);
}

bool aligned(const void* ptr, size_t a) {
  return reinterpret_cast<uintptr_t>(ptr) % a == 0;
}

// The half variants' down kernel is the one of the same variant without half (base, sc8); whole's is sc8's.
template <int V>
void launch_registers(const MoeExpertsParams& p, const Config& c, cudaStream_t stream) {
  constexpr int kDownV = V == kMoeDecodeWhole ? kMoeDecodeSc8 : V & ~kMoeDecodeHalf;
  void (*gate_up)(const MoeExpertsParams, int) = nullptr;
  if constexpr (V == kMoeDecodeWhole)
    gate_up = moe_decode_gate_up_whole_kernel;
  else if constexpr ((V & kMoeDecodeHalf) != 0)
    gate_up = moe_decode_gate_up_half_kernel<V>;
  else
    gate_up = moe_decode_gate_up_kernel<V>;
  CUDA_CHECK(cudaFuncSetAttribute(gate_up, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_gate_up)));
  CUDA_CHECK(cudaFuncSetAttribute(moe_decode_down_kernel<kDownV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_down)));
  gate_up<<<c.grid_gate_up, kThreads, c.smem_gate_up, stream>>>(p, c.x_rows);
  CUDA_CHECK(cudaGetLastError());
  moe_decode_down_kernel<kDownV><<<c.grid_down, kDownThreads, c.smem_down, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void launch_tile(const MoeExpertsParams& p, const Config& c, cudaStream_t stream) {
  CUDA_CHECK(cudaFuncSetAttribute(moe_decode_gate_up_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_gate_up)));
  CUDA_CHECK(cudaFuncSetAttribute(moe_decode_down_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_down)));
  moe_decode_gate_up_tile_kernel<<<c.grid_gate_up, kTileThreads, c.smem_gate_up, stream>>>(p, c.x_rows);
  CUDA_CHECK(cudaGetLastError());
  moe_decode_down_tile_kernel<<<c.grid_down, kDownTileThreads, c.smem_down, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int moe_decode_kernel_from_env(const char* value) {
  const std::string_view v = value ? value : "";
  if (v.empty()) return -1;
  if (v == "registers") return 0;
  if (v == "ring") return 1;
  MS_THROW("MOESERVE_MOE_DECODE_KERNEL = '{}' is not one of registers, ring", v);
}

const char* moe_decode_variant_name(int variant) {
  switch (variant) {
    case kMoeDecodeBase:
      return "base";
    case kMoeDecodeAcc2:
      return "acc2";
    case kMoeDecodeSc8:
      return "sc8";
    case kMoeDecodeAcc2Sc8:
      return "acc2sc8";
    case kMoeDecodeHalf:
      return "half";
    case kMoeDecodeHalfSc8:
      return "halfsc8";
    case kMoeDecodeWhole:
      return "whole";
    case kMoeDecodeTile:
      return "tile";
    default:
      MS_THROW("moe_decode_variant_name: variant {} is not one of 0, 1, 2, 3, 4, 6, 8, 16", variant);
  }
}

int moe_decode_variant_from_env(const char* value) {
  const std::string_view v = value ? value : "";
  if (v.empty()) return -1;
  for (int i : kMoeDecodeVariantList)
    if (v == moe_decode_variant_name(i)) return i;
  MS_THROW(
      "MOESERVE_MOE_DECODE_VARIANT = '{}' is not one of base, acc2, sc8, acc2sc8, half, halfsc8, whole, tile",
      v);
}

int moe_decode_variant(const MoeExpertsParams& p) {
  if (p.decode_variant >= 0) {
    MS_CHECK(moe_decode_variant_valid(p.decode_variant),
             "moe_experts_decode: decode_variant = {} is not a MoeDecodeVariant (0, 1, 2, 3, 4, 6, 8, 16)",
             p.decode_variant);
    return p.decode_variant;
  }
  static const int from_env = moe_decode_variant_from_env(std::getenv("MOESERVE_MOE_DECODE_VARIANT"));
  // Default on an H200, GLM-5 experts (docs/PERFORMANCE.md, 2026-12-02): tile up to 8 tokens (one token
  // 66 us against sc8's 79; 8 tokens 441-446 us against whole's 504-523 with uniform routing and 236-237
  // against 247-255 skewed), whole from 9 (at 32 tile is 4-5% faster with uniform routing but 26% slower
  // skewed: its x rows a pass re-read a busy expert's weights; at 48-128 tokens whole was 13-17% faster than
  // halfsc8, the former default past 32, with either routing, and tile fell behind it).
  if (from_env >= 0) return from_env;
  return p.m <= 8 ? kMoeDecodeTile : kMoeDecodeWhole;
}

namespace {
// p.decode_ring, else MOESERVE_MOE_DECODE_KERNEL (read once), else the register kernels.
int wanted_variant(const MoeExpertsParams& p) {
  if (p.decode_ring >= 0) return p.decode_ring;
  static const int from_env = moe_decode_kernel_from_env(std::getenv("MOESERVE_MOE_DECODE_KERNEL"));
  if (from_env >= 0) return from_env;
  return 0;
}

// The configuration for p's variant of the register kernels (the half variants take more hidden sizes).
Config choose_for(const MoeExpertsParams& p) {
  return choose_variant(moe_decode_shape(p), limits_of(current_device_caps()),
                        moe_decode_split(moe_decode_variant(p)));
}
}  // namespace

bool moe_experts_decode_uses_ring(const MoeExpertsParams& p) {
  return moe_experts_decode_applies(p) && wanted_variant(p) == 1 && choose_for(p).ring;
}

moe_decode_config::Shape moe_decode_shape(const MoeExpertsParams& p) {
  return {p.format == MoeWeightFormat::NVFP4, p.hidden, p.inter, p.m, p.top_k, p.n_experts};
}

bool moe_experts_decode_applies(const MoeExpertsParams& p) {
  if (p.disable_stream || p.disable_decode || !p.experts_aligned16 || p.format != MoeWeightFormat::NVFP4)
    return false;
  if (!aligned(p.x, 16) || p.ldx % 4 != 0 || !aligned(p.act, 16)) return false;
  return choose_for(p).use;
}

void moe_experts_decode(const MoeExpertsParams& p, cudaStream_t stream) {
  moe_experts_check(p);
  if (p.m == 0) return;
  MS_CHECK(p.format == MoeWeightFormat::NVFP4, "moe_experts_decode: weights must be NVFP4");
  MS_CHECK(p.experts_aligned16,
           "moe_experts_decode: experts_aligned16 is not set (weight pointers unchecked)");
  MS_CHECK(aligned(p.x, 16) && p.ldx % 4 == 0, "moe_experts_decode: x must be 16-byte aligned, ldx % 4 == 0");
  MS_CHECK(aligned(p.act, 16), "moe_experts_decode: act workspace must be 16-byte aligned");
  const DeviceCaps caps = current_device_caps();
  const int register_variant = moe_decode_variant(p);
  const Config c = choose_variant(moe_decode_shape(p), limits_of(caps), moe_decode_split(register_variant));
  MS_CHECK(c.use, "moe_experts_decode: {}", c.why);
  const int variant = wanted_variant(p);
  if (variant == 1 && c.ring) {
    check_smem(caps, "moe_decode_gate_up_ring", c.smem_gate_up_ring);
    check_smem(caps, "moe_decode_down_ring", c.smem_down_ring);
    CUDA_CHECK(cudaFuncSetAttribute(moe_decode_gate_up_ring_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(c.smem_gate_up_ring)));
    CUDA_CHECK(cudaFuncSetAttribute(moe_decode_down_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(c.smem_down_ring)));
    moe_decode_gate_up_ring_kernel<<<c.grid_gate_up_ring, kThreads, c.smem_gate_up_ring, stream>>>(
        p, c.x_rows, c.ring_depth_gate_up);
    CUDA_CHECK(cudaGetLastError());
    moe_decode_down_ring_kernel<<<c.grid_down, kDownThreads, c.smem_down_ring, stream>>>(p,
                                                                                         c.ring_depth_down);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  const bool tile = register_variant == kMoeDecodeTile;
  check_smem(caps, tile ? "moe_decode_gate_up_tile" : "moe_decode_gate_up", c.smem_gate_up);
  check_smem(caps, tile ? "moe_decode_down_tile" : "moe_decode_down", c.smem_down);
  switch (register_variant) {
    case kMoeDecodeAcc2:
      return launch_registers<kMoeDecodeAcc2>(p, c, stream);
    case kMoeDecodeSc8:
      return launch_registers<kMoeDecodeSc8>(p, c, stream);
    case kMoeDecodeAcc2Sc8:
      return launch_registers<kMoeDecodeAcc2Sc8>(p, c, stream);
    case kMoeDecodeHalf:
      return launch_registers<kMoeDecodeHalf>(p, c, stream);
    case kMoeDecodeHalfSc8:
      return launch_registers<kMoeDecodeHalfSc8>(p, c, stream);
    case kMoeDecodeWhole:
      return launch_registers<kMoeDecodeWhole>(p, c, stream);
    case kMoeDecodeTile:
      return launch_tile(p, c, stream);
    default:
      return launch_registers<kMoeDecodeBase>(p, c, stream);
  }
}

}  // namespace ms::cuda
