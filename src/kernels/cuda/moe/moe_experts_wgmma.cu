// Grouped expert GEMMs on warpgroup MMA (sm_90a), one launch per projection, warp-specialised.
//
// Block: 384 threads = 3 warpgroups. Warpgroup 0 produces (copies), warpgroups 1 and 2 consume; block tile
// 128 grouped rows x BN weight rows (128 or 256), 64 k per stage. Consumer c (0, 1) owns rows 64 c .. 64 c +
// 63 and all BN columns: wgmma m64nBNk16, BN / 2 f32 accumulators a thread (wgmma_sm90.cuh gives the layout:
// warp w of the warpgroup holds rows 16 w + g, 16 w + g + 8, n8 block j columns 8 j + 2 t, 8 j + 2 t + 1).
//   gate_up: tile rows 0 .. BN/2 - 1 are gate rows nt * BN/2 + r, rows BN/2 .. BN - 1 the matching up rows,
//            so n8 block j (gate) and j + BN/16 (up) of one thread hold gate and up of the same act columns
//            nt * BN/2 + 8 j + 2 t (+1): SiLU-and-mul in registers.
//   down:    tile row r is down row nt * BN + r = output column.
//
// Shared ring (stages S): stage s holds A [128][64] bf16 and the stage's weights; bf16 tiles (A, W [BN][64])
// are in the K-major 128-byte swizzle (wgmma_sm90.cuh), each 1024-aligned.
//
// NVFP4, consumer expansion (MoeWgExpand::Consumer, the default): the ring stage holds A and the raw W tile
// ([BN][32] packed bytes, then [BN][4] e4m3 scales); the bf16 W tiles live in 3 separate buffers. Why: with
// the producer warpgroup both waiting on its own copies and expanding 32 KB of bf16 a stage, the ring ran
// dry (an H200 at 8192 GLM-5 tokens: tensor pipe 29% busy, consumers mostly waiting on `full`). Now the
// producer only copies (A 16 KB + raw 9 KB a stage, so S = 5 fits where the bf16 ring allowed 4 and the
// raw ring 3), and the 256 consumer threads expand stage q (one W row each) while the tensor cores still
// run stage q - 1: work the idle consumers did not have, in the shadow of the asynchronous MMA. Stage q:
// wait full[slot]; expand raw[slot] into W buffer q % 3; fence.proxy.async; named barrier 1 (256 consumer
// threads: every row written before either warpgroup's wgmma reads the tile); wgmma; wait until one group
// is pending. Buffer q % 3 was last read by the MMAs of stage q - 3, which both warpgroups waited for
// before they arrived at the barrier of stage q - 1. MoeWgExpand::Producer keeps the earlier layout below
// (MOESERVE_MOE_WGMMA_EXPAND=producer) for A/B timing.
//
// FP8Block (always consumer expansion): the raw stage is [BN][64] e4m3 (16-byte pieces of a row rotated by
// moe_dev::fp8_raw_offset against bank conflicts), then one f32 scale per 64-row group of the tile (BN / 64
// of them, copied by producer threads 0 .. BN / 64 - 1): a 64-row group starts at a multiple of 64 of its
// matrix (gate_up halves at nt * BN / 2, down halves at nt * BN and + BN / 2) and a 64-k stage at a multiple
// of 64, so with fp8_block % 64 == 0 each group lies in one scale block for the whole stage. A 256-row tile
// spans two 128-row blocks (down) or two matrices (gate_up); its groups take their own block's scale. The
// consumer thread of row r expands it as bf16(e4m3 * scale of group r / 64): 64 + 16 bytes copied a row and
// stage instead of 128, S = 4 at bn 256 (H200, 256 experts) as the bf16 ring.
//
// NVFP4, producer expansion / BF16: weights in the bf16 ring; NVFP4 lands first in a raw ring of S - 1
// stages and the producer expands it into the W tile.
//
// Producer (128 threads, stage counter q over all of the block's (item, k step) pairs, slot q % S):
//   wait empty[slot] (phase q / S - 1) unless q < S; issue cp.async for A (row (tid / 8) + 16 i, chunk
//   tid % 8, zero-filled past the item's rows), W (BF16: rows (tid / 8) + 16 i, chunk tid % 8; NVFP4: raw
//   rows tid + 128 j, 32 data bytes and 4 scale bytes; with consumer expansion the data bytes as 16-byte
//   halves tid % 2 of rows tid / 2 + 64 j); commit. Once S - 1 groups are in flight it finishes
//   the oldest: cp.async.wait_group S - 2 (its own copies landed), NVFP4 with producer expansion: expand the
//   raw rows it copied itself into the W tile, fence.proxy.async (generic writes -> wgmma's async proxy),
//   arrive on full[slot] (128 arrivals complete the phase).
// Consumers (stage counter q in the same order): wait full[slot] (phase q / S), 4 wgmma k16 steps, commit,
// wait until one group is pending (the previous stage's MMAs are done), then one lane per warp arrives on
// empty[previous slot] (8 arrivals). S - 1 stages in flight on the producer side and one held by the MMA in
// flight keep the handshake deadlock-free (the producer finishes stage q - S + 2 before it waits for slot
// q - S).
//
// Tensor-copy loads (MoeWgLoad::Tma, kTma; the default where the caller passes per-expert tensor maps):
// the launcher first copies the bf16 activation rows into grouped order (xg[pos] = xb[token of pos]), so a
// stage's A tile is 128 consecutive rows; thread 0 of the producer warpgroup alone waits on `empty`, arrives
// on `full` with the stage's byte count (expect_tx) and issues the tensor copies (producer_tma), the other
// 127 producer threads return. A and bf16 W boxes land in the 128-byte swizzle by the copy itself; NVFP4
// codes and scales land raw and the consumers expand them as above (scale rows: the 16-byte aligned piece
// that holds the stage's 4 scales, since a box must start 16-byte aligned). `full` then completes on one
// arrival plus the bytes. Why: with cp.async the same 128 threads issued ~1000 copies a stage and waited on
// their own loads (tensor pipe 29% busy at 8192 GLM-5 tokens). FP8Block keeps cp.async (its raw pieces are
// rotated per row and its scale is one f32 a group: moe_wgmma_tma_unsupported). Before a Tma launch the host
// checks every map (tma_check.h: addresses, strides, box sizes, swizzle) and every box of a stage (shared
// destinations 1024 / 128-aligned, innermost starts 16-byte aligned, the boxes' bytes = the expect_tx count).
//
// Registers layout (MoeWgExpand::Registers, NVFP4 with tensor copies; consumer_rs below): the product taken
// transposed, 128 weight rows x up to 256 grouped rows a block, each consumer thread expanding its own wgmma
// A fragments into registers (no bf16 W tile, no consumer barrier); the activations carry k permuted inside
// each 64-column block (rs_column_of_k); the producer takes the smallest of four activation boxes (64 .. 256
// rows) that holds the item and takes items from a launch counter (dynamic, instead of b, b + grid, ...).
//
// The ring's slot and phase parity advance by a wrapping counter (RingPos), not q % S and q / S: S is a
// launch parameter and the divisions showed among the consumers' most stalled instructions.
//
// Every mbarrier wait is bounded (wg::mbar_wait_bounded): after about 4 s it records the barrier (full[s] =
// s, empty[s] = kEmptyTag | s), block and thread in mapped host memory and traps; the next launch and the
// process's exit report it.
//
// Work items as in moe_experts_mma.cu: (expert, N tile, M tile), M tile fastest; expert e has
// ceil(count_e / 128) M tiles; every block scans the counts into a shared prefix and maps items by binary
// search; block b takes items b, b + grid, ... (producer and consumers walk the same list). A consumer whose
// 64 rows are all past the item's rows skips its MMAs (still hands the stages back).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/common/cp_async.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/common/tma_check.h"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe/moe_device_common.cuh"
#include "kernels/cuda/moe/moe_experts_wgmma.h"
#include "kernels/cuda/moe/moe_grouped_launch.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = kMoeWgThreads;
constexpr int kBM = kMoeWgBM;
constexpr int kBK = kMoeWgBK;
constexpr int kRowBytes = kBK * 2;   // one bf16 tile row: 128 bytes, the swizzle width
constexpr int kRawRow = kBK / 2;     // packed NVFP4 bytes of one row per stage
constexpr int kRawScale = kBK / 16;  // e4m3 scale bytes of one row per stage
constexpr int kFp8Row = kBK;         // e4m3 bytes of one FP8Block row per stage
constexpr int kEmptyArrivals = 8;    // one per consumer warp
constexpr int kFullArrivals = 128;   // every producer thread (cp.async loads)
constexpr int kTmaScaleRow = kMoeWgTmaScaleRow;
constexpr int kTmaScaleSteps = kTmaScaleRow / kRawScale;  // k steps whose scales one Tma scale piece holds
// Tensor maps per expert (Tma loads): gate, up, down data, then gate, up, down scales (NVFP4; else unused),
// boxes of half the layout's tile rows (moe_wgmma_bn / 2); then the same six with boxes of kMoeWgRsBN / 2
// rows for the Registers layout (NVFP4 only).
constexpr int kMapsPerExpert = 12;
// Barrier numbers in a timeout record: full[s] = s, empty[s] = kEmptyTag | s.
constexpr uint32_t kEmptyTag = 1u << 16;
static_assert(kThreads == 384 && kBM == 128 && kBK == 64, "the thread mappings below assume these");

