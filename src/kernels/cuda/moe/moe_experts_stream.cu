// Streamed NVFP4 experts for decode (see moe_experts_stream.h).
//
// Work: gate_up walks work items (expert chunk, 32 intermediate indices) with a persistent grid; an expert
// chunk is one touched expert and up to 32 of its positions (a hot expert has several). Each block builds the
// list of expert chunks from expert_counts itself (one warp, ballot and scan), so the grid is fixed and no
// host read is needed. down gives each block 16 output rows and walks every expert chunk.
//
// Pipeline: every thread issues 16-byte cp.async pieces of the next stages into a 3-stage ring; one stage is
// 64 weight rows x 512 k (gate_up: rows 16q..16q+7 are gate rows of indices i0+8q.., rows 16q+8.. the up rows
// of the same indices, so one mma tile holds gate and up of 8 indices) or 16 rows x up to 2048 k (down).
// The ring runs across work items without draining.
//
// Math: warp w takes the 64-k sub-chunks w, w+8, ... of a stage; 16 k (one NVFP4 scale block) per mma. Lane
// (g = lane / 4, t = lane % 4) feeds bytes 2t, 2t+1 of the block (elements 4t..4t+3) of rows g and g+8 as A,
// each byte decoded by a 256-entry table to a bf16 pair and multiplied by its e4m3 scale in bf16 (exact), and
// the matching activations x[4t..4t+3] of token g as B, split into bf16 hi and lo (two mma per block). The
// dot product does not care in which order k is visited, so this permutation of k is the same for A and B.
// Warps' partial sums meet in shared memory in warp order (deterministic).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/moe/moe_device_common.cuh"
#include "kernels/cuda/moe/moe_experts_stream.h"

namespace ms::cuda {
namespace {

using namespace moe_stream_config;

using moe_dev::bf16x2_bits;
using moe_dev::mma_bf16;

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  return bf16x2_bits(__hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b)));
}

// e4m3 scale byte -> (s, s) in bf16 (exact).
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t byte) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  const float f = __half2float(__half(h));
  return bf16x2_bits(__floats2bfloat162_rn(f, f));
}

// (a, b) as bf16 hi pair and the remainders as bf16 lo pair.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  hi = bf16x2_bits(h);
  lo = bf16x2_bits(__floats2bfloat162_rn(a - hf.x, b - hf.y));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A fragment of one 16-row tile for one scale block: rows r0 (g) and r0 + 8 of the stage, block `blk` of the
// row (16 elements = 8 bytes at blk * 8), lane's bytes 2t, 2t+1; scaled.
struct AFrag {
  uint32_t a0, a1, a2, a3;
};
__device__ __forceinline__ AFrag load_a(const uint8_t* data, size_t ld, const uint8_t* scales, size_t lds,
                                        int row_g, int blk, int t, const uint32_t* lut_lane) {
  const uint32_t v0 = *reinterpret_cast<const uint16_t*>(data + row_g * ld + blk * 8 + 2 * t);
  const uint32_t v1 = *reinterpret_cast<const uint16_t*>(data + (row_g + 8) * ld + blk * 8 + 2 * t);
  const uint32_t s0 = scale_bf16x2(scales[row_g * lds + blk]);
  const uint32_t s1 = scale_bf16x2(scales[(row_g + 8) * lds + blk]);
  AFrag f;
  f.a0 = bf16x2_mul(lut_lane[(v0 & 0xffu) * 32], s0);
  f.a2 = bf16x2_mul(lut_lane[(v0 >> 8) * 32], s0);
  f.a1 = bf16x2_mul(lut_lane[(v1 & 0xffu) * 32], s1);
  f.a3 = bf16x2_mul(lut_lane[(v1 >> 8) * 32], s1);
  return f;
}

// ---- gate_up --------------------------------------------------------------------------------------------

