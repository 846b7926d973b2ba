// Grouped expert GEMMs on tensor cores (mma.sync m16n8k16 bf16 -> f32), one launch per projection.
//
// Block: 256 threads = 8 warps as 2 (M) x 4 (N); block tile BM (64 or 128) grouped rows x 128 weight rows,
// 64 k per stage. Warp (wm = warp / 4, wn = warp % 4) owns rows wm * BM/2 .. + BM/2 (MI = BM/32 m16 tiles)
// and four n8 tiles of weight rows:
//   gate_up: n8 tiles j = 0, 1 are gate rows wn*16 + 8j, j = 2, 3 the up rows 64 + wn*16 + 8(j-2): a lane
//            holds gate and up of the same act column in acc[i][j] and acc[i][j+2] -> SiLU-and-mul in
//            registers, act columns a0 + wn*16 + 8j + {2t, 2t+1}.
//   down:    n8 tile j is weight rows wn*32 + 8j -> output columns n0 + wn*32 + 8j + {2t, 2t+1}.
//
// Shared tiles are [rows][64] bf16, 128 bytes a row = 8 chunks of 16 bytes, chunk c of row r stored at chunk
// c ^ (r & 7): the 8 row addresses of one ldmatrix 8x8 matrix (8 consecutive rows, one chunk) fall in 8
// different 16-byte bank groups, and so do the cp.async / decode stores.
//
// Fragment layouts relied on (PTX ISA, mma.m16n8k16 .bf16, g = lane / 4, t = lane % 4):
//   A (row-major 16 x 16):  a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (k x n, "col"):       b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]   (B[k][n] = W[n][k]: W rows are n)
//   C (16 x 8 f32):         c0, c1 = C[g][2t], C[g][2t+1];  c2, c3 = C[g+8][2t], C[g+8][2t+1]
//   ldmatrix.x4 (no trans): lanes 8q..8q+7 give the 8 row addresses of matrix q; lane l receives row l / 4,
//                           elements 2(l % 4), 2(l % 4)+1 of each matrix, in register q.
// So for A, matrix q = (rows (q & 1) * 8 + 0..7, k chunk q >> 1) gives a0..a3; for W, matrix q = (rows
// (q >> 1) * 8 + 0..7, k chunk q & 1) gives b0, b1 of n8 tile 2p and b0, b1 of n8 tile 2p + 1.
//
// Pipeline per k step kc (S stages): wait until stage kc has landed, barrier (everyone is also done with
// step kc - 1, whose stage buffer the next copy reuses), [NVFP4: expand stage kc into the bf16 tile,
// barrier], issue the copy of step kc + S - 1, then the 4 k16 sub-steps of mma.
//
// Work items: expert e has mt_e = ceil(count_e / BM) M tiles; items are ordered (expert, N tile, M tile),
// M tile fastest, so blocks that run together share a weight tile (L2) and an expert's activation rows.
// Every block scans the counts into a shared prefix of M tiles and maps items by binary search.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/moe/moe_device_common.cuh"
#include "kernels/cuda/moe/moe_experts_mma.h"
#include "kernels/cuda/moe/moe_experts_wgmma.h"
#include "kernels/cuda/moe/moe_grouped_launch.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = kMoeMmaThreads;
constexpr int kBN = kMoeMmaBN;
constexpr int kBK = kMoeMmaBK;
constexpr int kRowBytes = kBK * 2;  // one bf16 tile row
static_assert(kThreads == 256 && kBN == 128 && kBK == 64, "the thread mappings below assume these");

