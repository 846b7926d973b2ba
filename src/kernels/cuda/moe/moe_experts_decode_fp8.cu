// Register-streamed FP8-block experts for decode (see moe_experts_decode_fp8.h).
//
// Warp tile: 16 weight rows x one k-range, mma.sync m16n8k16 in f16 (weights as A, up to 8 positions as the
// n8 B tile, f32 accumulation). Lane (g = lane / 4, t = lane % 4) owns rows g and g + 8; a step of the warp
// covers one 128-k scale block, of which lane t takes the 16 k from 16 t of each half h (0, 1): two 16-byte
// loads per row, bytes [64 h + 16 t, + 16) of the block, so the four lanes of a quad read 64 contiguous bytes
// of the row per load instruction (two whole sectors; the two instructions read the row's 128-byte block).
// The k order inside a lane's 32 is permuted (a dot product does not care), identically for A and B:
//   mma j (0..7) of a step uses, of half h = j / 4, the lane's physical k = 64 h + 16 t + 4 (j % 4) .. + 3,
//   i.e. word j % 4 of the row's 16-byte piece h:
//     a0 = row g    (k, k + 1) = low half of the word,   a2 = row g    (k + 2, k + 3) = high half
//     a1 = row g+8  (k, k + 1),                           a3 = row g+8  (k + 2, k + 3)
//     b0 = position g (k, k + 1) as f16,                  b1 = position g (k + 2, k + 3)
//   i.e. logical k (2t, 2t + 1, 2t + 8, 2t + 9) of the mma <- physical (k .. k + 3) of lane t: the four lanes
//   of a group cover four different quarters, each consistently in A and B. B of mma j and j + 1 (j even) is
//   one 16-byte piece of the position's f16 row in natural k order: b[j / 2] = elements 64 h + 16 t + 8 p ..
//   + 7 with p = (j % 4) / 2.
// Decode: one cvt.rn.f16x2.e4m3x2 per weight pair (exact). Scale: a 16-row tile lies in one 128-row block
// (tiles start at multiples of 16), so the step's eight mmas accumulate into a zeroed f32 fragment that is
// then added, times the block's f32 scale, to the running sum (one scale load per tile and step, the same
// address for the whole warp). No shared-memory staging of weights and no barrier inside a work item's k
// loop; a lane keeps kGuAhead steps (gate_up: 2 x 4 rows x 32 bytes) or kDownAhead pieces (down: 4 x 2 rows
// x 32 bytes) of weight loads in flight, reloading each register slot right after its math.
//
// gate_up: work item = (expert chunk of <= x_rows positions, 16 indices = 16 gate + 16 up rows); block b of
// the persistent grid takes a contiguous run of items (so consecutive tiles of one chunk reuse its staged x
// rows). Warp w takes the 128-k blocks [w nb / 8, (w + 1) nb / 8) of both tiles (nb = hidden / 128; one B
// fragment feeds both). The chunk's x rows are staged as f16 in shared memory (moe_decode_fp8_config.h: xs
// layout) while the first weight loads are in flight; warps' partial sums meet in shared memory in warp
// order. down: block = 16 output rows; pieces (expert chunk of <= 8 positions, one 128-k block) in ascending
// order, warp w takes a contiguous run of them and keeps its sum in registers while the chunk stays the same;
// at a chunk change it adds the chunk's rows into its own tile out_w[warp][token][16] (positions in order);
// the block then sums the 8 tiles in warp order and adds to out once.
#include <cuda_fp16.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe/moe_decode_math.cuh"
#include "kernels/cuda/moe/moe_device_common.cuh"
#include "kernels/cuda/moe/moe_experts_decode_fp8.h"

