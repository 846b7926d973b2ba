// The bulk-copy ring variant of the NVFP4 decode experts (moe_experts_decode.h, decode_ring = 2; layouts and
// the choice of stages in moe_decode_config.h).
//
// Why: the register kernels keep their weight bytes in flight in registers, and their load pattern (8 rows x
// 64 bytes a warp instruction) streamed 72-81% of the copy ceiling on an H200 with no math at all, while a
// producer thread copying whole rows into a shared-memory ring streamed 98% (bench_stream_patterns). Here one
// producer warp per block copies each stage's row pieces (lanes 0-15 weight rows, 16-31 scale rows, one
// cp.async.bulk each) after the stage's `empty` barrier says its consumers are done, announcing the bytes on
// its `full` barrier; consumers wait on `full`, decode from shared memory with the register kernels' math
// (moe_decode_math.cuh: the same lane k order, table and mma tile) and arrive on `empty`.
//
// gate_up (persistent, one block per multiprocessor): item = (expert chunk of <= x_rows positions, 16
// intermediate indices); stage = the item's 16 gate rows then 16 up rows over kb of k, row pitch
// bulk_w_pitch(kb), then their scale rows at bulk_s_pitch(kb). Consumer group h = warps 8 h .. 8 h + 7 owns
// the m16 tile {gate rows 8 h + g, up rows 8 h + g} (acc rows g and g + 8); warp w of a group covers k
// [w kb / 8, (w + 1) kb / 8) of every stage, lane (g, t) the 32 k from 32 t of each 128-k step. The chunk's
// x rows are staged as bf16 (moe_decode_config.h: xs_ld) and partial sums meet in shared memory once per
// item (in warp order: deterministic).
//
// down (one block per 16 output rows): stage j = expert chunk j of the block's work list, 16 rows x inter;
// consumer warp w computes the 128-k steps w, w + 8, ... of every stage and adds its partial rows x
// down_scale2 into its own output tile out_w[warp][token][16] (positions in order); the block then sums the
// 8 tiles in warp order and adds to out once.
//
// Every wait on an mbarrier gives up after about 4 s of clock (a bug, never a slow copy) and traps, so a
// broken phase becomes a launch error instead of a hang.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe/moe_decode_math.cuh"
#include "kernels/cuda/moe/moe_experts_decode.h"

namespace ms::cuda {
namespace {

using namespace moe_decode_config;
using moe_decode_dev::kLutScale;
using moe_decode_dev::tile_step;

__device__ __forceinline__ void wait_or_trap(uint64_t* bar, uint32_t parity) {
  if (wg::mbar_try_wait(bar, parity)) return;
  const long long t0 = clock64();
  while (!wg::mbar_try_wait(bar, parity))
    if (clock64() - t0 > (1ll << 33)) __trap();
}

// Named barrier 1 over the consumer warps only (the producer warp never joins it).
template <int kCount>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kCount) : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds16(uint32_t a) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(a));
  return v;
}