struct MmaParams {
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
  int n_tiles = 0;      // gate_up: inter / 64; down: hidden / 128
  int fp8_block = 128;  // FP8Block scale block edge, a multiple of 64
  int fp8_scols = 0;    // FP8Block scale columns: ceil(k / fp8_block)
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, src is not read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

using tc::mma_bf16;

using moe_dev::e2m1x8_to_bf16;
using moe_dev::fp8_e4m3_value;

// Weight stage as stored (moe_mma_w_stage_bytes): BF16 the swizzled [128][64] bf16 tile; NVFP4 [128][32]
// packed bytes then [128][4] e4m3 scales; FP8Block [128][64] e4m3 in moe_dev::fp8_raw_offset's piece order
// then one f32 scale per 64-row group (2 used of 4 slots).
template <int BM, int STAGES, MoeMmaFormat F>
struct Layout {
  static constexpr int kAStage = BM * kRowBytes;
  static constexpr int kWData = F == MoeMmaFormat::BF16    ? kBN * kRowBytes
                                : F == MoeMmaFormat::NVFP4 ? kBN * (kBK / 2)
                                                           : kBN * kBK;
  static constexpr int kWStage = F == MoeMmaFormat::BF16    ? kWData
                                 : F == MoeMmaFormat::NVFP4 ? kWData + kBN * (kBK / 16)
                                                            : kWData + 16;
  static constexpr int kA = 0;
  static constexpr int kW = kA + STAGES * kAStage;
  static constexpr int kDecoded = kW + STAGES * kWStage;  // NVFP4, FP8Block
  static constexpr int kTable = kDecoded + (F != MoeMmaFormat::BF16 ? kBN * kRowBytes : 0);
};

template <int BM, int STAGES, MoeMmaFormat F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_mma_kernel(const MmaParams p) {
  dev::grid_dep_enter();
  using L = Layout<BM, STAGES, F>;
  constexpr int WM = BM / 2;   // rows per warp
  constexpr int MI = WM / 16;  // m16 tiles per warp
  constexpr int AR = BM / 32;  // A rows each thread copies per stage
  static_assert(L::kTable % 16 == 0, "table alignment");
  extern __shared__ __align__(128) unsigned char smem[];
  int32_t* s_mt = reinterpret_cast<int32_t*>(smem + L::kTable);  // [n_experts + 1] prefix of M tiles
  int32_t* s_warp = s_mt + p.n_experts + 1;                      // [8]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Prefix of M tiles over experts: thread tid owns experts [tid * per, tid * per + per). The same as
  // moe_dev::m_tile_prefix, written out here: as a call it costs one of this kernel's instantiations a
  // register spill (ptxas).
  {
    const int per = (p.n_experts + kThreads - 1) / kThreads;
    const int e0 = min(tid * per, p.n_experts), e1 = min(e0 + per, p.n_experts);
    int run = 0;
    for (int e = e0; e < e1; ++e) run += (p.counts[e] + BM - 1) / BM;
    int incl = run;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    int before = 0;
    for (int w = 0; w < warp; ++w) before += s_warp[w];
    int off = before + incl - run;
    for (int e = e0; e < e1; ++e) {
      s_mt[e] = off;
      off += (p.counts[e] + BM - 1) / BM;
    }
    if (tid == kThreads - 1) s_mt[p.n_experts] = off;
    __syncthreads();
  }
  const int total_items = s_mt[p.n_experts] * p.n_tiles;

  const int wm = warp >> 2, wn = warp & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t smem_base = smem_addr(smem);
  const int nk = p.k / kBK;

  for (int item = blockIdx.x; item < total_items; item += gridDim.x) {
    // item -> expert (largest e with s_mt[e] <= item / n_tiles), N tile, M tile.
    const int q = item / p.n_tiles;
    int lo = 0, hi = p.n_experts - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_mt[mid] <= q)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int e = lo;
    const int mt_e = s_mt[e + 1] - s_mt[e];
    const int local = item - s_mt[e] * p.n_tiles;
    const int nt = local / mt_e, mt = local % mt_e;
    const int count = p.counts[e];
    const int m0 = mt * BM;
    const int rows = min(BM, count - m0);
    const int pos0 = p.offsets[e] + m0;
    const MoeExpertWeights ew = p.experts[e];

    // This thread's A rows (tid / 8 + 32 i, chunk tid % 8) for every stage of the item.
    const __nv_bfloat16* a_src[AR];
#pragma unroll
    for (int i = 0; i < AR; ++i) {
      const int r = (tid >> 3) + 32 * i;
      a_src[i] = p.a;  // any valid address: zero-filled rows do not read it
      if (r < rows) {
        const int pos = pos0 + r;
        if constexpr (kGateUp) {
          a_src[i] = p.a + static_cast<int64_t>(p.sorted_slots[pos] / p.top_k) * p.lda;
        } else {
          a_src[i] = p.a + static_cast<int64_t>(pos) * p.lda;
        }
      }
    }
    // This thread's weight rows. gate_up: tile rows 0..63 = gate rows a0 + r, 64..127 = up rows a0 + r - 64
    // (a0 = nt * 64); down: tile row r = down row nt * 128 + r.
    auto w_row = [&](int r, const void*& data, const void*& scale, float& scale2) {
      int64_t row;
      if constexpr (kGateUp) {
        const bool up = r >= kBN / 2;
        row = static_cast<int64_t>(nt) * (kBN / 2) + (up ? r - kBN / 2 : r);
        data = up ? ew.up : ew.gate;
        scale = up ? ew.up_scale : ew.gate_scale;
        scale2 = up ? ew.up_scale2 : ew.gate_scale2;
      } else {
        row = static_cast<int64_t>(nt) * kBN + r;
        data = ew.down;
        scale = ew.down_scale;
        scale2 = ew.down_scale2;
      }
      if constexpr (F == MoeMmaFormat::BF16) {
        data = static_cast<const uint8_t*>(data) + row * p.k * 2;
      } else if constexpr (F == MoeMmaFormat::FP8Block) {
        // The scale row of the row's block (a 64-row group starting at a multiple of 64 lies in one block).
        data = static_cast<const uint8_t*>(data) + row * p.k;
        scale = static_cast<const float*>(scale) + (row / p.fp8_block) * p.fp8_scols;
      } else {
        data = static_cast<const uint8_t*>(data) + row * (p.k / 2);
        scale = static_cast<const uint8_t*>(scale) + row * (p.k / 16);
      }
    };
    // BF16: rows tid / 8 + 32 i (i < 4), chunk tid % 8. NVFP4: data row tid / 2, 16-byte half tid % 2;
    // scales of row tid (tid < 128), 4 bytes (4 groups of 16 k) a stage. Also the decode role: row tid / 2,
    // k half tid % 2.
    // FP8Block: data rows tid / 4 + 64 i (i < 2), 16-byte piece tid % 4; the scale of 64-row group tid
    // (tid < 2); the decode role as NVFP4's (row tid / 2, k half tid % 2).
    constexpr int WR = F == MoeMmaFormat::BF16 ? 4 : F == MoeMmaFormat::FP8Block ? 2 : 1;
    const uint8_t* w_src[WR];
    const uint8_t* s_src = nullptr;
    float s2 = 1.0f;
    {
      const void* d;
      const void* sc;
      float s2r;
      if constexpr (F == MoeMmaFormat::BF16) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          w_row((tid >> 3) + 32 * i, d, sc, s2r);
          w_src[i] = static_cast<const uint8_t*>(d) + (tid & 7) * 16;
        }
      } else if constexpr (F == MoeMmaFormat::FP8Block) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          w_row((tid >> 2) + 64 * i, d, sc, s2r);
          w_src[i] = static_cast<const uint8_t*>(d) + (tid & 3) * 16;
        }
        if (tid < kBN / 64) {
          w_row(64 * tid, d, sc, s2r);
          s_src = static_cast<const uint8_t*>(sc);
        }
      } else {
        w_row(tid >> 1, d, sc, s2r);
        w_src[0] = static_cast<const uint8_t*>(d) + (tid & 1) * 16;
        s2 = s2r;  // scale2 of the decode row (tid / 2): same matrix as the data row
        if (tid < kBN) {
          w_row(tid, d, sc, s2r);
          s_src = static_cast<const uint8_t*>(sc);
        }
      }
    }

    auto load_stage = [&](int kc) {
      const int st = kc % STAGES;
      const uint32_t a_base = smem_base + L::kA + st * L::kAStage;
#pragma unroll
      for (int i = 0; i < AR; ++i) {
        const int r = (tid >> 3) + 32 * i;
        cp_async16(a_base + swz(r, tid & 7), a_src[i] + kc * kBK + (tid & 7) * 8, r < rows);
      }
      const uint32_t w_base = smem_base + L::kW + st * L::kWStage;
      if constexpr (F == MoeMmaFormat::BF16) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = (tid >> 3) + 32 * i;
          cp_async16(w_base + swz(r, tid & 7), w_src[i] + static_cast<int64_t>(kc) * kRowBytes, true);
        }
      } else if constexpr (F == MoeMmaFormat::FP8Block) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          cp_async16(w_base + moe_dev::fp8_raw_offset((tid >> 2) + 64 * i, tid & 3),
                     w_src[i] + static_cast<int64_t>(kc) * kBK, true);
        if (tid < kBN / 64)
          cp_async4(w_base + L::kWData + tid * 4,
                    reinterpret_cast<const float*>(s_src) + (kc * kBK) / p.fp8_block);
      } else {
        cp_async16(w_base + tid * 16, w_src[0] + kc * (kBK / 2), true);
        if (tid < kBN) cp_async4(w_base + L::kWData + tid * 4, s_src + kc * (kBK / 16));
      }
    };

    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
    // m16 tiles of this warp that hold a live row (warp-uniform).
    const int mi_live = max(0, min(MI, (rows - wm * WM + 15) / 16));

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < nk) load_stage(s);
      cp_async_commit();
    }

    for (int kc = 0; kc < nk; ++kc) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      const int st = kc % STAGES;
      uint32_t b_base;
      if constexpr (F == MoeMmaFormat::NVFP4) {
        const unsigned char* raw = smem + L::kW + st * L::kWStage;
        const int r = tid >> 1, half = tid & 1;
        const uint4 q4 = *reinterpret_cast<const uint4*>(raw + r * (kBK / 2) + half * 16);
        const uint8_t* sc = raw + L::kWData + r * 4 + half * 2;
        // The CPU dequantiser's product order: e4m3(scale) * scale2, then code * that.
        const __nv_bfloat162 sa = __float2bfloat162_rn(fp8_e4m3_value(sc[0]) * s2);
        const __nv_bfloat162 sb = __float2bfloat162_rn(fp8_e4m3_value(sc[1]) * s2);
        unsigned char* dec = smem + L::kDecoded;
        *reinterpret_cast<uint4*>(dec + swz(r, half * 4 + 0)) = e2m1x8_to_bf16(q4.x, sa);
        *reinterpret_cast<uint4*>(dec + swz(r, half * 4 + 1)) = e2m1x8_to_bf16(q4.y, sa);
        *reinterpret_cast<uint4*>(dec + swz(r, half * 4 + 2)) = e2m1x8_to_bf16(q4.z, sb);
        *reinterpret_cast<uint4*>(dec + swz(r, half * 4 + 3)) = e2m1x8_to_bf16(q4.w, sb);
        b_base = smem_base + L::kDecoded;
      } else if constexpr (F == MoeMmaFormat::FP8Block) {
        // Row tid / 2, pieces 2 half, 2 half + 1 (k 32 half .. 32 half + 31) = bf16 chunks 4 half .. + 3.
        const unsigned char* raw = smem + L::kW + st * L::kWStage;
        const int r = tid >> 1, half = tid & 1;
        const float sc = *reinterpret_cast<const float*>(raw + L::kWData + (r >> 6) * 4);
        unsigned char* dec = smem + L::kDecoded;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int piece = 2 * half + i;
          const uint4 v = *reinterpret_cast<const uint4*>(raw + moe_dev::fp8_raw_offset(r, piece));
          *reinterpret_cast<uint4*>(dec + swz(r, 2 * piece)) = moe_dev::e4m3x8_to_bf16(v.x, v.y, sc);
          *reinterpret_cast<uint4*>(dec + swz(r, 2 * piece + 1)) = moe_dev::e4m3x8_to_bf16(v.z, v.w, sc);
        }
        b_base = smem_base + L::kDecoded;
      } else {
        b_base = smem_base + L::kW + st * L::kWStage;
      }
      if (kc + STAGES - 1 < nk) load_stage(kc + STAGES - 1);
      cp_async_commit();
      if constexpr (F != MoeMmaFormat::BF16) __syncthreads();

      const uint32_t a_base = smem_base + L::kA + st * L::kAStage;
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        uint32_t b[4][2];
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {
          // n8 tiles 2pr, 2pr + 1 of this warp.
          const int nrow = kGateUp ? (pr == 0 ? wn * 16 : kBN / 2 + wn * 16) : wn * 32 + pr * 16;
          const int r = nrow + (lane & 7) + ((lane >> 4) << 3);
          const int c = ks * 2 + ((lane >> 3) & 1);
          uint32_t v[4];
          ldmatrix_x4(v, b_base + swz(r, c));
          b[2 * pr][0] = v[0];
          b[2 * pr][1] = v[1];
          b[2 * pr + 1][0] = v[2];
          b[2 * pr + 1][1] = v[3];
        }
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          if (i < mi_live) {
            const int r = wm * WM + i * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
            const int c = ks * 2 + (lane >> 4);
            uint32_t a[4];
            ldmatrix_x4(a, a_base + swz(r, c));
#pragma unroll
            for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], a, b[j][0], b[j][1]);
          }
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next item's first copies reuse every stage