template <int NT>
__global__ void __launch_bounds__(kThreads, 2) moe_stream_gate_up_kernel(const MoeExpertsParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kChunk = 8 * NT;  // positions per pass
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  uint8_t* ring = smem + kLutBytes;
  constexpr size_t kStage = stage_bytes(kGuRows, kGuKc);
  constexpr size_t kLd = data_ld(kGuKc), kLds = scale_ld(kGuKc);
  float* red = reinterpret_cast<float*>(ring + kStages * kStage);  // [4 q][32 tok][16 rows]
  int32_t* ec = reinterpret_cast<int32_t*>(red + 4 * kTokChunk * 16);
  __shared__ int s_nec;

  moe_dev::build_e2m1_lut<kThreads>(lut, 1.f);  // shared memory from constants: before the wait
  dev::grid_dep_enter();
  moe_dev::build_ec<kMaxEc>(p, kChunk, ec, &s_nec);
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int row_tiles = p.inter / kGuIdx;
  const int items = s_nec * row_tiles;
  const int nk = p.hidden / kGuKc;
  const int my_items =
      items > static_cast<int>(blockIdx.x) ? (items - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1 : 0;
  const int total = my_items * nk;
  const int64_t row_bytes = p.hidden / 2, srow_bytes = p.hidden / 16;

  auto issue = [&](int s) {
    const int item = blockIdx.x + (s / nk) * gridDim.x, kc = s % nk;
    const int e = ec[item / row_tiles] & 1023, rt = item % row_tiles;
    const MoeExpertWeights& ew = p.experts[e];
    uint8_t* dst = ring + (s % kStages) * kStage;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 64 rows x 16 pieces
      const int pc = tid + kThreads * i, rr = pc >> 4, piece = pc & 15;
      const int idx = rt * kGuIdx + (rr >> 4) * 8 + (rr & 7);
      const uint8_t* base = static_cast<const uint8_t*>(((rr >> 3) & 1) ? ew.up : ew.gate);
      cp_async16(dst + rr * kLd + piece * 16, base + idx * row_bytes + kc * (kGuKc / 2) + piece * 16);
    }
    if (tid < kGuRows * 2) {  // 64 rows x 2 scale pieces
      const int rr = tid >> 1, piece = tid & 1;
      const int idx = rt * kGuIdx + (rr >> 4) * 8 + (rr & 7);
      const uint8_t* base = static_cast<const uint8_t*>(((rr >> 3) & 1) ? ew.up_scale : ew.gate_scale);
      cp_async16(dst + kGuRows * kLd + rr * kLds + piece * 16,
                 base + idx * srow_bytes + kc * (kGuKc / 16) + piece * 16);
    }
  };

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < total) issue(s);
    cp_async_commit();
  }
  const uint32_t* lut_lane = lut + lane;
  float acc[4][NT][4];
  const float* xrow[NT];
  int e = 0, chunk = 0, count = 0, off = 0, rows = 0, nta = 0, rt = 0;
  for (int s = 0; s < total; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (s + kStages - 1 < total) issue(s + kStages - 1);
    cp_async_commit();
    const int kc = s % nk;
    if (kc == 0) {
      const int item = blockIdx.x + (s / nk) * gridDim.x;
      const int code = ec[item / row_tiles];
      e = code & 1023;
      chunk = code >> 10;
      rt = item % row_tiles;
      count = p.expert_counts[e];
      off = p.expert_offsets[e];
      rows = min(kChunk, count - chunk * kChunk);
      nta = (rows + 7) / 8;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int tok = nt * 8 + g;
        xrow[nt] = nullptr;
        if (tok < rows) {
          const int64_t token = p.sorted_slots[off + chunk * kChunk + tok] / p.top_k;
          xrow[nt] = p.x + token * p.ldx;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[q][nt][i] = 0.f;
      }
    }
    const uint8_t* data = ring + (s % kStages) * kStage;
    const uint8_t* scales = data + kGuRows * kLd;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int blk = warp * 4 + j;  // scale block within the stage
      uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (nt < nta && xrow[nt] != nullptr)
          v = __ldg(reinterpret_cast<const float4*>(xrow[nt] + kc * kGuKc + blk * 16 + 4 * t));
        split_pair(v.x, v.y, bh[nt][0], bl[nt][0]);
        split_pair(v.z, v.w, bh[nt][1], bl[nt][1]);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const AFrag a = load_a(data, kLd, scales, kLds, 16 * q + g, blk, t, lut_lane);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt >= nta) break;
          mma_bf16(acc[q][nt], a.a0, a.a1, a.a2, a.a3, bh[nt][0], bh[nt][1]);
          mma_bf16(acc[q][nt], a.a0, a.a1, a.a2, a.a3, bl[nt][0], bl[nt][1]);
        }
      }
    }
    if (kc != nk - 1) continue;
    // Item done: warps add their partial sums in warp order, then SiLU-and-mul per (position, index).
    for (int w = 0; w < kWarps; ++w) {
      if (warp == w) {
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (nt >= nta) break;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              float* r = red + (q * kTokChunk + nt * 8 + 2 * t + i) * 16;
              r[g] = (w == 0 ? 0.f : r[g]) + acc[q][nt][i];
              r[g + 8] = (w == 0 ? 0.f : r[g + 8]) + acc[q][nt][2 + i];
            }
          }
      }
      __syncthreads();
    }
    {
      const int tok = tid >> 3, quad = tid & 7;  // 32 positions x 8 groups of 4 indices
      if (tok < rows) {
        const int64_t pos = off + chunk * kChunk + tok;
        const float wt = p.topk_weights[p.sorted_slots[pos]];
        const MoeExpertWeights& ew = p.experts[e];
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int li = 4 * quad + i, q = li >> 3, r = li & 7;
          const float gv = red[(q * kTokChunk + tok) * 16 + r] * ew.gate_scale2;
          const float uv = red[(q * kTokChunk + tok) * 16 + r + 8] * ew.up_scale2;
          v[i] = gv / (1.0f + expf(-gv)) * uv * wt;
        }
        uint4 o;
        split_pair(v[0], v[1], o.x, o.z);
        split_pair(v[2], v[3], o.y, o.w);
        reinterpret_cast<uint4*>(p.act)[(pos * p.inter + rt * kGuIdx + 4 * quad) / 4] = o;
      }
    }
    __syncthreads();  // red is reused by the next item
  }
  cp_async_wait<0>();
}