struct WgParams {
  const __nv_bfloat16* __restrict__ a;           // gate_up: xb [m, hidden]; down: act [slots, inter]
  int64_t lda = 0;                               // elements
  const int32_t* __restrict__ counts;            // [n_experts]
  const int32_t* __restrict__ offsets;           // [n_experts + 1]
  const int32_t* __restrict__ sorted_slots;      // [slots]
  const MoeExpertWeights* __restrict__ experts;  // [n_experts]
  __nv_bfloat16* __restrict__ act;               // gate_up out: [slots, inter], row = grouped position
  float* __restrict__ slot_out;                  // down out: [slots, hidden], row = slot
  int top_k = 0, n_experts = 0;
  int k = 0;            // hidden (gate_up) or inter (down)
  int n_out = 0;        // inter (gate_up: act columns) or hidden (down)
  int n_tiles = 0;      // gate_up: inter / (BN / 2); down: hidden / BN
  int stages = 0;       // ring depth S, kMoeWgMinStages .. kMoeWgMaxStages
  int fp8_block = 128;  // FP8Block scale block edge, a multiple of 64
  int fp8_scols = 0;    // FP8Block scale columns: ceil(k / fp8_block)
  // Tma loads: [n_experts][kMapsPerExpert] maps (moe_experts_wgmma_maps); entries of experts without rows
  // are never read.
  const CUtensorMap* __restrict__ wmaps;
  wg::MbarTimeout* hang;  // where a timed-out mbarrier wait is recorded (may be null)
  // Registers layout: the launch's item counter (zero at launch; the grouping copy before gate_up clears
  // it): each block's producer takes the next item by atomicAdd instead of items b, b + grid, ...
  int* item_next = nullptr;
};

// The A (activation rows) tensor maps of a Tma launch: m[0] box {64, 128} for the 128-row layouts; the
// Registers layout m[i] box {64, 64 (i + 1)}, the producer taking the smallest box that holds an item's rows.
struct AMaps {
  CUtensorMap m[4];
};

// Byte offsets inside the 1024-aligned dynamic window (moe_wgmma_smem_bytes sizes the same).
struct WgLayout {
  uint32_t a, w, raw, bars, table;
  uint32_t a_stage, w_stage, raw_stage;
};

// cx: expanded by the consumers (3 W buffers, a raw ring of `stages`); else the bf16 ring of `stages` and,
// for NVFP4, a raw ring of stages - 1. Raw stages (moe_wgmma_raw_stage_bytes): NVFP4 bn x 36 bytes (tma: bn x
// (32 + kTmaScaleRow)), FP8Block bn x 64 + 128.
// rs (MoeWgExpand::Registers): the consumer layout without W buffers.
__host__ __device__ inline WgLayout wg_layout(int bn, int stages, MoeMmaFormat f, bool cx, bool tma,
                                              bool rs = false) {
  WgLayout L;
  L.a_stage = (rs ? kMoeWgRsBM : kBM) * kRowBytes;
  L.w_stage = static_cast<uint32_t>(bn) * kRowBytes;
  L.raw_stage = f == MoeMmaFormat::FP8Block
                    ? static_cast<uint32_t>(bn) * kFp8Row + 128
                    : static_cast<uint32_t>(bn) * (kRawRow + (tma ? kTmaScaleRow : kRawScale));
  L.a = 0;
  L.w = L.a + stages * L.a_stage;
  L.raw = L.w + (rs ? 0 : cx ? kMoeWgConsumerWBufs : stages) * L.w_stage;
  const uint32_t raw_bytes = f != MoeMmaFormat::BF16 ? (cx ? stages : stages - 1) * L.raw_stage : 0;
  L.bars = L.raw + (raw_bytes + 127) / 128 * 128;
  L.table = L.bars + (2 * stages * 8 + 127) / 128 * 128;
  return L;
}

// Bytes the tensor copies of one Tma stage bring (the expect_tx count; the launcher checks it against the
// boxes, check_tma_stages): A [128][64] bf16, then BF16 W [bn][64] bf16 or NVFP4 bn rows of 32 code bytes and
// kTmaScaleRow scale bytes.
__host__ __device__ constexpr uint32_t tma_stage_bytes(MoeMmaFormat f, int bn, int bm = kBM) {
  return static_cast<uint32_t>(bm * kRowBytes) +
         static_cast<uint32_t>(bn) * (f == MoeMmaFormat::NVFP4 ? kRawRow + kTmaScaleRow : kRowBytes);
}
// The mbarrier transaction count holds at most 2^20 - 1 bytes.
static_assert(tma_stage_bytes(MoeMmaFormat::BF16, 256) < (1u << 20) &&
                  tma_stage_bytes(MoeMmaFormat::NVFP4, kMoeWgRsBN, kMoeWgRsBM) < (1u << 20),
              "a stage's bytes exceed the tx count");

using dev::cp_async16;
using dev::cp_async4;
using dev::cp_async_commit;
using dev::cp_async_wait_pending;