#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * WM + i * 16 + g + 8 * h;
        if (r >= rows) continue;
        const int64_t pos = pos0 + r;
        if constexpr (kGateUp) {
          __nv_bfloat16* dst = p.act + pos * p.n_out + nt * (kBN / 2) + wn * 16 + 2 * t4;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float g0 = acc[i][j][2 * h], g1 = acc[i][j][2 * h + 1];
            const float u0 = acc[i][j + 2][2 * h], u1 = acc[i][j + 2][2 * h + 1];
            // The CPU silu_mul's expression.
            const __nv_bfloat162 v =
                __floats2bfloat162_rn(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
            *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) = v;
          }
        } else {
          float* dst =
              p.slot_out + static_cast<int64_t>(p.sorted_slots[pos]) * p.n_out + nt * kBN + wn * 32 + 2 * t4;
#pragma unroll
          for (int j = 0; j < 4; ++j)
            *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
  }
}

// x f32 [m, hidden] (row stride ldx) -> xb bf16 [m, hidden] packed, 8 elements a thread (hidden % 8 == 0).
__global__ void __launch_bounds__(256)
    moe_mma_convert_kernel(const float* __restrict__ x, int64_t ldx, __nv_bfloat16* __restrict__ xb, int m,
                           int hidden) {
  dev::grid_dep_enter();
  const int64_t per_row = hidden / 8;
  const int64_t n = static_cast<int64_t>(m) * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, c = (i % per_row) * 8;
    const float* src = x + row * ldx + c;
    uint4 o;
    uint32_t* op = &o.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(src[2 * j], src[2 * j + 1]);
      op[j] = *reinterpret_cast<const uint32_t*>(&v);
    }
    *reinterpret_cast<uint4*>(xb + row * hidden + c) = o;
  }
}