// ---- gate_up --------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kBulkGuThreads, 1)
    moe_decode_gate_up_bulk_kernel(const MoeExpertsParams p, int x_rows, int stages) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int H = p.hidden;
  const int64_t xld = xs_ld(H);
  const int kb = bulk_gate_up_kb(H);
  const int sp = H / kb;  // stages per item
  const uint32_t wpitch = static_cast<uint32_t>(bulk_w_pitch(kb)),
                 spitch = static_cast<uint32_t>(bulk_s_pitch(kb));
  const uint32_t stage_bytes = static_cast<uint32_t>(bulk_gate_up_stage(H));
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + kLutBytes);
  float* red = reinterpret_cast<float*>(smem + kLutBytes + static_cast<size_t>(x_rows) * xld * 2);
  int32_t* ec = reinterpret_cast<int32_t*>(red + kBulkGuWarps * 2 * kChunk * 8);
  uint8_t* ring = smem + bulk_gate_up_base(H, x_rows);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + static_cast<size_t>(stages) * stage_bytes);
  uint64_t* empty = full + stages;
  __shared__ int s_nec;
  // Per staged chunk (two buffers, by the parity of the chunk's staging): the positions' routing weights and
  // the expert's gate / up global scales, so the item's epilogue reads no global memory.
  __shared__ float s_wt[2][kChunk], s_s2[2][2];

  moe_dev::build_e2m1_lut<kBulkGuThreads>(lut, kLutScale);
  moe_dev::build_ec<kMaxEc>(p, x_rows, ec, &s_nec);
  if (threadIdx.x == 32) {
    for (int s = 0; s < stages; ++s) {
      wg::mbar_init(&full[s], 1);
      wg::mbar_init(&empty[s], kBulkGuWarps);
    }
    wg::mbar_init_fence();
  }
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = p.inter / kBulkGuIdx;
  const int items = s_nec * tiles;
  const int it0 = static_cast<int>(static_cast<int64_t>(items) * blockIdx.x / gridDim.x);
  const int it1 = static_cast<int>(static_cast<int64_t>(items) * (blockIdx.x + 1) / gridDim.x);

  if (warp == kBulkGuWarps) {  // producer
    const int64_t row_bytes = H / 2, srow_bytes = H / 16;
    const uint32_t w_bytes = static_cast<uint32_t>(kb / 2), s_bytes = static_cast<uint32_t>(kb / 16);
    const int nst = (it1 - it0) * sp;
    for (int q = 0; q < nst; ++q) {
      const int slot = q % stages;
      const uint32_t round = static_cast<uint32_t>(q / stages);
      if (round > 0) wait_or_trap(&empty[slot], (round - 1) & 1u);
      const int item = it0 + q / sp, part = q - (q / sp) * sp;
      const MoeExpertWeights& ew = p.experts[ec[item / tiles] & 1023];
      const int64_t row = static_cast<int64_t>(item % tiles) * kBulkGuIdx + (lane & 15);
      uint8_t* st = ring + static_cast<size_t>(slot) * stage_bytes;
      if (lane == 0) wg::mbar_arrive_expect_tx(&full[slot], 32u * (w_bytes + s_bytes));
      __syncwarp();
      // Lanes 0-15: the gate and the up row of index `row` (stage rows r and 16 + r); 16-31: their scales.
      if (lane < 16) {
        wg::bulk_copy_g2s(st + (lane & 15) * wpitch,
                          static_cast<const uint8_t*>(ew.gate) + row * row_bytes + part * w_bytes, w_bytes,
                          &full[slot]);
        wg::bulk_copy_g2s(st + (16 + (lane & 15)) * wpitch,
                          static_cast<const uint8_t*>(ew.up) + row * row_bytes + part * w_bytes, w_bytes,
                          &full[slot]);
      } else {
        uint8_t* ss = st + 32 * wpitch;
        wg::bulk_copy_g2s(ss + (lane & 15) * spitch,
                          static_cast<const uint8_t*>(ew.gate_scale) + row * srow_bytes + part * s_bytes,
                          s_bytes, &full[slot]);
        wg::bulk_copy_g2s(ss + (16 + (lane & 15)) * spitch,
                          static_cast<const uint8_t*>(ew.up_scale) + row * srow_bytes + part * s_bytes,
                          s_bytes, &full[slot]);
      }
    }
    return;
  }

  // Consumers. Group h = warp / 8 owns stage rows 8 h + g (gate) and 16 + 8 h + g (up) for g = lane / 4.
  const int grp = warp >> 3, wk = warp & 7, g = lane >> 2, t = lane & 3;
  const uint32_t lut_lane = wg::smem_u32(lut) + 4u * lane;
  const uint32_t ring0 = wg::smem_u32(ring);
  const uint32_t k_byte =
      static_cast<uint32_t>(wk * (kb / 16) + 16 * t);  // lane's first weight byte of a row
  const uint32_t w_off0 = static_cast<uint32_t>(8 * grp + g) * wpitch + k_byte;
  const uint32_t w_off1 = static_cast<uint32_t>(16 + 8 * grp + g) * wpitch + k_byte;
  const uint32_t s_k = static_cast<uint32_t>(wk * (kb / 128) + 2 * t);
  const uint32_t s_off0 = 32 * wpitch + static_cast<uint32_t>(8 * grp + g) * spitch + s_k;
  const uint32_t s_off1 = 32 * wpitch + static_cast<uint32_t>(16 + 8 * grp + g) * spitch + s_k;
  const int sw = (t >> 1) & 1;  // x piece swizzle: bit 1 of the 64-byte group index is t >> 1 here
  const int steps = kb / 1024;  // 128-k steps of a warp per stage
  __nv_bfloat16* actb = reinterpret_cast<__nv_bfloat16*>(p.act);
  int staged = -1, q = 0, buf = 1, rows = 0, pos0 = 0;
  for (int item = it0; item < it1; ++item) {
    const int eci = item / tiles, tile = item % tiles;
    if (eci != staged) {
      const int code = ec[eci];
      const int e = code & 1023, chunk = code >> 10;
      rows = min(x_rows, p.expert_counts[e] - chunk * x_rows);
      pos0 = p.expert_offsets[e] + chunk * x_rows;
      buf ^= 1;
      if (tid < rows) s_wt[buf][tid] = p.topk_weights[p.sorted_slots[pos0 + tid]];
      if (tid == 32) {
        s_s2[buf][0] = p.experts[e].gate_scale2;
        s_s2[buf][1] = p.experts[e].up_scale2;
      }
      moe_decode_dev::stage_x_rows(p, pos0, rows, xs, xld, tid, kBulkGuWarps * 32);
      staged = eci;
    }
    consumers_sync<kBulkGuWarps * 32>();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int part = 0; part < sp; ++part, ++q) {
      const int slot = q % stages;
      wait_or_trap(&full[slot], static_cast<uint32_t>(q / stages) & 1u);
      const uint32_t st = ring0 + static_cast<uint32_t>(slot) * stage_bytes;
      const __nv_bfloat16* xl = xs + g * xld + part * kb + wk * (kb / 8) + 32 * t;
      for (int s = 0; s < steps; ++s) {
        const uint4 w0 = lds128(st + w_off0 + 64 * s), w1 = lds128(st + w_off1 + 64 * s);
        const uint32_t sc0 = lds16(st + s_off0 + 8 * s), sc1 = lds16(st + s_off1 + 8 * s);
        uint4 b[4];
#pragma unroll
        for (int j2 = 0; j2 < 4; ++j2)
          b[j2] = g < rows ? *reinterpret_cast<const uint4*>(xl + 128 * s + 8 * (j2 ^ sw))
                           : make_uint4(0u, 0u, 0u, 0u);
        tile_step(acc, w0, w1, sc0, sc1, b, lut_lane);
      }
      __syncwarp();
      if (lane == 0) wg::mbar_arrive(&empty[slot]);
    }
    // red [warp][gate / up][position][8 indices]; C fragment: rows g (gate) / g + 8 (up), positions 2t, 2t+1.
    float* rw = red + warp * 2 * kChunk * 8;
    rw[(2 * t) * 8 + g] = acc[0];
    rw[(2 * t + 1) * 8 + g] = acc[1];
    rw[(kChunk + 2 * t) * 8 + g] = acc[2];
    rw[(kChunk + 2 * t + 1) * 8 + g] = acc[3];
    consumers_sync<kBulkGuWarps * 32>();  // also: every warp is done reading xs
    if (tid < rows * kBulkGuIdx) {
      const int r = tid >> 4, i = tid & 15, h = i >> 3, ii = i & 7;
      float gs = 0.f, us = 0.f;
#pragma unroll
      for (int w2 = 0; w2 < 8; ++w2) {
        const float* rr = red + (8 * h + w2) * 2 * kChunk * 8;
        gs += rr[r * 8 + ii];
        us += rr[(kChunk + r) * 8 + ii];
      }
      const float gv = gs * s_s2[buf][0], uv = us * s_s2[buf][1];
      const float v = gv / (1.0f + expf(-gv)) * uv * s_wt[buf][r];
      actb[static_cast<int64_t>(pos0 + r) * p.inter + tile * kBulkGuIdx + i] = __float2bfloat16_rn(v);
    }
    // red is rewritten only after the next item's first barrier, which every reader above has passed; the
    // next chunk's staging writes the other s_wt / s_s2 buffer, and the one after it waits on that barrier.
  }
}