// ---- down (+ routing weight, already in act, + combine) --------------------------------------------------

template <int NT>
__global__ void __launch_bounds__(kThreads, 2) moe_stream_down_kernel(const MoeExpertsParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kChunk = 8 * NT;  // positions per pass
  const int kc_len = down_kc(p.inter);
  const size_t ld = data_ld(kc_len), lds = scale_ld(kc_len), stage = stage_bytes(kDownRows, kc_len);
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  uint8_t* ring = smem + kLutBytes;
  float* red = reinterpret_cast<float*>(ring + kStages * stage);  // [32 pos][16 rows]
  int32_t* ec = reinterpret_cast<int32_t*>(red + kTokChunk * 16);
  float* out_tile = reinterpret_cast<float*>(ec + kMaxEc);  // [m][16]
  __shared__ int s_nec;
  __shared__ int s_tok[kTokChunk];

  moe_dev::build_e2m1_lut<kThreads>(lut, 1.f);  // shared memory from constants: before the wait
  dev::grid_dep_enter();
  moe_dev::build_ec<kMaxEc>(p, kChunk, ec, &s_nec);
  for (int i = threadIdx.x; i < p.m * kDownRows; i += kThreads) out_tile[i] = 0.f;
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kDownRows;
  const int nk = p.inter / kc_len;
  const int total = s_nec * nk;
  const int pieces_row = kc_len / 32, spieces_row = kc_len / 256;
  const int64_t row_bytes = p.inter / 2, srow_bytes = p.inter / 16;

  auto issue = [&](int s) {
    const int e = ec[s / nk] & 1023, kc = s % nk;
    const MoeExpertWeights& ew = p.experts[e];
    uint8_t* dst = ring + (s % kStages) * stage;
    const uint8_t* data = static_cast<const uint8_t*>(ew.down);
    const uint8_t* sc = static_cast<const uint8_t*>(ew.down_scale);
    for (int pc = tid; pc < kDownRows * pieces_row; pc += kThreads) {
      const int rr = pc / pieces_row, piece = pc % pieces_row;
      cp_async16(dst + rr * ld + piece * 16,
                 data + (row0 + rr) * row_bytes + static_cast<int64_t>(kc) * (kc_len / 2) + piece * 16);
    }
    for (int pc = tid; pc < kDownRows * spieces_row; pc += kThreads) {
      const int rr = pc / spieces_row, piece = pc % spieces_row;
      cp_async16(dst + kDownRows * ld + rr * lds + piece * 16,
                 sc + (row0 + rr) * srow_bytes + static_cast<int64_t>(kc) * (kc_len / 16) + piece * 16);
    }
  };

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < total) issue(s);
    cp_async_commit();
  }
  const uint32_t* lut_lane = lut + lane;
  const uint4* act = reinterpret_cast<const uint4*>(p.act);
  float acc[NT][4];
  int64_t arow[NT];  // uint4 index of the position's act row, -1 past the chunk
  int e = 0, chunk = 0, count = 0, off = 0, rows = 0, nta = 0;
  for (int s = 0; s < total; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (s + kStages - 1 < total) issue(s + kStages - 1);
    cp_async_commit();
    const int kc = s % nk;
    if (kc == 0) {
      const int code = ec[s / nk];
      e = code & 1023;
      chunk = code >> 10;
      count = p.expert_counts[e];
      off = p.expert_offsets[e];
      rows = min(kChunk, count - chunk * kChunk);
      nta = (rows + 7) / 8;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int tok = nt * 8 + g;
        arow[nt] = tok < rows ? (static_cast<int64_t>(off) + chunk * kChunk + tok) * (p.inter / 4) : -1;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
      }
    }
    const uint8_t* data = ring + (s % kStages) * stage;
    const uint8_t* scales = data + kDownRows * ld;
    for (int sc = warp; sc < kc_len / 64; sc += kWarps) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int blk = sc * 4 + j;
        const AFrag a = load_a(data, ld, scales, lds, g, blk, t, lut_lane);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt >= nta) break;
          uint4 b = make_uint4(0, 0, 0, 0);
          if (arow[nt] >= 0)
            b = __ldg(act + arow[nt] + (static_cast<int64_t>(kc) * kc_len + blk * 16) / 4 + t);
          mma_bf16(acc[nt], a.a0, a.a1, a.a2, a.a3, b.x, b.y);
          mma_bf16(acc[nt], a.a0, a.a1, a.a2, a.a3, b.z, b.w);
        }
      }
    }
    if (kc != nk - 1) continue;
    for (int w = 0; w < kWarps; ++w) {
      if (warp == w) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt >= nta) break;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float* r = red + (nt * 8 + 2 * t + i) * 16;
            r[g] = (w == 0 ? 0.f : r[g]) + acc[nt][i];
            r[g + 8] = (w == 0 ? 0.f : r[g + 8]) + acc[nt][2 + i];
          }
        }
      }
      if (w == 0 && tid < rows) s_tok[tid] = p.sorted_slots[off + chunk * kChunk + tid] / p.top_k;
      __syncthreads();
    }
    if (tid < kDownRows) {
      // One thread per output row walks the positions in order: a token met twice adds in a fixed order.
      const float s2 = p.experts[e].down_scale2;
      for (int q = 0; q < rows; ++q) out_tile[s_tok[q] * kDownRows + tid] += red[q * 16 + tid] * s2;
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int i = tid; i < p.m * kDownRows; i += kThreads) {
    const int64_t tok = i / kDownRows;
    float* o = p.out + tok * p.ldo + row0 + (i % kDownRows);
    *o += out_tile[i];
  }
}