MoeMmaFormat mma_format(MoeWeightFormat f) {
  return f == MoeWeightFormat::BF16       ? MoeMmaFormat::BF16
         : f == MoeWeightFormat::FP8Block ? MoeMmaFormat::FP8Block
                                          : MoeMmaFormat::NVFP4;
}

MoeMmaShape mma_shape(const MoeExpertsParams& p) {
  return {mma_format(p.format), p.m, p.top_k, p.n_experts, p.hidden, p.inter, p.fp8_block};
}

size_t align256(size_t b) {
  return (b + 255) / 256 * 256;
}

template <int BM, int STAGES, MoeMmaFormat F, bool kGateUp>
void launch_one(const MmaParams& mp, const MoeExpertsParams& p, const DeviceCaps& caps, size_t smem,
                cudaStream_t stream) {
  const void* fn = reinterpret_cast<const void*>(&moe_mma_kernel<BM, STAGES, F, kGateUp>);
  const int per_sm = moe_launch::resident_blocks("moe_experts_mma", fn, kThreads, smem, caps.device);
  const unsigned grid = moe_launch::grid(p, BM, mp.n_tiles, per_sm, caps.multiprocessors);
  launch_kernel("moe_mma", moe_mma_kernel<BM, STAGES, F, kGateUp>, grid, kThreads, smem, stream, mp);
}

