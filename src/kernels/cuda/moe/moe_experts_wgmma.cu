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
// Work items as in moe_experts_mma.cu: (expert, N tile, M tile), M tile fastest; expert e has
// ceil(count_e / 128) M tiles; every block scans the counts into a shared prefix and maps items by binary
// search; block b takes items b, b + grid, ... (producer and consumers walk the same list). A consumer whose
// 64 rows are all past the item's rows skips its MMAs (still hands the stages back).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/common/cp_async.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
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
constexpr int kFullArrivals = 128;   // every producer thread
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
};

// Byte offsets inside the 1024-aligned dynamic window (moe_wgmma_smem_bytes sizes the same).
struct WgLayout {
  uint32_t a, w, raw, bars, table;
  uint32_t a_stage, w_stage, raw_stage;
};

// cx: expanded by the consumers (3 W buffers, a raw ring of `stages`); else the bf16 ring of `stages` and,
// for NVFP4, a raw ring of stages - 1. Raw stages: NVFP4 bn x 36 bytes, FP8Block bn x 64 + 128
// (moe_wgmma_raw_stage_bytes).
__device__ __forceinline__ WgLayout wg_layout(int bn, int stages, MoeMmaFormat f, bool cx) {
  WgLayout L;
  L.a_stage = kBM * kRowBytes;
  L.w_stage = static_cast<uint32_t>(bn) * kRowBytes;
  L.raw_stage = f == MoeMmaFormat::FP8Block ? static_cast<uint32_t>(bn) * kFp8Row + 128
                                            : static_cast<uint32_t>(bn) * (kRawRow + kRawScale);
  L.a = 0;
  L.w = L.a + stages * L.a_stage;
  L.raw = L.w + (cx ? kMoeWgConsumerWBufs : stages) * L.w_stage;
  const uint32_t raw_bytes = f != MoeMmaFormat::BF16 ? (cx ? stages : stages - 1) * L.raw_stage : 0;
  L.bars = L.raw + (raw_bytes + 127) / 128 * 128;
  L.table = L.bars + (2 * stages * 8 + 127) / 128 * 128;
  return L;
}

using dev::cp_async16;
using dev::cp_async4;
using dev::cp_async_commit;
using dev::cp_async_wait_pending;