// Expands row r of a raw NVFP4 stage (BN rows of 32 packed bytes, then BN rows of kScaleRow bytes whose bytes
// scale_at .. scale_at + 3 are the stage's e4m3 scales; scale_at a multiple of 4) into row r of the swizzled
// bf16 W tile.
template <int BN, int kScaleRow = kRawScale>
__device__ __forceinline__ void expand_row(const unsigned char* raw, unsigned char* wt, int r,
                                           int scale_at = 0) {
  const uint4 q0 = *reinterpret_cast<const uint4*>(raw + r * kRawRow);
  const uint4 q1 = *reinterpret_cast<const uint4*>(raw + r * kRawRow + 16);
  const uint32_t sc = *reinterpret_cast<const uint32_t*>(raw + BN * kRawRow + r * kScaleRow + scale_at);
  // e4m3 -> bf16 is exact; code x scale has at most 6 significant bits: exact in bf16 too.
  __nv_bfloat162 s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = __float2bfloat162_rn(moe_dev::fp8_e4m3_value((sc >> (8 * i)) & 0xffu));
  // Chunk c (k 8c .. 8c + 7) is packed word c of the row; scale group c / 2.
  unsigned char* row = wt + r * kRowBytes;
  const int x = r & 7;
  *reinterpret_cast<uint4*>(row + ((0 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q0.x, s[0]);
  *reinterpret_cast<uint4*>(row + ((1 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q0.y, s[0]);
  *reinterpret_cast<uint4*>(row + ((2 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q0.z, s[1]);
  *reinterpret_cast<uint4*>(row + ((3 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q0.w, s[1]);
  *reinterpret_cast<uint4*>(row + ((4 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q1.x, s[2]);
  *reinterpret_cast<uint4*>(row + ((5 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q1.y, s[2]);
  *reinterpret_cast<uint4*>(row + ((6 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q1.z, s[3]);
  *reinterpret_cast<uint4*>(row + ((7 ^ x) << 4)) = moe_dev::e2m1x8_to_bf16(q1.w, s[3]);
}

// Expands row r of a raw FP8Block stage (bn rows of 64 e4m3 in moe_dev::fp8_raw_offset's piece order, then
// one f32 scale per 64-row group) into row r of the swizzled bf16 W tile. Piece i holds k 16 i .. 16 i + 15
// = bf16 chunks 2 i, 2 i + 1.
template <int BN>
__device__ __forceinline__ void expand_row_fp8(const unsigned char* raw, unsigned char* wt, int r) {
  const float s = *reinterpret_cast<const float*>(raw + BN * kFp8Row + (r >> 6) * 4);
  unsigned char* row = wt + r * kRowBytes;
  const int x = r & 7;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(raw + moe_dev::fp8_raw_offset(r, i));
    *reinterpret_cast<uint4*>(row + (((2 * i) ^ x) << 4)) = moe_dev::e4m3x8_to_bf16(v.x, v.y, s);
    *reinterpret_cast<uint4*>(row + (((2 * i + 1) ^ x) << 4)) = moe_dev::e4m3x8_to_bf16(v.z, v.w, s);
  }
}

// Named barrier 1 over the two consumer warpgroups (barrier 0 is __syncthreads, used only before the roles
// split).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}

struct Item {
  int e, nt, rows, pos0;
};

// The ring position of stage counter q: slot q % S and phase parity (q / S) & 1, advanced without dividing
// (S is a launch parameter, and the consumers' stall samples charged a division by it, about 20 dependent
// instructions with a reciprocal, a few times a stage).
struct RingPos {
  uint32_t slot = 0, parity = 0;
  __device__ __forceinline__ void next(uint32_t stages) {
    if (++slot == stages) {
      slot = 0;
      parity ^= 1u;
    }
  }
};

// item -> expert (largest e with s_mt[e] <= item / n_tiles), N tile, M tile, rows of the tile, first
// position.
template <int BM = kBM>
__device__ __forceinline__ Item decode_item(int item, const int* s_mt, const WgParams& p) {
  const int lo = moe_dev::expert_of_m_tile(item / p.n_tiles, s_mt, p.n_experts);
  Item it;
  it.e = lo;
  const int mt_e = s_mt[lo + 1] - s_mt[lo];
  const int local = item - s_mt[lo] * p.n_tiles;
  it.nt = local / mt_e;
  const int m0 = (local % mt_e) * BM;
  it.rows = min(BM, p.counts[lo] - m0);
  it.pos0 = p.offsets[lo] + m0;
  return it;
}

template <int BN, MoeMmaFormat F, bool kGateUp, bool kCx>
__device__ __forceinline__ void producer(const WgParams& p, const WgLayout& L, uint32_t sbase,
                                         unsigned char* smem, uint64_t* full, uint64_t* empty,
                                         const int* s_mt, int total_items) {
  const int tid = threadIdx.x;  // 0 .. 127
  const int S = p.stages, inflight = S - 1;
  const int nk = p.k / kBK;
  const int chunk = tid & 7;
  uint32_t q = 0, qf = 0;  // stages issued, stages finished (handed to the consumers)

  // Hands stage qf to the consumers once at most `pending` of this thread's copy groups are outstanding.
  auto finish = [&](int pending) {
    cp_async_wait_pending(pending);
    const uint32_t slot = qf % S;
    if constexpr (F == MoeMmaFormat::NVFP4 && !kCx) {
      const unsigned char* raw = smem + L.raw + (qf % inflight) * L.raw_stage;
      unsigned char* wt = smem + L.w + slot * L.w_stage;
#pragma unroll
      for (int j = 0; j < BN / 128; ++j) expand_row<BN>(raw, wt, tid + 128 * j);
    }
    wg::fence_proxy_async();
    wg::mbar_arrive(&full[slot]);
    ++qf;
  };

  for (int item = blockIdx.x; item < total_items; item += gridDim.x) {
    const Item it = decode_item(item, s_mt, p);
    const MoeExpertWeights ew = p.experts[it.e];
    // A rows (tid / 8) + 16 i of the tile: source row index (token for gate_up, position for down), -1 past
    // the item's rows (zero-filled).
    int a_row[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = (tid >> 3) + 16 * i;
      a_row[i] = -1;
      if (r < it.rows) {
        const int pos = it.pos0 + r;
        a_row[i] = kGateUp ? p.sorted_slots[pos] / p.top_k : pos;
      }
    }
    // The two halves of the W tile: gate_up: gate / up rows nt * BN/2 ..; down: down rows nt * BN and
    // nt * BN + BN/2.
    const uint8_t* part_data[2];
    const uint8_t* part_scale[2] = {nullptr, nullptr};
    const float* fp8_scale = nullptr;  // FP8Block, tid < BN / 64: scale row of 64-row group tid
    {
      const int64_t row_bytes = F == MoeMmaFormat::BF16       ? int64_t{p.k} * 2
                                : F == MoeMmaFormat::FP8Block ? int64_t{p.k}
                                                              : int64_t{p.k} / 2;
      const int64_t srow_bytes = p.k / 16;
      int64_t r0, r1;
      const void *d0, *d1, *s0, *s1;
      if constexpr (kGateUp) {
        r0 = r1 = static_cast<int64_t>(it.nt) * (BN / 2);
        d0 = ew.gate;
        d1 = ew.up;
        s0 = ew.gate_scale;
        s1 = ew.up_scale;
      } else {
        r0 = static_cast<int64_t>(it.nt) * BN;
        r1 = r0 + BN / 2;
        d0 = d1 = ew.down;
        s0 = s1 = ew.down_scale;
      }
      part_data[0] = static_cast<const uint8_t*>(d0) + r0 * row_bytes;
      part_data[1] = static_cast<const uint8_t*>(d1) + r1 * row_bytes;
      if constexpr (F == MoeMmaFormat::NVFP4) {
        part_scale[0] = static_cast<const uint8_t*>(s0) + r0 * srow_bytes;
        part_scale[1] = static_cast<const uint8_t*>(s1) + r1 * srow_bytes;
      }
      if constexpr (F == MoeMmaFormat::FP8Block) {
        // Thread tid < BN / 64 copies the scale of 64-row group tid: its rows lie in one scale block (the
        // group starts at a multiple of 64 of its matrix and fp8_block % 64 == 0), the scale row of that
        // block, column kc / (fp8_block / 64) at stage kc.
        if (tid < BN / 64) {
          const int half = tid < BN / 128 ? 0 : 1;
          const int64_t grow = (half ? r1 : r0) + tid * 64 - half * (BN / 2);
          fp8_scale = static_cast<const float*>(half ? s1 : s0) + (grow / p.fp8_block) * p.fp8_scols;
        }
      }
    }

    for (int kc = 0; kc < nk; ++kc) {
      const uint32_t slot = q % S;
      if (q >= static_cast<uint32_t>(S))
        wg::mbar_wait_bounded(&empty[slot], (q / S - 1) & 1u, kEmptyTag | slot, p.hang);
      const uint32_t a_base = sbase + L.a + slot * L.a_stage;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = (tid >> 3) + 16 * i;
        const __nv_bfloat16* src =
            a_row[i] >= 0 ? p.a + static_cast<int64_t>(a_row[i]) * p.lda + kc * kBK + chunk * 8 : p.a;
        cp_async16(a_base + wg::sw128_offset(r, chunk), src, a_row[i] >= 0 ? 16 : 0);
      }
      if constexpr (F == MoeMmaFormat::BF16) {
        const uint32_t w_base = sbase + L.w + slot * L.w_stage;
        const int64_t row_bytes = int64_t{p.k} * 2;
#pragma unroll
        for (int i = 0; i < BN / 16; ++i) {
          const int r = (tid >> 3) + 16 * i;
          const int half = i < BN / 32 ? 0 : 1;
          const int lr = r - half * (BN / 2);
          cp_async16(w_base + wg::sw128_offset(r, chunk),
                     part_data[half] + lr * row_bytes + kc * kRowBytes + chunk * 16);
        }
      } else if constexpr (F == MoeMmaFormat::FP8Block) {
        // Four neighbouring threads copy one row's 64 bytes (two whole 32-byte sectors); rows (tid / 4) + 32
        // j.
        const uint32_t raw_base = sbase + L.raw + slot * L.raw_stage;
        const int piece = tid & 3;
#pragma unroll
        for (int j = 0; j < BN / 32; ++j) {
          const int r = (tid >> 2) + 32 * j;
          const int half = r < BN / 2 ? 0 : 1;
          const int lr = r - half * (BN / 2);
          const uint8_t* d =
              (half ? part_data[1] : part_data[0]) + lr * int64_t{p.k} + kc * kFp8Row + piece * 16;
          cp_async16(raw_base + moe_dev::fp8_raw_offset(r, piece), d);
        }
        if (tid < BN / 64) cp_async4(raw_base + BN * kFp8Row + tid * 4, fp8_scale + (kc * kBK) / p.fp8_block);
      } else {
        const uint32_t raw_base = sbase + L.raw + (kCx ? slot : q % inflight) * L.raw_stage;
        const int64_t row_bytes = p.k / 2, srow_bytes = p.k / 16;
        if constexpr (kCx) {
          // The consumers wait for all 128 threads' copies, so any mapping works: two neighbouring threads
          // copy the two halves of one row's 32 bytes, so each warp-wide copy reads 16 whole 32-byte sectors
          // (not 32 half sectors): half the requests to L2 for the packed data.
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) {
            const int r = (tid >> 1) + 64 * j, h16 = (tid & 1) * 16;
            const int half = r < BN / 2 ? 0 : 1;
            const int lr = r - half * (BN / 2);
            const uint8_t* d = (half ? part_data[1] : part_data[0]) + lr * row_bytes + kc * kRawRow + h16;
            cp_async16(raw_base + r * kRawRow + h16, d);
          }
#pragma unroll
          for (int j = 0; j < BN / 128; ++j) {
            const int r = tid + 128 * j;
            const int half = r < BN / 2 ? 0 : 1;
            const int lr = r - half * (BN / 2);
            const uint8_t* sc = half ? part_scale[1] : part_scale[0];
            cp_async4(raw_base + BN * kRawRow + r * kRawScale, sc + lr * srow_bytes + kc * kRawScale);
          }
        } else {
          // Producer expansion: thread tid expands rows tid + 128 j, so it copies exactly those (its own
          // cp.async.wait_group is all that orders the copies before its expansion).
#pragma unroll
          for (int j = 0; j < BN / 128; ++j) {
            const int r = tid + 128 * j;
            const int half = r < BN / 2 ? 0 : 1;
            const int lr = r - half * (BN / 2);
            // Selects, not a run-time index into the arrays (which would put them in local memory).
            const uint8_t* d = (half ? part_data[1] : part_data[0]) + lr * row_bytes + kc * kRawRow;
            const uint8_t* sc = half ? part_scale[1] : part_scale[0];
            cp_async16(raw_base + r * kRawRow, d);
            cp_async16(raw_base + r * kRawRow + 16, d + 16);
            cp_async4(raw_base + BN * kRawRow + r * kRawScale, sc + lr * srow_bytes + kc * kRawScale);
          }
        }
      }
      cp_async_commit();
      ++q;
      if (q - qf == static_cast<uint32_t>(inflight)) finish(inflight - 1);
    }
  }
  while (qf < q) finish(0);
}

// Tma loads: thread 0 alone issues every copy (the other producer threads return at once). Stage q, slot
// q % S: wait empty[slot] (phase q / S - 1) unless q < S; arrive on full[slot] announcing the stage's bytes;
// tensor copies that complete on full[slot]:
//   A:     amaps box {64 k, 128 rows} at (64 kc, pos0), 128-byte swizzle             16384 bytes
//          (Registers layout: the box of 64 nb rows, nb = the item's rows / 64 rounded up; 8192 nb bytes)
//   BF16:  two boxes {64 k, BN/2 rows} (the W tile's halves), 128-byte swizzle          2 x 64 BN bytes
//   NVFP4: two code boxes {32 bytes, BN/2 rows} at (32 kc, row), raw rows 0 .. BN - 1  2 x 16 BN bytes
//          two scale boxes {16 bytes, BN/2 rows} at (16 (kc / 4), row) after the codes 2 x 8 BN bytes
//          (the aligned piece holding the stage's scales at 4 (kc % 4): a box must start 16-byte aligned)
// = the expect_tx count (boxes past a tensor's end are zero-filled and still counted).
// Every box's innermost start, in bytes, is a multiple of 16 (asserted below): the hardware faults on others.
// BM: grouped rows of the A box (128; the Registers layout 256); kMapBase: the first of the expert's maps
// (0; the Registers layout's maps of 64-row boxes at kMapsPerExpert / 2).
// s_item (BM == kMoeWgRsBM: the Registers layout): items are taken from p.item_next one at a time; the item
// index goes to s_item[slot] of its first stage before that stage's arrival (release), and once the counter
// passes total_items a stage of no bytes carries -1 to end the consumers.
template <int BN, MoeMmaFormat F, bool kGateUp, int BM = kBM, int kMapBase = 0>
__device__ __forceinline__ void producer_tma(const WgParams& p, const AMaps* amaps, const WgLayout& L,
                                             uint32_t sbase, uint64_t* full, uint64_t* empty, const int* s_mt,
                                             int total_items, int* s_item = nullptr) {
  if (threadIdx.x != 0) return;
  constexpr bool kNv = F == MoeMmaFormat::NVFP4;
  static_assert(BM == kBM || BM == kMoeWgRsBM, "A boxes of 128 rows, or of 64 .. 256 (Registers layout)");
  static_assert(kRowBytes == 64 * 2 && kRawRow == 32 && kRawScale == 4, "box sizes above");
  static_assert(
      kRowBytes % 16 == 0 && kRawRow % 16 == 0 && kTmaScaleRow % 16 == 0 && kTmaScaleRow % kRawScale == 0,
      "every box's innermost start coordinate (64 kc bf16, 32 kc and 16 (kc / 4) bytes) must be a "
      "multiple of 16 bytes");
  const int S = p.stages;
  const int nk = p.k / kBK;
  uint32_t q = 0;
  RingPos rp;
  int last_e = -1;
  const CUtensorMap *d0 = nullptr, *d1 = nullptr, *s0 = nullptr, *s1 = nullptr;
  constexpr bool kDynamic = BM == kMoeWgRsBM;
  for (int item = kDynamic ? atomicAdd(p.item_next, 1) : static_cast<int>(blockIdx.x);;) {
    if constexpr (kDynamic) {
      if (item >= total_items) {
        // The end: one more stage, no bytes, s_item -1.
        const uint32_t slot = rp.slot;
        if (q >= static_cast<uint32_t>(S))
          wg::mbar_wait_bounded(&empty[slot], rp.parity ^ 1u, kEmptyTag | slot, p.hang);
        s_item[slot] = -1;
        wg::mbar_arrive(&full[slot]);
        return;
      }
    } else if (item >= total_items) {
      return;
    }
    const Item it = decode_item<BM>(item, s_mt, p);
    if (it.e != last_e) {
      const CUtensorMap* em = p.wmaps + static_cast<int64_t>(it.e) * kMapsPerExpert + kMapBase;
      d0 = kGateUp ? em : em + 2;
      d1 = kGateUp ? em + 1 : em + 2;
      s0 = kGateUp ? em + 3 : em + 5;
      s1 = kGateUp ? em + 4 : em + 5;
      wg::tmap_acquire(d0);
      wg::tmap_acquire(d1);
      if constexpr (kNv) {
        wg::tmap_acquire(s0);
        wg::tmap_acquire(s1);
      }
      last_e = it.e;
    }
    // Weight rows of the W tile's two halves: gate_up gate / up rows nt * BN/2 ..; down rows nt * BN and
    // nt * BN + BN/2.
    const int r0 = kGateUp ? it.nt * (BN / 2) : it.nt * BN;
    const int r1 = kGateUp ? r0 : r0 + BN / 2;
    const int nb = BM == kBM ? 2 : (it.rows + 63) / 64;  // 64-row blocks of the A box
    const CUtensorMap* tmap_a = &amaps->m[BM == kBM ? 0 : nb - 1];
    const uint32_t stage_bytes = tma_stage_bytes(F, BN, 64 * nb);
    for (int kc = 0; kc < nk; ++kc) {
      const uint32_t slot = rp.slot;
      // Round q / S >= 1 waits for the consumers' release of round q / S - 1 (parity flipped).
      if (q >= static_cast<uint32_t>(S))
        wg::mbar_wait_bounded(&empty[slot], rp.parity ^ 1u, kEmptyTag | slot, p.hang);
      if (kDynamic && kc == 0) s_item[slot] = item;
      wg::mbar_arrive_expect_tx(&full[slot], stage_bytes);
      wg::tma_load_2d(sbase + L.a + slot * L.a_stage, tmap_a, kc * kBK, it.pos0, &full[slot]);
      if constexpr (!kNv) {
        const uint32_t w = sbase + L.w + slot * L.w_stage;
        wg::tma_load_2d(w, d0, kc * kBK, r0, &full[slot]);
        wg::tma_load_2d(w + (BN / 2) * kRowBytes, d1, kc * kBK, r1, &full[slot]);
      } else {
        const uint32_t raw = sbase + L.raw + slot * L.raw_stage;
        wg::tma_load_2d(raw, d0, kc * kRawRow, r0, &full[slot]);
        wg::tma_load_2d(raw + (BN / 2) * kRawRow, d1, kc * kRawRow, r1, &full[slot]);
        const int sc = (kc / kTmaScaleSteps) * kTmaScaleRow;
        wg::tma_load_2d(raw + BN * kRawRow, s0, sc, r0, &full[slot]);
        wg::tma_load_2d(raw + BN * kRawRow + (BN / 2) * kTmaScaleRow, s1, sc, r1, &full[slot]);
      }
      ++q;
      rp.next(S);
    }
    item = kDynamic ? atomicAdd(p.item_next, 1) : item + static_cast<int>(gridDim.x);
  }
}

template <int BN, MoeMmaFormat F, bool kGateUp, bool kCx, bool kTma>
__device__ __forceinline__ void consumer(const WgParams& p, const WgLayout& L, uint32_t sbase,
                                         unsigned char* smem, uint64_t* full, uint64_t* empty,
                                         const int* s_mt, int total_items, int cw) {
  static_assert(!kCx || F != MoeMmaFormat::BF16, "consumer expansion is an NVFP4 / FP8Block layout");
  static_assert(kCx || F != MoeMmaFormat::FP8Block, "FP8Block tiles are expanded by the consumers");
  static_assert(!kTma || F != MoeMmaFormat::FP8Block, "FP8Block is not loaded by tensor copies");
  static_assert(!kTma || kCx || F == MoeMmaFormat::BF16, "Tma loads expand NVFP4 in the consumers");
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int S = p.stages;
  const int nk = p.k / kBK;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  RingPos rp;                        // stage counter q's slot and parity
  uint32_t prev = 0, wbuf_next = 0;  // the previous stage's slot; W buffer q % 3

  for (int item = blockIdx.x; item < total_items; item += gridDim.x) {
    const Item it = decode_item(item, s_mt, p);
    const bool active = wg::warp_uniform(cw * 64 < it.rows ? 1 : 0) != 0;  // warpgroup-uniform
    for (int kc = 0; kc < nk; ++kc) {
      const uint32_t slot = rp.slot;
      wg::mbar_wait_bounded(&full[slot], rp.parity, slot, p.hang);
      // The W tile of this stage: the ring slot, or (consumer expansion) buffer q % 3, free since both
      // warpgroups passed the barrier of stage q - 1 after waiting for their MMAs of stage q - 3.
      const uint32_t wbuf = kCx ? wbuf_next : slot;
      if constexpr (kCx) {
        const int ct = threadIdx.x - 128;  // 0 .. 255: row ct of the tile (bn 128: the first warpgroup)
        if (ct < BN) {
          if constexpr (F == MoeMmaFormat::FP8Block)
            expand_row_fp8<BN>(smem + L.raw + slot * L.raw_stage, smem + L.w + wbuf * L.w_stage, ct);
          else
            expand_row<BN, kTma ? kTmaScaleRow : kRawScale>(smem + L.raw + slot * L.raw_stage,
                                                            smem + L.w + wbuf * L.w_stage, ct,
                                                            kTma ? (kc % kTmaScaleSteps) * kRawScale : 0);
        }
        wg::fence_proxy_async();
        consumers_sync();
      }
      if (active) {
        const uint64_t da = wg::smem_desc_sw128(sbase + L.a + slot * L.a_stage + cw * 64 * kRowBytes);
        const uint64_t db = wg::smem_desc_sw128(sbase + L.w + wbuf * L.w_stage);
        wg::fence_operands(acc);
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          wg::mma_bf16_ss<BN>(acc, wg::desc_advance(da, kk), wg::desc_advance(db, kk),
                              (kc > 0 || kk > 0) ? 1 : 0);
        wg::wgmma_commit();
      }
      // Unconditional (a no-op without pending groups): ptxas then sees every accumulator use after a wait.
      wg::wgmma_wait<1>();
      wg::fence_operands(acc);
      if (kc > 0 && lane == 0) wg::mbar_arrive(&empty[prev]);
      prev = slot;
      rp.next(S);
      if (++wbuf_next == kMoeWgConsumerWBufs) wbuf_next = 0;
    }
    wg::wgmma_wait<0>();
    wg::fence_operands(acc);
    if (lane == 0) wg::mbar_arrive(&empty[prev]);
    if (!active) continue;

    const MoeExpertWeights* ew = p.experts + it.e;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cw * 64 + 16 * w + g + 8 * h;
      if (r >= it.rows) continue;
      const int64_t pos = it.pos0 + r;
      if constexpr (kGateUp) {
        const float sg = F == MoeMmaFormat::NVFP4 ? ew->gate_scale2 : 1.0f;
        const float su = F == MoeMmaFormat::NVFP4 ? ew->up_scale2 : 1.0f;
        __nv_bfloat16* dst = p.act + pos * p.n_out + it.nt * (BN / 2) + 2 * t4;
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) {
          const float g0 = acc[4 * j + 2 * h] * sg, g1 = acc[4 * j + 2 * h + 1] * sg;
          const float u0 = acc[4 * (j + BN / 16) + 2 * h] * su, u1 = acc[4 * (j + BN / 16) + 2 * h + 1] * su;
          // The CPU silu_mul's expression.
          *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
              __floats2bfloat162_rn(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
        }
      } else {
        const float sd = F == MoeMmaFormat::NVFP4 ? ew->down_scale2 : 1.0f;
        float* dst = p.slot_out + static_cast<int64_t>(p.sorted_slots[pos]) * p.n_out + it.nt * BN + 2 * t4;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(acc[4 * j + 2 * h] * sd, acc[4 * j + 2 * h + 1] * sd);
      }
    }
  }
}

// Column position of k inside its 64-wide block in the permuted activations of the Registers layout. The
// thread of quad lane t holds the packed codes of k 16 t .. 16 t + 15 of a weight row (bytes 8 t .. 8 t + 7
// of the stage's 32, one scale block), and its byte q (codes 16 t + 2 q, + 1) feeds the fragment pair of k
// step q / 2, pair q % 2, i.e. wgmma columns 16 (q / 2) + 8 (q % 2) + 2 t (+1): column 8 q + 2 t + e of the
// block holds k 16 t + 2 q + e.
__host__ __device__ constexpr int rs_column_of_k(int k) {
  return (k & ~63) | (((k & 15) >> 1) << 3) | (((k & 63) >> 4) << 1) | (k & 1);
}

// Registers layout consumer (NVFP4, Tma; block tile kMoeWgRsBN = 128 weight rows x kMoeWgRsBM = 256 grouped
// rows): warpgroup cw computes the transposed product D[weight rows][grouped rows] = W . A^T of its 64 weight
// rows by wgmma m64nNk16 with A = the expanded weights from registers and B = the stage's activation tile
// [256 grouped rows][64 k] from shared memory; N = 64, 128, 192 or 256, the item's rows rounded up to 64.
// Fragment rows g and g + 8 of warp w are tile rows
//   gate_up: 32 cw + 8 w + g (gate) and 64 + 32 cw + 8 w + g (the matching up row), so a thread holds gate
//            and up of one act column and grouped row in neighbouring accumulators: SiLU-and-mul in
//            registers;
//   down:    64 cw + 16 w + g (+8).
// Per stage a thread reads 8 packed bytes (16 codes, one scale block) of each of its 2 rows and expands them
// in two halves of two k steps into the A fragments (8 registers a half, double-buffered: a half's fragments
// are rewritten only after the wgmma that read them completed). The activation tile's k are permuted inside
// each 64-column block (rs_column_of_k) to match: the launcher's grouping copy permutes x, and the gate_up
// epilogue stores act permuted.
template <int N>
__device__ __forceinline__ void rs_mainloop(const WgParams& p, const WgLayout& L, uint32_t sbase,
                                            const unsigned char* smem, uint64_t* full, uint64_t* empty,
                                            const int (&row)[2], float (&acc)[128], uint32_t (&fr)[2][2][4],
                                            RingPos& rp, uint32_t& prev) {
  constexpr int BN = kMoeWgRsBN;
  const int t4 = threadIdx.x & 3;
  const int S = p.stages;
  const int nk = p.k / kBK;
  for (int kc = 0; kc < nk; ++kc) {
    const uint32_t slot = rp.slot;
    wg::mbar_wait_bounded(&full[slot], rp.parity, slot, p.hang);
    const unsigned char* raw = smem + L.raw + slot * L.raw_stage;
    uint2 v[2];
    __nv_bfloat162 sc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      v[h] = *reinterpret_cast<const uint2*>(raw + row[h] * kRawRow + 8 * t4);
      const uint32_t b = raw[BN * kRawRow + row[h] * kTmaScaleRow + (kc % kTmaScaleSteps) * kRawScale + t4];
      sc[h] = __float2bfloat162_rn(moe_dev::fp8_e4m3_value(b));
    }
    const uint64_t db = wg::smem_desc_sw128(sbase + L.a + slot * L.a_stage);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      // Word hf of a row: bytes 4 hf .. 4 hf + 3 = k steps 2 hf (pairs 0, 1) and 2 hf + 1.
      const uint4 x0 = moe_dev::e2m1x8_to_bf16(hf ? v[0].y : v[0].x, sc[0]);
      const uint4 x1 = moe_dev::e2m1x8_to_bf16(hf ? v[1].y : v[1].x, sc[1]);
      fr[hf][0][0] = x0.x;
      fr[hf][0][1] = x1.x;
      fr[hf][0][2] = x0.y;
      fr[hf][0][3] = x1.y;
      fr[hf][1][0] = x0.z;
      fr[hf][1][1] = x1.z;
      fr[hf][1][2] = x0.w;
      fr[hf][1][3] = x1.w;
      wg::fence_operands(acc);
      wg::wgmma_fence();
      // K steps 2 hf and 2 hf + 1, one group; their fragments fr[hf] stay untouched until the
      // wgmma_wait<1> after the next group has seen this one complete.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int kk = 2 * hf + j;
        wg::mma_bf16_rs<N>(acc, fr[hf][j], wg::desc_advance(db, kk), (kc > 0 || kk > 0) ? 1 : 0);
      }
      wg::wgmma_commit();
      wg::wgmma_wait<1>();
      wg::fence_operands(acc);
      wg::fence_fragment(fr[hf ^ 1][0]);
      wg::fence_fragment(fr[hf ^ 1][1]);
      // After half 0's wait the previous stage's last group has completed: its slot is free.
      if (hf == 0 && kc > 0 && (threadIdx.x & 31) == 0) wg::mbar_arrive(&empty[prev]);
    }
    prev = slot;
    rp.next(S);
  }
}

template <bool kGateUp>
__device__ __forceinline__ void consumer_rs(const WgParams& p, const WgLayout& L, uint32_t sbase,
                                            const unsigned char* smem, uint64_t* full, uint64_t* empty,
                                            const int* s_mt, const int* s_item, int cw) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  int row[2];  // tile rows of fragment rows g, g + 8
  row[0] = kGateUp ? 32 * cw + 8 * w + g : 64 * cw + 16 * w + g;
  row[1] = kGateUp ? 64 + 32 * cw + 8 * w + g : 64 * cw + 16 * w + g + 8;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  uint32_t fr[2][2][4];  // [half][k step of the half]: the A fragments
#pragma unroll
  for (int i = 0; i < 16; ++i) (&fr[0][0][0])[i] = 0u;
  RingPos rp;
  uint32_t prev = 0;  // the last stage's slot

  for (;;) {
    // The producer names the item in the slot of its first stage (or -1: no more items).
    wg::mbar_wait_bounded(&full[rp.slot], rp.parity, rp.slot, p.hang);
    const int item = wg::warp_uniform(s_item[rp.slot]);
    if (item < 0) break;
    const Item it = decode_item<kMoeWgRsBM>(item, s_mt, p);
    const int nb = wg::warp_uniform((it.rows + 63) / 64);  // 64-row blocks of grouped rows: 1 .. 4
    if (nb == 1)
      rs_mainloop<64>(p, L, sbase, smem, full, empty, row, acc, fr, rp, prev);
    else if (nb == 2)
      rs_mainloop<128>(p, L, sbase, smem, full, empty, row, acc, fr, rp, prev);
    else if (nb == 3)
      rs_mainloop<192>(p, L, sbase, smem, full, empty, row, acc, fr, rp, prev);
    else
      rs_mainloop<256>(p, L, sbase, smem, full, empty, row, acc, fr, rp, prev);
    wg::wgmma_wait<0>();
    wg::fence_operands(acc);
    if (lane == 0) wg::mbar_arrive(&empty[prev]);

    const MoeExpertWeights* ew = p.experts + it.e;
    const int ncols = 8 * nb;  // n8 blocks of grouped rows the mainloop computed
    if constexpr (kGateUp) {
      const float sg = ew->gate_scale2, su = ew->up_scale2;
      __nv_bfloat16* dst = p.act + rs_column_of_k(it.nt * 64 + 32 * cw + 8 * w + g);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        if (j >= ncols) break;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 8 * j + 2 * t4 + e;
          if (r >= it.rows) continue;
          const float gv = acc[4 * j + e] * sg, uv = acc[4 * j + 2 + e] * su;
          // The CPU silu_mul's expression.
          dst[static_cast<int64_t>(it.pos0 + r) * p.n_out] =
              __float2bfloat16_rn(gv / (1.0f + expf(-gv)) * uv);
        }
      }
    } else {
      const float sd = ew->down_scale2;
      const int col = it.nt * kMoeWgRsBN + 64 * cw + 16 * w + g;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        if (j >= ncols) break;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 8 * j + 2 * t4 + e;
          if (r >= it.rows) continue;
          float* dst = p.slot_out + static_cast<int64_t>(p.sorted_slots[it.pos0 + r]) * p.n_out + col;
          dst[0] = acc[4 * j + e] * sd;
          dst[8] = acc[4 * j + 2 + e] * sd;
        }
      }
    }
  }
}

// amaps (Tma loads): the A rows [rows, k] bf16 in grouped order, 128-byte swizzle (AMaps); unused otherwise.
template <int BN, MoeMmaFormat F, bool kGateUp, bool kCx, bool kTma, bool kRs = false>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_kernel(const WgParams p, const __grid_constant__ AMaps amaps) {
  static_assert(!kRs || (BN == kMoeWgRsBN && F == MoeMmaFormat::NVFP4 && kCx && kTma),
                "the Registers layout is NVFP4 with tensor copies and kMoeWgRsBN-row tiles");
#if MS_WGMMA_SM90A
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  const uint32_t dyn = wg::smem_u32(smem_dyn);
  const uint32_t pad = ((dyn + 1023u) & ~1023u) - dyn;  // the 128-byte swizzle wants 1024-aligned tiles
  unsigned char* smem = smem_dyn + pad;
  const uint32_t sbase = dyn + pad;
  const WgLayout L = wg_layout(BN, p.stages, F, kCx, kTma, kRs);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* empty = full + p.stages;
  int* s_mt = reinterpret_cast<int*>(smem + L.table);  // [n_experts + 1]
  int* s_warp = s_mt + p.n_experts + 1;                // [12]
  int* s_item = s_warp + 12;  // [stages] Registers layout: the item whose first stage slot s holds
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < p.stages; ++s) {
      wg::mbar_init(&full[s], kTma ? 1 : kFullArrivals);
      wg::mbar_init(&empty[s], kEmptyArrivals);
    }
    wg::mbar_init_fence();
  }
  dev::grid_dep_enter();

  // Prefix of M tiles over experts (its barriers also publish the initialised mbarriers).
  moe_dev::m_tile_prefix<kThreads, kRs ? kMoeWgRsBM : kBM>(p.counts, p.n_experts, s_mt, s_warp);
  const int total_items = s_mt[p.n_experts] * p.n_tiles;

  const int wgi = wg::warp_uniform(tid / 128);
  if constexpr (kRs) {
    // The consumers hold 128 accumulators and 16 fragment registers a thread: move registers to them from
    // the producer warpgroup, whose one copying thread needs few.
    if (wgi == 0) {
      wg::regs_dealloc<40>();
      producer_tma<BN, F, kGateUp, kMoeWgRsBM, kMapsPerExpert / 2>(p, &amaps, L, sbase, full, empty, s_mt,
                                                                   total_items, s_item);
    } else {
      wg::regs_alloc<232>();
      consumer_rs<kGateUp>(p, L, sbase, smem, full, empty, s_mt, s_item, wgi - 1);
    }
  } else if (wgi == 0) {
    if constexpr (kTma) {
      producer_tma<BN, F, kGateUp>(p, &amaps, L, sbase, full, empty, s_mt, total_items);
    } else {
      producer<BN, F, kGateUp, kCx>(p, L, sbase, smem, full, empty, s_mt, total_items);
    }
  } else {
    consumer<BN, F, kGateUp, kCx, kTma>(p, L, sbase, smem, full, empty, s_mt, total_items, wgi - 1);
  }
#else
  wg::trap_not_sm90a();
#endif
}