namespace ms::cuda {
namespace {

using namespace moe_decode_fp8_config;

using dev::ld_stream16;

using dev::word_of;

// One 128-k step of one 16-row tile: row g's weight pieces w0[h] (16 bytes at 64 h + 16 t), row g + 8's
// w1[h], the tile's block scale s, B pieces b[2 h + p] (8 f16 at 64 h + 16 t + 8 p: mma 2 (2 h + p) and
// 2 (2 h + p) + 1).
__device__ __forceinline__ void fp8_tile_step(float (&acc)[4], const uint4 (&w0)[2], const uint4 (&w1)[2],
                                              float s, const uint4 (&b)[4]) {
  float tmp[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t r0 = word_of(w0[j >> 2], j & 3), r1 = word_of(w1[j >> 2], j & 3);
    const uint32_t a[4] = {tc::fp8x2_to_f16x2(r0), tc::fp8x2_to_f16x2(r1), tc::fp8x2_to_f16x2(r0 >> 16),
                           tc::fp8x2_to_f16x2(r1 >> 16)};
    const int j2 = j >> 1;
    tc::mma_f16(tmp, a, (j & 1) == 0 ? b[j2].x : b[j2].z, (j & 1) == 0 ? b[j2].y : b[j2].w);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = fmaf(tmp[i], s, acc[i]);
}

// Stages `rows` x rows of one expert chunk (grouped positions pos0 ..) as f16 (saturated) in shared memory,
// rows xld elements apart, in natural k order (moe_decode_fp8_config.h: xs_ld).
__device__ __forceinline__ void stage_x_rows_f16(const MoeExpertsParams& p, int pos0, int rows, __half* xs,
                                                 int64_t xld, int tid) {
  moe_decode_dev::stage_x_chunk<false, 1>(p, pos0, rows, xs, xld, tid, kThreads);
}

// ---- gate_up --------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads, 2)
    moe_decode_fp8_gate_up_kernel(const MoeExpertsParams p, int x_rows) {
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
  const int nb = H / kBlock;  // 128-k blocks of a row = scale columns
  const int kb0 = warp * nb / kWarps, kb1 = (warp + 1) * nb / kWarps;
  const int steps = kb1 - kb0;  // may be 0 when hidden < 1024: the warp adds zeros
  // Step s of lane (g, t) covers k [k_lane + 128 s + 64 h, + 16) for h = 0, 1: block kb0 + s of the row.
  const int k_lane = kb0 * kBlock + 16 * t;
  const int64_t row_bytes = H;
  const __half* xs_lane = xs + g * xld + k_lane;  // the lane's B row (x row g)
  __half* acth = reinterpret_cast<__half*>(p.act);
  const int it0 = moe_dev::run_start(items, blockIdx.x, gridDim.x);
  const int it1 = moe_dev::run_start(items, blockIdx.x + 1, gridDim.x);

  // The weights of the item being loaded: rows gate g, gate g + 8, up g, up g + 8 (row g + 8 at wp[q] + 8
  // row_bytes) from the lane's k; the scales of its tile's row block (its 16 rows lie in row block tile * 16
  // / 128 of both matrices, scale [inter / 128][nb]) from block kb0.
  const uint8_t* wp[2];
  const float* sp[2];
  auto point = [&](int item) {
    const int tile = item % tiles;
    const MoeExpertWeights& ew = p.experts[ec[item / tiles] & 1023];
    const int64_t idx = static_cast<int64_t>(tile) * kGuIdx + g;
    wp[0] = static_cast<const uint8_t*>(ew.gate) + idx * row_bytes + k_lane;
    wp[1] = static_cast<const uint8_t*>(ew.up) + idx * row_bytes + k_lane;
    const int64_t srow = static_cast<int64_t>(tile * kGuIdx / kBlock) * nb + kb0;
    sp[0] = static_cast<const float*>(ew.gate_scale) + srow;
    sp[1] = static_cast<const float*>(ew.up_scale) + srow;
  };
  uint4 w[kGuAhead][4][2];
  float sc[kGuAhead][2];
  auto load = [&](int s, int u) {
    if (s < steps) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint8_t* a = wp[r >> 1] + (r & 1) * 8 * row_bytes + s * kBlock;
        w[u][r][0] = ld_stream16(a);
        w[u][r][1] = ld_stream16(a + 64);
      }
      sc[u][0] = __ldg(sp[0] + s);
      sc[u][1] = __ldg(sp[1] + s);
    }
  };
  // An item's first kGuAhead steps are loaded before the previous item's epilogue (and the first item's
  // before its x rows are staged): slot u holds the steps s with s % kGuAhead == u.
  if (it0 < it1) {
    point(it0);
#pragma unroll
    for (int u = 0; u < kGuAhead; ++u) load(u, u);
  }
  int staged = -1;  // the work-list entry whose x rows xs holds
  for (int item = it0; item < it1; ++item) {
    const int eci = item / tiles;
    const moe_dev::EcEntry en = moe_dev::ec_entry(p, ec[eci], x_rows);
    const int rows = en.rows, pos0 = en.pos0, tile = item % tiles;
    if (eci != staged) {
      stage_x_rows_f16(p, pos0, rows, xs, xld, tid);
      staged = eci;
    }
    __syncthreads();
    const __half* xb = xs_lane - (g - moe_dev::b_row(g, rows)) * xld;  // b_row: no branch per load
    float acc[2][4] = {};
    for (int s0 = 0; s0 < steps; s0 += kGuAhead) {
#pragma unroll
      for (int u = 0; u < kGuAhead; ++u) {
        const int s = s0 + u;
        if (s >= steps) break;
        uint4 b[4];
#pragma unroll
        for (int j2 = 0; j2 < 4; ++j2)  // j2 = 2 h + p: elements 64 h + 8 p of the lane's k
          b[j2] = *reinterpret_cast<const uint4*>(xb + s * kBlock + 64 * (j2 >> 1) + 8 * (j2 & 1));
        fp8_tile_step(acc[0], w[u][0], w[u][1], sc[u][0], b);
        fp8_tile_step(acc[1], w[u][2], w[u][3], sc[u][1], b);
        load(s + kGuAhead, u);  // the slot's next step goes in flight behind this one's math
      }
    }
    if (item + 1 < it1) {  // every slot is free: the next item's first steps go in flight now
      point(item + 1);
#pragma unroll
      for (int u = 0; u < kGuAhead; ++u) load(u, u);
    }
    // red [warp][gate / up][position][16 rows]; C fragment: rows g / g + 8, positions 2t / 2t + 1.
    float* rw = red + warp * 2 * kChunk * 16;
    moe_dev::store_c_tile(rw, acc[0], g, t);
    moe_dev::store_c_tile(rw + kChunk * 16, acc[1], g, t);
    __syncthreads();  // also: every warp is done reading xs, so the next item may restage it
    if (tid < rows * 16) {
      const int r = tid >> 4, i = tid & 15;
      const float2 sums = moe_dev::sum_gate_up_tiles<kWarps, kChunk>(red, r, i);
      const float gs = sums.x, us = sums.y;
      const float wt = p.topk_weights[p.sorted_slots[pos0 + r]];
      const float v = gs / (1.0f + expf(-gs)) * us * wt;
      reinterpret_cast<uint16_t*>(acth)[static_cast<int64_t>(pos0 + r) * p.inter + tile * kGuIdx + i] =
          tc::f16_sat_bits(v);
    }
    // red is rewritten only after the next item's staging barrier, which every reader above has passed.
  }
}

// ---- down (+ routing weight, already in act, + combine) --------------------------------------------------

__global__ void __launch_bounds__(kDownThreads, kDownMinBlocks)
    moe_decode_fp8_down_kernel(const MoeExpertsParams p) {
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
  const int nbk = p.inter / kBlock;  // pieces per chunk = scale columns of down
  const int pieces = s_nec * nbk;
  const int p_begin = moe_dev::run_start(pieces, warp, kDownWarps);
  const int p_end = moe_dev::run_start(pieces, warp + 1, kDownWarps);
  const int64_t row_bytes = p.inter;
  const int64_t srow = static_cast<int64_t>(row0 / kBlock) * nbk;  // the block's 16 rows: one row block
  const __half* acth = reinterpret_cast<const __half*>(p.act);
  float* scr_w = scr + warp * kChunk * kDownRows;
  float* out_ww = out_w + warp * m * kDownRows;

  int cur = -1, rows = 0, pos0 = 0;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  auto flush = [&]() {
    moe_dev::flush_down_chunk<false>(p, acc, scr_w, out_ww, rows, pos0, 1.f, lane, g, t);
  };
  // Piece pc: lane (g, t) covers k [kb 128 + 64 h + 16 t, + 16), h = 0, 1, of rows row0 + g, + 8 (a quad's
  // load instruction reads 64 contiguous bytes of a row); slot u of the register ring holds piece pc with (pc
  // - p_begin) % kDownAhead == u and is reloaded with piece pc + kDownAhead right after pc's math.
  uint4 w[kDownAhead][2][2];
  float sc[kDownAhead];
  auto load = [&](int pc, int u) {
    if (pc < p_end) {
      const int ei = pc / nbk, kb = pc - ei * nbk;
      const MoeExpertWeights& ew = p.experts[ec[ei] & 1023];
      const uint8_t* wb = static_cast<const uint8_t*>(ew.down) + static_cast<int64_t>(row0 + g) * row_bytes +
                          kb * kBlock + 16 * t;
      w[u][0][0] = ld_stream16(wb);
      w[u][0][1] = ld_stream16(wb + 64);
      w[u][1][0] = ld_stream16(wb + 8 * row_bytes);
      w[u][1][1] = ld_stream16(wb + 8 * row_bytes + 64);
      sc[u] = __ldg(static_cast<const float*>(ew.down_scale) + srow + kb);
    }
  };
#pragma unroll
  for (int u = 0; u < kDownAhead; ++u) load(p_begin + u, u);
  for (int pc0 = p_begin; pc0 < p_end; pc0 += kDownAhead) {
#pragma unroll
    for (int u = 0; u < kDownAhead; ++u) {
      const int pc = pc0 + u;
      if (pc >= p_end) break;
      const int ei = pc / nbk, kb = pc - ei * nbk;
      if (ei != cur) {
        if (cur >= 0) flush();
        cur = ei;
        const int code = ec[ei];
        const int e = code & 1023, chunk = code >> 10;
        rows = min(kChunk, p.expert_counts[e] - chunk * kChunk);
        pos0 = p.expert_offsets[e] + chunk * kChunk;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = 0.f;
      }
      const __half* arow =
          acth + static_cast<int64_t>(pos0 + moe_dev::b_row(g, rows)) * p.inter + kb * kBlock + 16 * t;
      uint4 b[4];
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2)  // j2 = 2 h + p: elements 64 h + 8 p of the lane's k
        b[j2] = __ldg(reinterpret_cast<const uint4*>(arow + 64 * (j2 >> 1) + 8 * (j2 & 1)));
      fp8_tile_step(acc, w[u][0], w[u][1], sc[u], b);
      load(pc + kDownAhead, u);
    }
  }
  if (cur >= 0) flush();
  __syncthreads();
  moe_dev::add_down_tiles(p, out_w, m, row0, tid);
}