// Expands row r of a raw NVFP4 stage (bn rows of 32 packed bytes, then bn rows of 4 e4m3 scales) into row r
// of the swizzled bf16 W tile.
template <int BN>
__device__ __forceinline__ void expand_row(const unsigned char* raw, unsigned char* wt, int r) {
  const uint4 q0 = *reinterpret_cast<const uint4*>(raw + r * kRawRow);
  const uint4 q1 = *reinterpret_cast<const uint4*>(raw + r * kRawRow + 16);
  const uint32_t sc = *reinterpret_cast<const uint32_t*>(raw + BN * kRawRow + r * kRawScale);
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

// item -> expert (largest e with s_mt[e] <= item / n_tiles), N tile, M tile, rows of the tile, first
// position.
__device__ __forceinline__ Item decode_item(int item, const int* s_mt, const WgParams& p) {
  const int lo = moe_dev::expert_of_m_tile(item / p.n_tiles, s_mt, p.n_experts);
  Item it;
  it.e = lo;
  const int mt_e = s_mt[lo + 1] - s_mt[lo];
  const int local = item - s_mt[lo] * p.n_tiles;
  it.nt = local / mt_e;
  const int m0 = (local % mt_e) * kBM;
  it.rows = min(kBM, p.counts[lo] - m0);
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
      if (q >= static_cast<uint32_t>(S)) wg::mbar_wait(&empty[slot], (q / S - 1) & 1u);
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

template <int BN, MoeMmaFormat F, bool kGateUp, bool kCx>
__device__ __forceinline__ void consumer(const WgParams& p, const WgLayout& L, uint32_t sbase,
                                         unsigned char* smem, uint64_t* full, uint64_t* empty,
                                         const int* s_mt, int total_items, int cw) {
  static_assert(!kCx || F != MoeMmaFormat::BF16, "consumer expansion is an NVFP4 / FP8Block layout");
  static_assert(kCx || F != MoeMmaFormat::FP8Block, "FP8Block tiles are expanded by the consumers");
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int S = p.stages;
  const int nk = p.k / kBK;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  uint32_t q = 0;

  for (int item = blockIdx.x; item < total_items; item += gridDim.x) {
    const Item it = decode_item(item, s_mt, p);
    const bool active = wg::warp_uniform(cw * 64 < it.rows ? 1 : 0) != 0;  // warpgroup-uniform
    for (int kc = 0; kc < nk; ++kc) {
      const uint32_t slot = q % S;
      wg::mbar_wait(&full[slot], (q / S) & 1u);
      // The W tile of this stage: the ring slot, or (consumer expansion) buffer q % 3, free since both
      // warpgroups passed the barrier of stage q - 1 after waiting for their MMAs of stage q - 3.
      const uint32_t wbuf = kCx ? q % kMoeWgConsumerWBufs : slot;
      if constexpr (kCx) {
        const int ct = threadIdx.x - 128;  // 0 .. 255: row ct of the tile (bn 128: the first warpgroup)
        if (ct < BN) {
          if constexpr (F == MoeMmaFormat::FP8Block)
            expand_row_fp8<BN>(smem + L.raw + slot * L.raw_stage, smem + L.w + wbuf * L.w_stage, ct);
          else
            expand_row<BN>(smem + L.raw + slot * L.raw_stage, smem + L.w + wbuf * L.w_stage, ct);
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
      if (kc > 0 && lane == 0) wg::mbar_arrive(&empty[(q - 1) % S]);
      ++q;
    }
    wg::wgmma_wait<0>();
    wg::fence_operands(acc);
    if (lane == 0) wg::mbar_arrive(&empty[(q - 1) % S]);
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

template <int BN, MoeMmaFormat F, bool kGateUp, bool kCx>
__global__ void __launch_bounds__(kThreads, 1) moe_wgmma_kernel(const WgParams p) {
#if MS_WGMMA_SM90A
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  const uint32_t dyn = wg::smem_u32(smem_dyn);
  const uint32_t pad = ((dyn + 1023u) & ~1023u) - dyn;  // the 128-byte swizzle wants 1024-aligned tiles
  unsigned char* smem = smem_dyn + pad;
  const uint32_t sbase = dyn + pad;
  const WgLayout L = wg_layout(BN, p.stages, F, kCx);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* empty = full + p.stages;
  int* s_mt = reinterpret_cast<int*>(smem + L.table);  // [n_experts + 1]
  int* s_warp = s_mt + p.n_experts + 1;                // [12]
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < p.stages; ++s) {
      wg::mbar_init(&full[s], kFullArrivals);
      wg::mbar_init(&empty[s], kEmptyArrivals);
    }
    wg::mbar_init_fence();
  }
  dev::grid_dep_enter();

  // Prefix of M tiles over experts (its barriers also publish the initialised mbarriers).
  moe_dev::m_tile_prefix<kThreads, kBM>(p.counts, p.n_experts, s_mt, s_warp);
  const int total_items = s_mt[p.n_experts] * p.n_tiles;

  const int wgi = wg::warp_uniform(tid / 128);
  if (wgi == 0) {
    producer<BN, F, kGateUp, kCx>(p, L, sbase, smem, full, empty, s_mt, total_items);
  } else {
    consumer<BN, F, kGateUp, kCx>(p, L, sbase, smem, full, empty, s_mt, total_items, wgi - 1);
  }
#else
  wg::trap_not_sm90a();
#endif
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

// Who expands NVFP4 tiles, read once: MOESERVE_MOE_WGMMA_EXPAND=producer selects the earlier layout (A/B
// timing without a rebuild); anything else the consumer expansion.
MoeWgExpand wg_expand() {
  static const MoeWgExpand x = [] {
    const char* v = std::getenv("MOESERVE_MOE_WGMMA_EXPAND");
    return v != nullptr && std::strcmp(v, "producer") == 0 ? MoeWgExpand::Producer : MoeWgExpand::Consumer;
  }();
  return x;
}

template <int BN, MoeMmaFormat F, bool kGateUp, bool kCx>
void launch_one(const WgParams& wp, const MoeExpertsParams& p, const DeviceCaps& caps, size_t smem,
                cudaStream_t stream) {
  const void* fn = reinterpret_cast<const void*>(&moe_wgmma_kernel<BN, F, kGateUp, kCx>);
  const int per_sm = moe_launch::resident_blocks("moe_experts_wgmma", fn, kThreads, smem, caps.device);
  const unsigned grid = moe_launch::grid(p, kBM, wp.n_tiles, per_sm, caps.multiprocessors);
  launch_kernel("moe_wgmma", moe_wgmma_kernel<BN, F, kGateUp, kCx>, grid, kThreads, smem, stream, wp);
}

template <bool kGateUp>
void launch_gemm(const WgParams& wp, const MoeExpertsParams& p, const MoeWgmmaGemmConfig& cfg,
                 const DeviceCaps& caps, cudaStream_t stream) {
  const bool nv = p.format == MoeWeightFormat::NVFP4, cx = cfg.expand == MoeWgExpand::Consumer;
  if (p.format == MoeWeightFormat::FP8Block) {
    if (cfg.bn == 256)
      launch_one<256, MoeMmaFormat::FP8Block, kGateUp, true>(wp, p, caps, cfg.smem, stream);
    else
      launch_one<128, MoeMmaFormat::FP8Block, kGateUp, true>(wp, p, caps, cfg.smem, stream);
    return;
  }
  if (cfg.bn == 256) {
    if (!nv)
      launch_one<256, MoeMmaFormat::BF16, kGateUp, false>(wp, p, caps, cfg.smem, stream);
    else if (cx)
      launch_one<256, MoeMmaFormat::NVFP4, kGateUp, true>(wp, p, caps, cfg.smem, stream);
    else
      launch_one<256, MoeMmaFormat::NVFP4, kGateUp, false>(wp, p, caps, cfg.smem, stream);
  } else {
    if (!nv)
      launch_one<128, MoeMmaFormat::BF16, kGateUp, false>(wp, p, caps, cfg.smem, stream);
    else if (cx)
      launch_one<128, MoeMmaFormat::NVFP4, kGateUp, true>(wp, p, caps, cfg.smem, stream);
    else
      launch_one<128, MoeMmaFormat::NVFP4, kGateUp, false>(wp, p, caps, cfg.smem, stream);
  }
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
  if (!choose_moe_wgmma_config(wg_shape(p), limits_of(caps), &why, wg_expand())) return why;
  return std::nullopt;
}

MoeWgmmaConfig moe_experts_wgmma_config(const MoeExpertsParams& p) {
  MS_CHECK(wg_format_ok(p.format), "moe_experts_wgmma: weight format {} is not NVFP4, FP8Block or BF16",
           static_cast<int>(p.format));
  const DeviceCaps caps = current_device_caps();
  std::string why;
  const auto cfg = choose_moe_wgmma_config(wg_shape(p), limits_of(caps), &why, wg_expand());
  MS_CHECK(cfg.has_value(), "{}", why);
  check_smem(caps, "moe_experts_wgmma gate_up", cfg->gate_up.smem);
  check_smem(caps, "moe_experts_wgmma down", cfg->down.smem);
  return *cfg;
}

void moe_experts_wgmma_gemms(const MoeExpertsParams& p, const void* xb, void* act, cudaStream_t stream) {
  const MoeWgmmaConfig cfg = moe_experts_wgmma_config(p);
  if (p.m == 0) return;
  MS_CHECK(xb != nullptr && reinterpret_cast<uintptr_t>(xb) % 16 == 0,
           "moe_experts_wgmma: xb is null or not 16-byte aligned");
  MS_CHECK(act != nullptr && reinterpret_cast<uintptr_t>(act) % 16 == 0,
           "moe_experts_wgmma: act is null or not 16-byte aligned");
  MS_CHECK(p.slot_out != nullptr && reinterpret_cast<uintptr_t>(p.slot_out) % 16 == 0,
           "moe_experts_wgmma: slot_out is null or not 16-byte aligned");
  const DeviceCaps caps = current_device_caps();

  WgParams wp;
  wp.counts = p.expert_counts;
  wp.offsets = p.expert_offsets;
  wp.sorted_slots = p.sorted_slots;
  wp.experts = p.experts;
  wp.top_k = p.top_k;
  wp.n_experts = p.n_experts;
  wp.fp8_block = p.fp8_block;

  WgParams gu = wp;
  gu.a = static_cast<const __nv_bfloat16*>(xb);
  gu.lda = p.hidden;
  gu.act = static_cast<__nv_bfloat16*>(act);
  gu.k = p.hidden;
  gu.n_out = p.inter;
  gu.n_tiles = p.inter / (cfg.gate_up.bn / 2);
  gu.stages = cfg.gate_up.stages;
  gu.fp8_scols = fp8_scale_cols(p, p.hidden);
  launch_gemm<true>(gu, p, cfg.gate_up, caps, stream);

  WgParams dn = wp;
  dn.a = static_cast<const __nv_bfloat16*>(act);
  dn.lda = p.inter;
  dn.slot_out = p.slot_out;
  dn.k = p.inter;
  dn.n_out = p.hidden;
  dn.n_tiles = p.hidden / cfg.down.bn;
  dn.stages = cfg.down.stages;
  dn.fp8_scols = fp8_scale_cols(p, p.inter);
  launch_gemm<false>(dn, p, cfg.down, caps, stream);
}

}  // namespace ms::cuda