// xb bf16 [m, hidden] packed -> xg bf16 [slots, hidden] packed in grouped order: xg[pos] =
// xb[sorted_slots[pos] / top_k] for pos < offsets[n_experts] (rows past it stay unwritten: a Tma A tile that
// reaches them feeds only rows whose results are dropped). One warp per row, 16 bytes a lane (hidden % 8 ==
// 0). kPerm (the Registers layout): columns permuted inside each 64-column block, xg[pos][rs_column_of_k(k)]
// = xb[token][k] (hidden % 64 == 0): 16-byte piece 8 b + q of a row gathers the k pairs 64 b + 2 q + 16 i, i
// = 0..3.
template <bool kPerm>
__global__ void __launch_bounds__(256)
    moe_wg_group_rows_kernel(const __nv_bfloat16* __restrict__ xb, const int32_t* __restrict__ sorted_slots,
                             const int32_t* __restrict__ offsets, int n_experts, int top_k, int hidden,
                             __nv_bfloat16* __restrict__ xg, int* __restrict__ counters) {
  dev::grid_dep_enter();
  // The item counters of the gate_up and down launches that follow (null: not used).
  if (counters != nullptr && blockIdx.x == 0 && threadIdx.x < 2) counters[threadIdx.x] = 0;
  const int64_t rows = offsets[n_experts];
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t pos = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; pos < rows;
       pos += warps) {
    const int64_t t = sorted_slots[pos] / top_k;
    uint4* dst = reinterpret_cast<uint4*>(xg + pos * hidden);
    if constexpr (kPerm) {
      const uint32_t* src = reinterpret_cast<const uint32_t*>(xb + t * hidden);
      for (int c = lane; c < hidden / 8; c += 32) {
        const uint32_t* b = src + (c >> 3) * 32 + (c & 7);
        dst[c] = make_uint4(b[0], b[8], b[16], b[24]);
      }
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(xb + t * hidden);
      for (int c = lane; c < hidden / 8; c += 32) dst[c] = src[c];
    }
  }
}