bool aligned(const void* ptr, size_t a) {
  return reinterpret_cast<uintptr_t>(ptr) % a == 0;
}

}  // namespace

moe_decode_fp8_config::Shape moe_decode_fp8_shape(const MoeExpertsParams& p) {
  return {p.format == MoeWeightFormat::FP8Block, p.fp8_block, p.hidden, p.inter, p.m, p.top_k, p.n_experts};
}

bool moe_experts_decode_fp8_applies(const MoeExpertsParams& p) {
  if (p.disable_stream || p.disable_decode || !p.experts_aligned16 || p.format != MoeWeightFormat::FP8Block)
    return false;
  if (!aligned(p.x, 16) || p.ldx % 4 != 0 || !aligned(p.act, 16)) return false;
  return choose(moe_decode_fp8_shape(p), limits_of(current_device_caps())).use;
}

void moe_experts_decode_fp8(const MoeExpertsParams& p, cudaStream_t stream) {
  moe_experts_check(p);
  if (p.m == 0) return;
  MS_CHECK(p.format == MoeWeightFormat::FP8Block, "moe_experts_decode_fp8: weights must be FP8Block");
  MS_CHECK(p.experts_aligned16,
           "moe_experts_decode_fp8: experts_aligned16 is not set (weight pointers unchecked)");
  MS_CHECK(aligned(p.x, 16) && p.ldx % 4 == 0,
           "moe_experts_decode_fp8: x must be 16-byte aligned, ldx % 4 == 0");
  MS_CHECK(aligned(p.act, 16), "moe_experts_decode_fp8: act workspace must be 16-byte aligned");
  const DeviceCaps caps = current_device_caps();
  const Config c = choose(moe_decode_fp8_shape(p), limits_of(caps));
  MS_CHECK(c.use, "moe_experts_decode_fp8: {}", c.why);
  check_smem(caps, "moe_decode_fp8_gate_up", c.smem_gate_up);
  check_smem(caps, "moe_decode_fp8_down", c.smem_down);
  CUDA_CHECK(cudaFuncSetAttribute(moe_decode_fp8_gate_up_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_gate_up)));
  CUDA_CHECK(cudaFuncSetAttribute(moe_decode_fp8_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_down)));
  moe_decode_fp8_gate_up_kernel<<<c.grid_gate_up, kThreads, c.smem_gate_up, stream>>>(p, c.x_rows);
  CUDA_CHECK(cudaGetLastError());
  moe_decode_fp8_down_kernel<<<c.grid_down, kDownThreads, c.smem_down, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ms::cuda