bool aligned(const void* ptr, size_t a) {
  return reinterpret_cast<uintptr_t>(ptr) % a == 0;
}

template <int NT>
void launch(const MoeExpertsParams& p, const Config& c, cudaStream_t stream) {
  auto* gu = moe_stream_gate_up_kernel<NT>;
  auto* dn = moe_stream_down_kernel<NT>;
  CUDA_CHECK(cudaFuncSetAttribute(gu, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(c.smem_gate_up)));
  CUDA_CHECK(
      cudaFuncSetAttribute(dn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_down)));
  launch_kernel("moe_stream_gate_up", gu, c.grid_gate_up, kThreads, c.smem_gate_up, stream, p);
  launch_kernel("moe_stream_down", dn, c.grid_down, kThreads, c.smem_down, stream, p);
}

}  // namespace

moe_stream_config::Shape moe_stream_shape(const MoeExpertsParams& p) {
  return {p.format == MoeWeightFormat::NVFP4, p.hidden, p.inter, p.m, p.top_k, p.n_experts};
}

bool moe_experts_stream_applies(const MoeExpertsParams& p) {
  if (p.disable_stream || !p.experts_aligned16 || p.format != MoeWeightFormat::NVFP4) return false;
  if (!aligned(p.x, 16) || p.ldx % 4 != 0 || !aligned(p.act, 16)) return false;
  return choose(moe_stream_shape(p), limits_of(current_device_caps())).use;
}

void moe_experts_stream(const MoeExpertsParams& p, cudaStream_t stream) {
  moe_experts_check(p);
  if (p.m == 0) return;
  MS_CHECK(p.format == MoeWeightFormat::NVFP4, "moe_experts_stream: weights must be NVFP4");
  MS_CHECK(p.experts_aligned16,
           "moe_experts_stream: experts_aligned16 is not set (weight pointers unchecked)");
  MS_CHECK(aligned(p.x, 16) && p.ldx % 4 == 0, "moe_experts_stream: x must be 16-byte aligned, ldx % 4 == 0");
  MS_CHECK(aligned(p.act, 16), "moe_experts_stream: act workspace must be 16-byte aligned");
  const DeviceCaps caps = current_device_caps();
  const Config c = choose(moe_stream_shape(p), limits_of(caps));
  MS_CHECK(c.use, "moe_experts_stream: {}", c.why);
  check_smem(caps, "moe_stream_gate_up", c.smem_gate_up);
  check_smem(caps, "moe_stream_down", c.smem_down);
  switch (c.nt) {
    case 1:
      launch<1>(p, c, stream);
      break;
    case 2:
      launch<2>(p, c, stream);
      break;
    default:
      launch<4>(p, c, stream);
      break;
  }
}

}  // namespace ms::cuda