MoeMmaFormat wg_format(MoeWeightFormat f) {
  return f == MoeWeightFormat::BF16       ? MoeMmaFormat::BF16
         : f == MoeWeightFormat::FP8Block ? MoeMmaFormat::FP8Block
                                          : MoeMmaFormat::NVFP4;
}

MoeMmaShape wg_shape(const MoeExpertsParams& p) {
  return {wg_format(p.format), p.m, p.top_k, p.n_experts, p.hidden, p.inter, p.fp8_block};
}

bool wg_format_ok(MoeWeightFormat f) {
  return f == MoeWeightFormat::BF16 || f == MoeWeightFormat::NVFP4 || f == MoeWeightFormat::FP8Block;
}

// Who expands NVFP4 tiles: p.wgmma_expand if set (0 .. 2), else MOESERVE_MOE_WGMMA_EXPAND (read once:
// producer | registers | consumer), else the default; for A/B timing without a rebuild.
MoeWgExpand wg_expand(const MoeExpertsParams& p) {
  static const int env = [] {
    const char* v = std::getenv("MOESERVE_MOE_WGMMA_EXPAND");
    if (v != nullptr && std::strcmp(v, "consumer") == 0) return static_cast<int>(MoeWgExpand::Consumer);
    if (v != nullptr && std::strcmp(v, "producer") == 0) return static_cast<int>(MoeWgExpand::Producer);
    if (v != nullptr && std::strcmp(v, "registers") == 0) return static_cast<int>(MoeWgExpand::Registers);
    return -1;
  }();
  const int want = p.wgmma_expand >= 0 && p.wgmma_expand <= 2 ? p.wgmma_expand : env;
  return want >= 0 ? static_cast<MoeWgExpand>(want) : moe_wgmma_default_expand(wg_shape(p));
}