// ---- down (+ routing weight, already in act, + combine) --------------------------------------------------

__global__ void __launch_bounds__(kBulkDnThreads, 2)
    moe_decode_down_bulk_kernel(const MoeExpertsParams p, int stages) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int m = p.m, I = p.inter;
  const uint32_t wpitch = static_cast<uint32_t>(bulk_w_pitch(I)),
                 spitch = static_cast<uint32_t>(bulk_s_pitch(I));
  const uint32_t stage_bytes = static_cast<uint32_t>(bulk_stage_bytes(16, I));
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  float* out_w = reinterpret_cast<float*>(smem + kLutBytes);  // [8 warps][m][16]
  float* scr = out_w + kWarps * m * kDownRows;                // [8 warps][8 positions][16]
  int32_t* ec = reinterpret_cast<int32_t*>(scr + kWarps * kChunk * kDownRows);
  int32_t* tok = ec + kMaxEc;  // [m * top_k]: grouped position -> token
  uint8_t* ring = smem + bulk_down_base(m);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + static_cast<size_t>(stages) * stage_bytes);
  uint64_t* empty = full + stages;
  __shared__ int s_nec;

  moe_dev::build_e2m1_lut<kBulkDnThreads>(lut, kLutScale);
  moe_dev::build_ec<kMaxEc>(p, kChunk, ec, &s_nec);
  for (int i = threadIdx.x; i < kWarps * m * kDownRows; i += kBulkDnThreads) out_w[i] = 0.f;
  for (int i = threadIdx.x; i < m * p.top_k; i += kBulkDnThreads) tok[i] = p.sorted_slots[i] / p.top_k;
  if (threadIdx.x == 32) {
    for (int s = 0; s < stages; ++s) {
      wg::mbar_init(&full[s], 1);
      wg::mbar_init(&empty[s], kWarps);
    }
    wg::mbar_init_fence();
  }
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row0 = blockIdx.x * kDownRows;
  const int n = s_nec;

  if (warp == kWarps) {  // producer
    const uint32_t w_bytes = static_cast<uint32_t>(I / 2), s_bytes = static_cast<uint32_t>(I / 16);
    const int r = lane & 15;
    for (int q = 0; q < n; ++q) {
      const int slot = q % stages;
      const uint32_t round = static_cast<uint32_t>(q / stages);
      if (round > 0) wait_or_trap(&empty[slot], (round - 1) & 1u);
      const MoeExpertWeights& ew = p.experts[ec[q] & 1023];
      uint8_t* st = ring + static_cast<size_t>(slot) * stage_bytes;
      if (lane == 0) wg::mbar_arrive_expect_tx(&full[slot], 16u * (w_bytes + s_bytes));
      __syncwarp();
      if (lane < 16)
        wg::bulk_copy_g2s(st + r * wpitch,
                          static_cast<const uint8_t*>(ew.down) + static_cast<int64_t>(row0 + r) * w_bytes,
                          w_bytes, &full[slot]);
      else
        wg::bulk_copy_g2s(
            st + 16 * wpitch + r * spitch,
            static_cast<const uint8_t*>(ew.down_scale) + static_cast<int64_t>(row0 + r) * s_bytes, s_bytes,
            &full[slot]);
    }
    return;
  }

  // Consumers: every warp takes part in every stage (waits in stage order: no barrier phase is ever waited
  // for two rounds ahead), warp w the 128-k steps w, w + 8, ... of the stage's inter; its partial sums go
  // into its own output tile, and the block sums the 8 tiles at the end.
  const int g = lane >> 2, t = lane & 3;
  const uint32_t lut_lane = wg::smem_u32(lut) + 4u * lane;
  const uint32_t ring0 = wg::smem_u32(ring);
  const uint32_t w_off0 = static_cast<uint32_t>(g) * wpitch + 16u * t, w_off1 = w_off0 + 8 * wpitch;
  const uint32_t s_off0 = 16 * wpitch + static_cast<uint32_t>(g) * spitch + 2u * t,
                 s_off1 = s_off0 + 8 * spitch;
  const __nv_bfloat16* actb = reinterpret_cast<const __nv_bfloat16*>(p.act);
  float* scr_w = scr + warp * kChunk * kDownRows;
  float* out_ww = out_w + warp * m * kDownRows;
  const int steps = I / 128;
  // The stage's chunk (rows, first position, down_scale2) is read one stage ahead, so its global loads wait
  // behind the current stage's math.
  auto meta = [&](int q, int& rows, int& pos0, float& s2) {
    if (q >= n) return;
    const int code = ec[q];
    const int e = code & 1023, chunk = code >> 10;
    rows = min(kChunk, p.expert_counts[e] - chunk * kChunk);
    pos0 = p.expert_offsets[e] + chunk * kChunk;
    s2 = p.experts[e].down_scale2;
  };
  int nx_rows = 0, nx_pos0 = 0;
  float nx_s2 = 0.f;
  meta(0, nx_rows, nx_pos0, nx_s2);
  for (int q = 0; q < n; ++q) {
    const int slot = q % stages;
    const int rows = nx_rows, pos0 = nx_pos0;
    const float s2 = nx_s2;
    meta(q + 1, nx_rows, nx_pos0, nx_s2);
    const __nv_bfloat16* arow = actb + static_cast<int64_t>(pos0 + g) * I + 32 * t;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    wait_or_trap(&full[slot], static_cast<uint32_t>(q / stages) & 1u);
    const uint32_t st = ring0 + static_cast<uint32_t>(slot) * stage_bytes;
    for (int s = warp; s < steps; s += kWarps) {
      uint4 b[4];
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2)
        b[j2] = g < rows ? __ldg(reinterpret_cast<const uint4*>(arow + 128 * s + 8 * j2))
                         : make_uint4(0u, 0u, 0u, 0u);
      const uint4 w0 = lds128(st + w_off0 + 64 * s), w1 = lds128(st + w_off1 + 64 * s);
      const uint32_t sc0 = lds16(st + s_off0 + 8 * s), sc1 = lds16(st + s_off1 + 8 * s);
      tile_step(acc, w0, w1, sc0, sc1, b, lut_lane);
    }
    __syncwarp();
    if (lane == 0) wg::mbar_arrive(&empty[slot]);
    if (warp >= steps) continue;  // no step of this stage: nothing to add
    scr_w[(2 * t) * 16 + g] = acc[0];
    scr_w[(2 * t + 1) * 16 + g] = acc[1];
    scr_w[(2 * t) * 16 + g + 8] = acc[2];
    scr_w[(2 * t + 1) * 16 + g + 8] = acc[3];
    __syncwarp();
    if (lane < kDownRows) {
      // Positions in order: a token met twice (a repeated expert in its top-k) adds in a fixed order.
      for (int qq = 0; qq < rows; ++qq)
        out_ww[tok[pos0 + qq] * kDownRows + lane] += scr_w[qq * 16 + lane] * s2;
    }
    __syncwarp();
  }
  consumers_sync<kWarps * 32>();
  for (int i = tid; i < m * kDownRows; i += kWarps * 32) {
    float sum = 0.f;
#pragma unroll
    for (int w2 = 0; w2 < kWarps; ++w2) sum += out_w[w2 * m * kDownRows + i];
    float* o = p.out + static_cast<int64_t>(i / kDownRows) * p.ldo + row0 + (i % kDownRows);
    *o += sum;
  }
}

}  // namespace

void moe_experts_decode_bulk(const MoeExpertsParams& p, const moe_decode_config::Config& c,
                             cudaStream_t stream) {
  MS_CHECK(c.bulk, "moe_experts_decode: the bulk-copy ring does not fit: {}", c.bulk_why);
  const DeviceCaps caps = current_device_caps();
  check_smem(caps, "moe_decode_gate_up_bulk", c.smem_gate_up_bulk);
  check_smem(caps, "moe_decode_down_bulk", c.smem_down_bulk);
  CUDA_CHECK(cudaFuncSetAttribute(moe_decode_gate_up_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_gate_up_bulk)));
  CUDA_CHECK(cudaFuncSetAttribute(moe_decode_down_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_down_bulk)));
  moe_decode_gate_up_bulk_kernel<<<c.grid_gate_up_bulk, kBulkGuThreads, c.smem_gate_up_bulk, stream>>>(
      p, c.bulk_x_rows, c.bulk_stages_gate_up);
  CUDA_CHECK(cudaGetLastError());
  moe_decode_down_bulk_kernel<<<p.hidden / kDownRows, kBulkDnThreads, c.smem_down_bulk, stream>>>(
      p, c.bulk_stages_down);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ms::cuda