template <MoeMmaFormat F, bool kGateUp>
void launch_cfg(const MmaParams& mp, const MoeExpertsParams& p, const MoeMmaConfig& cfg,
                const DeviceCaps& caps, cudaStream_t stream) {
  const bool b128 = cfg.bm == 128;
  switch (cfg.stages) {
    case 4:
      b128 ? launch_one<128, 4, F, kGateUp>(mp, p, caps, cfg.smem, stream)
           : launch_one<64, 4, F, kGateUp>(mp, p, caps, cfg.smem, stream);
      break;
    case 3:
      b128 ? launch_one<128, 3, F, kGateUp>(mp, p, caps, cfg.smem, stream)
           : launch_one<64, 3, F, kGateUp>(mp, p, caps, cfg.smem, stream);
      break;
    default:
      b128 ? launch_one<128, 2, F, kGateUp>(mp, p, caps, cfg.smem, stream)
           : launch_one<64, 2, F, kGateUp>(mp, p, caps, cfg.smem, stream);
      break;
  }
}

template <bool kGateUp>
void launch_gemm(const MmaParams& mp, const MoeExpertsParams& p, const MoeMmaConfig& cfg,
                 const DeviceCaps& caps, cudaStream_t stream) {
  if (p.format == MoeWeightFormat::BF16) {
    launch_cfg<MoeMmaFormat::BF16, kGateUp>(mp, p, cfg, caps, stream);
  } else if (p.format == MoeWeightFormat::FP8Block) {
    launch_cfg<MoeMmaFormat::FP8Block, kGateUp>(mp, p, cfg, caps, stream);
  } else {
    launch_cfg<MoeMmaFormat::NVFP4, kGateUp>(mp, p, cfg, caps, stream);
  }
}