// The loads asked for: CpAsync for a format the tensor copies cannot take (FP8Block, whatever was asked:
// moe_wgmma_tma_unsupported says why); else p.wgmma_load if set, else MOESERVE_MOE_WGMMA_LOAD (cpasync | tma;
// read once), else tensor copies where the maps exist. Tma without maps is refused by the launcher.
MoeWgLoad wg_load(const MoeExpertsParams& p) {
  static const int env = [] {
    const char* v = std::getenv("MOESERVE_MOE_WGMMA_LOAD");
    if (v != nullptr && std::strcmp(v, "cpasync") == 0) return 0;
    if (v != nullptr && std::strcmp(v, "tma") == 0) return 1;
    return -1;
  }();
  if (moe_wgmma_tma_unsupported(wg_format(p.format))) return MoeWgLoad::CpAsync;  // FP8Block
  const int want = p.wgmma_load >= 0 ? p.wgmma_load : env;
  if (want == 0) return MoeWgLoad::CpAsync;
  if (want == 1) return MoeWgLoad::Tma;
  return p.wgmma_maps != nullptr ? MoeWgLoad::Tma : MoeWgLoad::CpAsync;
}

// The record of a timed-out mbarrier wait: host memory mapped into the device, allocated at the first launch,
// printed to stderr at exit when a wait timed out. Null when it cannot be allocated: the wait still traps.
wg::MbarTimeout* host_timeout = nullptr;

std::string timeout_report() {
  if (host_timeout == nullptr) return {};
  const volatile wg::MbarTimeout* r = host_timeout;
  if (r->seen == 0) return {};
  const uint32_t b = r->barrier;
  return fmt::format(
      "moe_experts_wgmma: block ({}, {}, {}) thread {} waited {:.1f} s for mbarrier {}[{}] to complete the "
      "phase of parity {}, and trapped",
      r->block[0], r->block[1], r->block[2], r->thread, static_cast<double>(wg::kMbarTimeoutNs) * 1e-9,
      (b & kEmptyTag) != 0 ? "empty" : "full", b & (kEmptyTag - 1), r->parity);
}

wg::MbarTimeout* timeout_record() {
  static wg::MbarTimeout* const rec = [] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // allocating is not captured work
    cudaThreadExchangeStreamCaptureMode(&mode);
    void* h = nullptr;
    void* d = nullptr;
    if (cudaHostAlloc(&h, sizeof(wg::MbarTimeout), cudaHostAllocMapped | cudaHostAllocPortable) !=
            cudaSuccess ||
        cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
      cudaGetLastError();
      d = nullptr;
    } else {
      std::memset(h, 0, sizeof(wg::MbarTimeout));
      host_timeout = static_cast<wg::MbarTimeout*>(h);
      std::atexit([] {
        const std::string msg = timeout_report();
        if (!msg.empty()) std::fprintf(stderr, "%s\n", msg.c_str());
      });
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    return static_cast<wg::MbarTimeout*>(d);
  }();
  return rec;
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against the driver library).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The maps of the Tma loads, described once for encoding (encode_2d) and for the launcher's box checks
// (check_tma_stages). A rows [rows, k] bf16 (grouped xg or act), box {64, 128}, 128-byte swizzle.
TmaMap2d tma_a_map(const char* what, const void* base, uint64_t rows, uint64_t k, uint32_t box_rows = kBM) {
  return {what, reinterpret_cast<uintptr_t>(base), 2, k, rows, 2 * k, kBK, box_rows, 128};
}
// One weight matrix [rows, cols] (cols = k): bf16 box {64, half} swizzled like the wgmma operand; NVFP4 codes
// (bytes) box {32, half}, unswizzled (the consumers expand them).
TmaMap2d tma_w_map(const char* what, const void* base, bool nvfp4, uint64_t rows, uint64_t cols,
                   uint32_t half) {
  if (!nvfp4) return {what, reinterpret_cast<uintptr_t>(base), 2, cols, rows, 2 * cols, kBK, half, 128};
  return {what, reinterpret_cast<uintptr_t>(base), 1, cols / 2, rows, cols / 2, kRawRow, half, 0};
}
// NVFP4 scales [rows, cols / 16] e4m3 bytes, box {kTmaScaleRow, half}, unswizzled.
TmaMap2d tma_scale_map(const char* what, const void* base, uint64_t rows, uint64_t cols, uint32_t half) {
  return {what, reinterpret_cast<uintptr_t>(base), 1, cols / 16, rows, cols / 16, kTmaScaleRow, half, 0};
}