// Scale columns of an FP8Block matrix whose rows are k wide (0 for the other formats, whose fp8_block is
// not checked and may be anything).
int fp8_scale_cols(const MoeExpertsParams& p, int k) {
  return p.format == MoeWeightFormat::FP8Block ? (k + p.fp8_block - 1) / p.fp8_block : 0;
}

}  // namespace

bool moe_experts_mma_supported(const MoeExpertsParams& p) {
  if (p.format != MoeWeightFormat::BF16 && p.format != MoeWeightFormat::NVFP4 &&
      p.format != MoeWeightFormat::FP8Block)
    return false;
  return !moe_mma_shape_unsupported(mma_shape(p)).has_value();
}

MoePrefillKernel moe_experts_prefill_kernel(const MoeExpertsParams& p) {
  if (p.prefill_kernel != MoePrefillKernel::Auto) return p.prefill_kernel;
  // The environment's choice, read once: benchmarks and A/B runs switch kernels without a rebuild.
  static const MoePrefillKernel env = [] {
    const char* v = std::getenv("MOESERVE_MOE_PREFILL_KERNEL");
    if (v != nullptr && std::strcmp(v, "mma") == 0) return MoePrefillKernel::Mma;
    if (v != nullptr && std::strcmp(v, "wgmma") == 0) return MoePrefillKernel::Wgmma;
    return MoePrefillKernel::Auto;
  }();
  if (env != MoePrefillKernel::Auto) return env;
  if (!moe_wgmma_preferred(mma_shape(p))) return MoePrefillKernel::Mma;
  return moe_experts_wgmma_unavailable(p).has_value() ? MoePrefillKernel::Mma : MoePrefillKernel::Wgmma;
}

size_t moe_experts_mma_workspace_bytes(int m, int top_k, int hidden, int inter) {
  const size_t mm = static_cast<size_t>(std::max(m, 0));
  const size_t slots = mm * std::max(top_k, 0);
  // xb, act, xg (grouped rows of the tensor-copy loads), then 256 bytes for the wgmma launches' counters.
  return align256(mm * std::max(hidden, 0) * 2) + align256(slots * std::max(inter, 0) * 2) +
         align256(slots * std::max(hidden, 0) * 2) + 256;
}

MoeMmaConfig moe_experts_mma_config(const MoeExpertsParams& p) {
  const DeviceCaps caps = current_device_caps();
  std::string why;
  const auto cfg = choose_moe_mma_config(mma_shape(p), limits_of(caps), &why);
  MS_CHECK(cfg.has_value(), "{}", why);
  check_smem(caps, "moe_experts_mma", cfg->smem);
  return *cfg;
}

void moe_experts_mma(const MoeExpertsParams& p_in, void* workspace, cudaStream_t stream) {
  // act (the f32 workspace of the CUDA-core path) is not used here; the checks and the combine only need it
  // set.
  MoeExpertsParams p = p_in;
  if (p.act == nullptr) p.act = static_cast<float*>(workspace);
  moe_experts_check(p);
  MS_CHECK(moe_experts_mma_supported(p),
           "moe_experts_mma: format {} hidden {} inter {} n_experts {} fp8_block {} is not supported (NVFP4, "
           "FP8Block or BF16, hidden % 128 == 0, inter % 64 == 0, n_experts <= 1024, fp8_block % 64 == 0)",
           static_cast<int>(p.format), p.hidden, p.inter, p.n_experts, p.fp8_block);
  if (p.m == 0) return;
  MS_CHECK(workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
           "moe_experts_mma: workspace is null or not 256-byte aligned");
  MS_CHECK(reinterpret_cast<uintptr_t>(p.slot_out) % 16 == 0,
           "moe_experts_mma: slot_out is not 16-byte aligned");
  const DeviceCaps caps = current_device_caps();
  const bool wgmma = moe_experts_prefill_kernel(p) == MoePrefillKernel::Wgmma;
  std::optional<MoeMmaConfig> cfg;
  if (wgmma) {
    moe_experts_wgmma_config(p);  // throws with the reason before any launch where it cannot run
  } else {
    std::string why;
    cfg = choose_moe_mma_config(mma_shape(p), limits_of(caps), &why);
    MS_CHECK(cfg.has_value(), "{}", why);
    check_smem(caps, "moe_experts_mma", cfg->smem);
  }

  auto* xb = static_cast<__nv_bfloat16*>(workspace);
  auto* act = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(workspace) +
                                               align256(static_cast<size_t>(p.m) * p.hidden * 2));
  {
    const int64_t n = static_cast<int64_t>(p.m) * (p.hidden / 8);
    const int blocks =
        static_cast<int>(std::min<int64_t>((n + 255) / 256, int64_t{caps.multiprocessors} * 8));
    launch_kernel("moe_mma_convert", moe_mma_convert_kernel, std::max(blocks, 1), 256, 0, stream, p.x, p.ldx,
                  xb, p.m, p.hidden);
  }
  if (wgmma) {
    auto* xg = static_cast<char*>(workspace) + align256(static_cast<size_t>(p.m) * p.hidden * 2) +
               align256(static_cast<size_t>(p.m) * p.top_k * p.inter * 2);
    auto* counters = reinterpret_cast<int*>(xg + align256(static_cast<size_t>(p.m) * p.top_k * p.hidden * 2));
    moe_experts_wgmma_gemms(p, xb, xg, act, counters, stream);
    moe_experts_combine(p, stream);
    return;
  }
  MmaParams mp;
  mp.counts = p.expert_counts;
  mp.offsets = p.expert_offsets;
  mp.sorted_slots = p.sorted_slots;
  mp.experts = p.experts;
  mp.top_k = p.top_k;
  mp.n_experts = p.n_experts;
  mp.fp8_block = p.fp8_block;

  MmaParams gu = mp;
  gu.a = xb;
  gu.lda = p.hidden;
  gu.act = act;
  gu.k = p.hidden;
  gu.n_out = p.inter;
  gu.n_tiles = p.inter / (kBN / 2);
  gu.fp8_scols = fp8_scale_cols(p, p.hidden);
  launch_gemm<true>(gu, p, *cfg, caps, stream);

  MmaParams dn = mp;
  dn.a = act;
  dn.lda = p.inter;
  dn.slot_out = p.slot_out;
  dn.k = p.inter;
  dn.n_out = p.hidden;
  dn.n_tiles = p.hidden / kBN;
  dn.fp8_scols = fp8_scale_cols(p, p.inter);
  launch_gemm<false>(dn, p, *cfg, caps, stream);

  moe_experts_combine(p, stream);
}

}  // namespace ms::cuda