// Encodes m after check_tma_map_2d (bf16 or byte elements; swizzle none or 128 bytes).
CUtensorMap encode_2d(const TmaMap2d& m) {
  check_tma_map_2d(m);
  MS_CHECK(m.elem_bytes == 1 || m.elem_bytes == 2, "moe_experts_wgmma: {} tensor map of {}-byte elements",
           m.what, m.elem_bytes);
  MS_CHECK(m.swizzle_bytes == 0 || m.swizzle_bytes == 128, "moe_experts_wgmma: {} tensor map swizzle {}",
           m.what, m.swizzle_bytes);
  const auto fn = encode_fn();
  MS_CHECK(fn != nullptr, "moe_experts_wgmma: cuTensorMapEncodeTiled is not available from the driver");
  CUtensorMap t;
  const cuuint64_t dims[2] = {m.cols, m.rows};
  const cuuint64_t strides[1] = {m.row_bytes};
  const cuuint32_t box[2] = {m.box_cols, m.box_rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r =
      fn(&t, m.elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
         reinterpret_cast<void*>(m.base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
         m.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MS_CHECK(r == CUDA_SUCCESS, "moe_experts_wgmma: {} tensor map ([{}, {}], box {} x {}) failed: CUresult {}",
           m.what, m.rows, m.cols, m.box_rows, m.box_cols, static_cast<int>(r));
  return t;
}

// Before a Tma launch: every box producer_tma copies (each ring slot, k steps 0 .. 2 kTmaScaleSteps - 1,
// which cover every box start modulo the scale piece) lands where check_tma_box allows, the stage's boxes add
// up to tma_stage_bytes (the expect_tx count) and the mbarriers are 8-byte aligned. `a` is the launch's A
// map, the weight maps are described from the shape (moe_experts_wgmma_maps encodes the same ones).
void check_tma_stages(MoeMmaFormat f, bool gate_up, int bn, int stages, const TmaMap2d& a, int k, int n_out,
                      bool rs) {
  const bool nv = f == MoeMmaFormat::NVFP4;
  const WgLayout L = wg_layout(bn, stages, f, nv, true, rs);
  const uint32_t half = static_cast<uint32_t>(bn / 2);
  const uint64_t wrows = static_cast<uint64_t>(n_out);  // gate / up rows = inter, down rows = hidden
  const uintptr_t any = 256;  // the weight maps' own addresses are checked where they are encoded
  const TmaMap2d w =
      tma_w_map(gate_up ? "gate/up" : "down", reinterpret_cast<const void*>(any), nv, wrows, k, half);
  const TmaMap2d sc = tma_scale_map(gate_up ? "gate/up scales" : "down scales",
                                    reinterpret_cast<const void*>(any), wrows, k, half);
  MS_CHECK(L.bars % 8 == 0, "moe_experts_wgmma tma: mbarriers at byte {} are not 8-byte aligned", L.bars);
  const int nk = k / kBK;
  for (int slot = 0; slot < stages; ++slot) {
    for (int kc = 0; kc < std::min(nk, 2 * kTmaScaleSteps); ++kc) {
      uint64_t bytes = check_tma_box(a, L.a + static_cast<uint64_t>(slot) * L.a_stage, int64_t{kc} * kBK);
      if (!nv) {
        const uint64_t dst = L.w + static_cast<uint64_t>(slot) * L.w_stage;
        bytes += check_tma_box(w, dst, int64_t{kc} * kBK);
        bytes += check_tma_box(w, dst + half * kRowBytes, int64_t{kc} * kBK);
      } else {
        const uint64_t raw = L.raw + static_cast<uint64_t>(slot) * L.raw_stage;
        const int64_t c_sc = int64_t{kc / kTmaScaleSteps} * kTmaScaleRow;
        bytes += check_tma_box(w, raw, int64_t{kc} * kRawRow);
        bytes += check_tma_box(w, raw + half * kRawRow, int64_t{kc} * kRawRow);
        bytes += check_tma_box(sc, raw + static_cast<uint64_t>(bn) * kRawRow, c_sc);
        bytes += check_tma_box(sc, raw + static_cast<uint64_t>(bn) * kRawRow + half * kTmaScaleRow, c_sc);
      }
      const uint32_t want = tma_stage_bytes(f, bn, static_cast<int>(a.box_rows));
      MS_CHECK(bytes == want,
               "moe_experts_wgmma tma: the boxes of a stage bring {} bytes, expect_tx announces {}", bytes,
               want);
    }
  }
}

template <int BN, MoeMmaFormat F, bool kGateUp, bool kCx, bool kTma, bool kRs = false>
void launch_one(const WgParams& wp, const AMaps& amaps, const MoeExpertsParams& p, const DeviceCaps& caps,
                size_t smem, cudaStream_t stream) {
  const void* fn = reinterpret_cast<const void*>(&moe_wgmma_kernel<BN, F, kGateUp, kCx, kTma, kRs>);
  const int per_sm = moe_launch::resident_blocks("moe_experts_wgmma", fn, kThreads, smem, caps.device);
  const unsigned grid = moe_launch::grid(p, kRs ? kMoeWgRsBM : kBM, wp.n_tiles, per_sm, caps.multiprocessors);
  launch_kernel("moe_wgmma", moe_wgmma_kernel<BN, F, kGateUp, kCx, kTma, kRs>, grid, kThreads, smem, stream,
                wp, amaps);
}

template <int BN, bool kGateUp>
void launch_bn(const WgParams& wp, const AMaps& amaps, const MoeExpertsParams& p,
               const MoeWgmmaGemmConfig& cfg, const DeviceCaps& caps, cudaStream_t stream) {
  const bool nv = p.format == MoeWeightFormat::NVFP4, cx = cfg.expand == MoeWgExpand::Consumer;
  if (p.format == MoeWeightFormat::FP8Block) {
    // Always consumer expansion and cp.async (the choosers never return Tma for FP8Block).
    MS_CHECK(cfg.load == MoeWgLoad::CpAsync, "moe_experts_wgmma: FP8Block with tensor-copy loads");
    launch_one<BN, MoeMmaFormat::FP8Block, kGateUp, true, false>(wp, amaps, p, caps, cfg.smem, stream);
    return;
  }
  if (cfg.load == MoeWgLoad::Tma) {
    if (!nv) {
      launch_one<BN, MoeMmaFormat::BF16, kGateUp, false, true>(wp, amaps, p, caps, cfg.smem, stream);
    } else if (cfg.expand == MoeWgExpand::Registers) {
      if constexpr (BN == kMoeWgRsBN)
        launch_one<BN, MoeMmaFormat::NVFP4, kGateUp, true, true, true>(wp, amaps, p, caps, cfg.smem, stream);
      else
        MS_THROW("moe_experts_wgmma: the Registers layout with {}-row tiles", BN);
    } else {
      launch_one<BN, MoeMmaFormat::NVFP4, kGateUp, true, true>(wp, amaps, p, caps, cfg.smem, stream);
    }
  } else if (!nv) {
    launch_one<BN, MoeMmaFormat::BF16, kGateUp, false, false>(wp, amaps, p, caps, cfg.smem, stream);
  } else if (cx) {
    launch_one<BN, MoeMmaFormat::NVFP4, kGateUp, true, false>(wp, amaps, p, caps, cfg.smem, stream);
  } else {
    launch_one<BN, MoeMmaFormat::NVFP4, kGateUp, false, false>(wp, amaps, p, caps, cfg.smem, stream);
  }
}

template <bool kGateUp>
void launch_gemm(const WgParams& wp, const AMaps& amaps, const MoeExpertsParams& p,
                 const MoeWgmmaGemmConfig& cfg, const DeviceCaps& caps, cudaStream_t stream) {
  if (cfg.bn == 256)
    launch_bn<256, kGateUp>(wp, amaps, p, cfg, caps, stream);
  else
    launch_bn<128, kGateUp>(wp, amaps, p, cfg, caps, stream);
}

// Scale columns of an FP8Block matrix whose rows are k wide (0 for the other formats, whose fp8_block is
// not checked and may be anything).
int fp8_scale_cols(const MoeExpertsParams& p, int k) {
  return p.format == MoeWeightFormat::FP8Block ? (k + p.fp8_block - 1) / p.fp8_block : 0;
}

}  // namespace

std::optional<std::string> moe_experts_wgmma_unavailable(const MoeExpertsParams& p) {
  if (!wg_format_ok(p.format))
    return fmt::format("moe_experts_wgmma: weight format {} is not NVFP4, FP8Block or BF16",
                       static_cast<int>(p.format));
  const DeviceCaps caps = current_device_caps();
  std::string why;
  const MoeWgLoad load = wg_load(p);
  if (load == MoeWgLoad::Tma && p.wgmma_maps == nullptr)
    return std::string("moe_experts_wgmma: tensor-copy loads asked for without wgmma_maps");
  if (!choose_moe_wgmma_config(wg_shape(p), limits_of(caps), &why, wg_expand(p), load)) return why;
  return std::nullopt;
}

MoeWgmmaConfig moe_experts_wgmma_config(const MoeExpertsParams& p) {
  MS_CHECK(wg_format_ok(p.format), "moe_experts_wgmma: weight format {} is not NVFP4, FP8Block or BF16",
           static_cast<int>(p.format));
  const DeviceCaps caps = current_device_caps();
  const MoeWgLoad load = wg_load(p);
  MS_CHECK(load != MoeWgLoad::Tma || p.wgmma_maps != nullptr,
           "moe_experts_wgmma: tensor-copy loads asked for (wgmma_load / MOESERVE_MOE_WGMMA_LOAD) without "
           "wgmma_maps");
  std::string why;
  const auto cfg = choose_moe_wgmma_config(wg_shape(p), limits_of(caps), &why, wg_expand(p), load);
  MS_CHECK(cfg.has_value(), "{}", why);
  check_smem(caps, "moe_experts_wgmma gate_up", cfg->gate_up.smem);
  check_smem(caps, "moe_experts_wgmma down", cfg->down.smem);
  return *cfg;
}

size_t moe_experts_wgmma_maps_bytes(int n_experts) {
  return static_cast<size_t>(std::max(n_experts, 0)) * kMapsPerExpert * sizeof(CUtensorMap);
}

void* moe_experts_wgmma_maps(const MoeExpertWeights* host_table, int n_experts, MoeWeightFormat format,
                             int hidden, int inter) {
  MS_CHECK(n_experts >= 1 && host_table != nullptr, "moe_experts_wgmma_maps: {} experts, table {}", n_experts,
           static_cast<const void*>(host_table));
  MS_CHECK(wg_format_ok(format), "moe_experts_wgmma_maps: weight format {} is not NVFP4, FP8Block or BF16",
           static_cast<int>(format));
  if (auto no = moe_wgmma_tma_unsupported(wg_format(format))) MS_THROW("moe_experts_wgmma_maps: {}", *no);
  const MoeMmaShape shape{wg_format(format), 0, 1, n_experts, hidden, inter};
  if (auto bad = moe_wgmma_shape_unsupported(shape)) MS_THROW("{}", *bad);
  if (auto bad = moe_wgmma_tma_shape_unsupported(shape)) MS_THROW("{}", *bad);
  const bool nv = format == MoeWeightFormat::NVFP4;
  const uint32_t gu_half = static_cast<uint32_t>(moe_wgmma_bn(true, hidden, inter) / 2);
  const uint32_t dn_half = static_cast<uint32_t>(moe_wgmma_bn(false, hidden, inter) / 2);
  std::vector<CUtensorMap> maps(static_cast<size_t>(n_experts) * kMapsPerExpert);
  std::memset(maps.data(), 0, maps.size() * sizeof(CUtensorMap));
  auto put = [&](CUtensorMap* data_map, CUtensorMap* scale_map, const void* data, const void* scale,
                 uint64_t rows, uint64_t cols, uint32_t half, const char* what, const char* swhat) {
    *data_map = encode_2d(tma_w_map(what, data, nv, rows, cols, half));
    if (nv) *scale_map = encode_2d(tma_scale_map(swhat, scale, rows, cols, half));
  };
  for (size_t e = 0; e < static_cast<size_t>(n_experts); ++e) {
    const MoeExpertWeights& w = host_table[e];
    if (w.gate == nullptr || w.up == nullptr || w.down == nullptr) continue;  // an expert that is never used
    CUtensorMap* m = maps.data() + e * kMapsPerExpert;
    auto name = [e](const char* t) { return fmt::format("expert {} {}", e, t); };
    put(m + 0, m + 3, w.gate, w.gate_scale, inter, hidden, gu_half, name("gate").c_str(),
        name("gate_scale").c_str());
    put(m + 1, m + 4, w.up, w.up_scale, inter, hidden, gu_half, name("up").c_str(), name("up_scale").c_str());
    put(m + 2, m + 5, w.down, w.down_scale, hidden, inter, dn_half, name("down").c_str(),
        name("down_scale").c_str());
    if (nv) {  // the Registers layout's boxes of kMoeWgRsBN / 2 rows
      constexpr uint32_t rh = kMoeWgRsBN / 2;
      CUtensorMap* r = m + kMapsPerExpert / 2;
      put(r + 0, r + 3, w.gate, w.gate_scale, inter, hidden, rh, name("gate (64-row boxes)").c_str(),
          name("gate_scale (64-row boxes)").c_str());
      put(r + 1, r + 4, w.up, w.up_scale, inter, hidden, rh, name("up (64-row boxes)").c_str(),
          name("up_scale (64-row boxes)").c_str());
      put(r + 2, r + 5, w.down, w.down_scale, hidden, inter, rh, name("down (64-row boxes)").c_str(),
          name("down_scale (64-row boxes)").c_str());
    }
  }
  void* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, maps.size() * sizeof(CUtensorMap)));
  CUDA_CHECK(cudaMemcpy(d, maps.data(), maps.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
  return d;
}

bool moe_experts_wgmma_groups_rows(const MoeExpertsParams& p) {
  return moe_experts_wgmma_config(p).gate_up.load == MoeWgLoad::Tma;
}

void moe_experts_wgmma_gemms(const MoeExpertsParams& p, const void* xb, void* xg, void* act, int* counters,
                             cudaStream_t stream) {
  const MoeWgmmaConfig cfg = moe_experts_wgmma_config(p);
  if (p.m == 0) return;
  MS_CHECK(xb != nullptr && reinterpret_cast<uintptr_t>(xb) % 16 == 0,
           "moe_experts_wgmma: xb is null or not 16-byte aligned");
  MS_CHECK(act != nullptr && reinterpret_cast<uintptr_t>(act) % 16 == 0,
           "moe_experts_wgmma: act is null or not 16-byte aligned");
  MS_CHECK(p.slot_out != nullptr && reinterpret_cast<uintptr_t>(p.slot_out) % 16 == 0,
           "moe_experts_wgmma: slot_out is null or not 16-byte aligned");
  const bool tma = cfg.gate_up.load == MoeWgLoad::Tma;
  const bool rs = cfg.gate_up.expand == MoeWgExpand::Registers;
  MS_CHECK(!rs || counters != nullptr, "moe_experts_wgmma: the Registers layout needs the item counters");
  MS_CHECK(rs == (cfg.down.expand == MoeWgExpand::Registers),
           "moe_experts_wgmma: the Registers layout for one projection only");
  MS_CHECK(!tma || (xg != nullptr && reinterpret_cast<uintptr_t>(xg) % 128 == 0),
           "moe_experts_wgmma: xg (grouped rows for the tensor-copy loads) is null or not 128-byte aligned");
  MS_CHECK(!tma || reinterpret_cast<uintptr_t>(p.wgmma_maps) % 64 == 0,
           "moe_experts_wgmma: wgmma_maps is not 64-byte aligned");
  {
    const std::string hung = timeout_report();
    MS_CHECK(hung.empty(), "{} (an earlier launch)", hung);
  }
  const DeviceCaps caps = current_device_caps();

  WgParams wp;
  wp.counts = p.expert_counts;
  wp.offsets = p.expert_offsets;
  wp.sorted_slots = p.sorted_slots;
  wp.experts = p.experts;
  wp.top_k = p.top_k;
  wp.n_experts = p.n_experts;
  wp.fp8_block = p.fp8_block;
  wp.wmaps = static_cast<const CUtensorMap*>(p.wgmma_maps);
  wp.hang = timeout_record();
  const uint64_t slots = static_cast<uint64_t>(p.m) * p.top_k;

  AMaps a_gu, a_dn;
  std::memset(&a_gu, 0, sizeof a_gu);
  std::memset(&a_dn, 0, sizeof a_dn);
  if (tma) {
    // One warp per grouped row (at most `slots` of them), 8 warps a block.
    const int blocks = static_cast<int>(
        std::min<int64_t>((static_cast<int64_t>(slots) + 7) / 8, int64_t{caps.multiprocessors} * 16));
    if (rs)
      launch_kernel("moe_wg_group_rows", moe_wg_group_rows_kernel<true>, std::max(blocks, 1), 256, 0, stream,
                    static_cast<const __nv_bfloat16*>(xb), p.sorted_slots, p.expert_offsets, p.n_experts,
                    p.top_k, p.hidden, static_cast<__nv_bfloat16*>(xg), counters);
    else
      launch_kernel("moe_wg_group_rows", moe_wg_group_rows_kernel<false>, std::max(blocks, 1), 256, 0, stream,
                    static_cast<const __nv_bfloat16*>(xb), p.sorted_slots, p.expert_offsets, p.n_experts,
                    p.top_k, p.hidden, static_cast<__nv_bfloat16*>(xg), static_cast<int*>(nullptr));
    const MoeMmaFormat f = wg_format(p.format);
    // The 128-row layouts: one box of 128 rows; the Registers layout: boxes of 64, 128, 192 and 256 rows.
    for (int i = 0; i < (rs ? 4 : 1); ++i) {
      const uint32_t box = rs ? 64u * static_cast<uint32_t>(i + 1) : static_cast<uint32_t>(kBM);
      const TmaMap2d ma = tma_a_map("xg", xg, slots, p.hidden, box);
      const TmaMap2d md = tma_a_map("act", act, slots, p.inter, box);
      check_tma_stages(f, true, cfg.gate_up.bn, cfg.gate_up.stages, ma, p.hidden, p.inter, rs);
      check_tma_stages(f, false, cfg.down.bn, cfg.down.stages, md, p.inter, p.hidden, rs);
      a_gu.m[i] = encode_2d(ma);
      a_dn.m[i] = encode_2d(md);
    }
  }

  WgParams gu = wp;
  gu.a = static_cast<const __nv_bfloat16*>(xb);
  gu.lda = p.hidden;
  gu.act = static_cast<__nv_bfloat16*>(act);
  gu.k = p.hidden;
  gu.n_out = p.inter;
  gu.n_tiles = p.inter / (cfg.gate_up.bn / 2);
  gu.stages = cfg.gate_up.stages;
  gu.fp8_scols = fp8_scale_cols(p, p.hidden);
  gu.item_next = rs ? counters : nullptr;
  launch_gemm<true>(gu, a_gu, p, cfg.gate_up, caps, stream);

  WgParams dn = wp;
  dn.a = static_cast<const __nv_bfloat16*>(act);
  dn.lda = p.inter;
  dn.slot_out = p.slot_out;
  dn.k = p.inter;
  dn.n_out = p.hidden;
  dn.n_tiles = p.hidden / cfg.down.bn;
  dn.stages = cfg.down.stages;
  dn.fp8_scols = fp8_scale_cols(p, p.inter);
  dn.item_next = rs ? counters + 1 : nullptr;
  launch_gemm<false>(dn, a_dn, p, cfg.down, caps, stream);
}

}  // namespace ms::cuda
