// Streaming absorb / out-v for decode batches: the weight bytes are the whole cost at batch 1 (W_UK 12.6 MB,
// W_UV 16.8 MB in BF16 on GLM-5), so every block issues all of its weight loads at once as 16-byte loads that
// skip L1, and the grid has several blocks per SM at batch 1.
//
// absorb_q: block (64-column slice of W_UK_h, head h, tile of up to kMlaStreamTokens tokens). The slice
//   (nope x 64 in the stored format) is copied to shared memory with cp.async (every thread has several
//   16-byte copies in flight), then read for every group of TG tokens: thread (column quad ct, row group dg)
//   sums its 4 columns over rows dg, dg + 16, ... for TG tokens, and the 16 row groups' partials are added in
//   shared memory in a fixed order (no atomics: results do not depend on the run).
// out_v: block (32 rows of W_UV_h, head h, token tile); a warp owns 4 rows, lanes across the 512 latent
//   columns, each lane 16 weights of each row held in registers as f32 (loaded once, 16-byte loads), so the
//   weights are read once for every token of the tile. Latents are staged 16 tokens at a time in shared
//   memory (float4 slots permuted so that a warp's lanes read consecutive slots), and the TG tokens x 4 rows
//   partial sums of a warp are reduced by a transposing butterfly: 31 shuffles for 32 sums, lane L ends with
//   sum L.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <fmt/format.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/mla_attention/mla_absorb_stream.h"
#include "kernels/cuda/paged_kv/current_caps.h"

namespace ms::cuda::detail {
namespace {

constexpr int kThreads = 256;
// absorb_q
constexpr int kQCols = 64;        // W_UK columns per block
constexpr int kQColThreads = 16;  // threads across a slice, 4 columns each
constexpr int kQRowGroups = kThreads / kQColThreads;
// out_v
constexpr int kVRows = 4;                              // W_UV rows per warp
constexpr int kVBlockRows = kVRows * (kThreads / 32);  // W_UV rows per block
constexpr int kVLaneWeights = 16;                      // f32 weights per lane per row: kv_lora_rank <= 512
constexpr int kVStage = 16;                            // latent tokens staged in shared memory at a time

constexpr int bytes_of(DenseWeightFormat f) {
  return f == DenseWeightFormat::F32 ? 4 : f == DenseWeightFormat::BF16 ? 2 : 1;
}

int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global));
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// Two e4m3 bytes (low half of `v`) as f32, exactly (every e4m3 value is a half).
__device__ __forceinline__ float2 fp8x2_to_f32(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

// 4 consecutive stored weights (4 * bytes_of(F) bytes at `p`, aligned to that) as f32; FP8 times its scale.
template <DenseWeightFormat F>
__device__ __forceinline__ void load4(const unsigned char* p, float s, float (&w)[4]) {
  if constexpr (F == DenseWeightFormat::F32) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (F == DenseWeightFormat::BF16) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = bf16_lo(v.x), w[1] = bf16_hi(v.x), w[2] = bf16_lo(v.y), w[3] = bf16_hi(v.y);
  } else {
    const uint32_t v = *reinterpret_cast<const uint32_t*>(p);
    const float2 a = fp8x2_to_f32(v), b = fp8x2_to_f32(v >> 16);
    w[0] = a.x * s, w[1] = a.y * s, w[2] = b.x * s, w[3] = b.y * s;
  }
}

// Sum over the warp of N values per lane (N a power of two <= 32): each step halves the values a lane keeps,
// exchanging the other half with the lane OFF away, so 32 sums cost 31 shuffles. On return v[0] of lane L is
// the warp's sum of value L / (32 / N).
template <int N, int OFF>
__device__ __forceinline__ void transpose_reduce(float* v, int lane) {
  if constexpr (N > 1) {
    const bool upper = (lane & OFF) != 0;
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const float send = upper ? v[k] : v[k + N / 2];
      const float keep = upper ? v[k + N / 2] : v[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
    }
    transpose_reduce<N / 2, OFF / 2>(v, lane);
  } else {
#pragma unroll
    for (int o = OFF; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  }
}

// ---- absorb_q ------------------------------------------------------------------------------------------

struct QSmem {
  size_t w, s, q, red, total;  // byte offsets of the weight slice, fp8 scales, q group, partials; size
};

QSmem q_smem(DenseWeightFormat f, int nope, int tg) {
  QSmem s;
  s.w = 0;
  s.s = round_up(static_cast<int64_t>(nope) * kQCols * bytes_of(f), 16);
  s.q = s.s + round_up(static_cast<int64_t>(nope) * 4, 16);
  s.red = s.q + round_up(static_cast<int64_t>(nope) * tg * 4, 16);
  s.total = s.red + static_cast<size_t>(kQRowGroups) * tg * kQCols * 4;
  return s;
}

template <DenseWeightFormat F, int TG>
__global__ void __launch_bounds__(kThreads) absorb_q_stream_kernel(MlaAbsorbQParams p, QSmem L) {
  dev::grid_dep_enter();
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int es = bytes_of(F);
  constexpr int kChunksPerRow = kQCols * es / 16;
  unsigned char* w_s = smem + L.w;                      // [nope, kQCols] stored format
  float* s_s = reinterpret_cast<float*>(smem + L.s);    // [nope] fp8 block scale of each row of the slice
  float* q_s = reinterpret_cast<float*>(smem + L.q);    // [nope, TG] the group's q_nope, token fastest
  float* red = reinterpret_cast<float*>(smem + L.red);  // [kQRowGroups, TG, kQCols] partial sums
  const int tid = threadIdx.x, nope = p.nope, r = p.kv_lora_rank, qd = p.nope + p.rope, width = r + p.rope;
  const int h = blockIdx.y, c0 = blockIdx.x * kQCols;
  const int i_begin = blockIdx.z * kMlaStreamTokens, i_end = min(p.m, i_begin + kMlaStreamTokens);
  const int64_t row0 = static_cast<int64_t>(h) * (p.nope + p.v);
  const auto* wg = static_cast<const unsigned char*>(p.kv_b.data);
  for (int idx = tid; idx < nope * kChunksPerRow; idx += kThreads) {
    const int d = idx / kChunksPerRow, k = idx % kChunksPerRow, c = c0 + k * (16 / es);
    unsigned char* dst = w_s + (static_cast<size_t>(d) * kQCols * es + k * 16);
    if (c < r)  // r is a multiple of 16 / es: a chunk is all in or all out
      cp_async16(dst, wg + ((row0 + d) * r + c) * es);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
  if constexpr (F == DenseWeightFormat::FP8Block) {
    const int64_t scale_cols = (r + p.kv_b.block - 1) / p.kv_b.block;
    for (int d = tid; d < nope; d += kThreads)
      s_s[d] = __ldg(p.kv_b.scale + ((row0 + d) / p.kv_b.block) * scale_cols + c0 / p.kv_b.block);
  }
  if (blockIdx.x == 0)
    for (int idx = tid; idx < (i_end - i_begin) * p.rope; idx += kThreads) {
      const int64_t tok = static_cast<int64_t>(i_begin + idx / p.rope) * p.heads + h;
      p.q_cat[tok * width + r + idx % p.rope] = p.q[tok * qd + p.nope + idx % p.rope];
    }
  cp_async_wait_all();  // this thread's copies; the first __syncthreads below publishes everyone's

  const int ct = tid % kQColThreads, dg = tid / kQColThreads;
  for (int i0 = i_begin; i0 < i_end; i0 += TG) {
    const int tn = min(TG, i_end - i0);
    __syncthreads();  // the previous group's readers of q_s and red are done
    for (int idx = tid; idx < nope * TG; idx += kThreads) {
      const int t = idx / nope, d = idx % nope;
      q_s[d * TG + t] = t < tn ? p.q[(static_cast<int64_t>(i0 + t) * p.heads + h) * qd + d] : 0.0f;
    }
    __syncthreads();
    float acc[TG][4];
#pragma unroll
    for (int t = 0; t < TG; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[t][j] = 0.0f;
#pragma unroll 4
    for (int d = dg; d < nope; d += kQRowGroups) {
      float w[4];
      load4<F>(w_s + (static_cast<size_t>(d) * kQCols + ct * 4) * es,
               F == DenseWeightFormat::FP8Block ? s_s[d] : 1.0f, w);
      float a[TG];
      if constexpr (TG % 4 == 0) {
#pragma unroll
        for (int t = 0; t < TG; t += 4) {
          const float4 v = *reinterpret_cast<const float4*>(q_s + d * TG + t);
          a[t] = v.x, a[t + 1] = v.y, a[t + 2] = v.z, a[t + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int t = 0; t < TG; ++t) a[t] = q_s[d * TG + t];
      }
#pragma unroll
      for (int t = 0; t < TG; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[t][j] = fmaf(a[t], w[j], acc[t][j]);
    }
#pragma unroll
    for (int t = 0; t < TG; ++t)
      *reinterpret_cast<float4*>(red + (dg * TG + t) * kQCols + ct * 4) =
          make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    __syncthreads();
    for (int o = tid; o < TG * kQCols; o += kThreads) {
      const int t = o / kQCols, c = o % kQCols;
      if (t < tn && c0 + c < r) {
        float s = 0.0f;
#pragma unroll
        for (int g = 0; g < kQRowGroups; ++g) s += red[(g * TG + t) * kQCols + c];
        p.q_cat[(static_cast<int64_t>(i0 + t) * p.heads + h) * width + c0 + c] = s;
      }
    }
  }
}

// ---- out_v ---------------------------------------------------------------------------------------------

template <DenseWeightFormat F, int TG>
__global__ void __launch_bounds__(kThreads, 2) out_v_stream_kernel(MlaOutVParams p) {
  dev::grid_dep_enter();
  extern __shared__ __align__(16) float4 lat_s[];  // [kVStage, kv_lora_rank / 4] slots permuted (see below)
  constexpr int es = bytes_of(F), kE = 16 / es;    // weights per 16-byte chunk
  constexpr int kCh = kVLaneWeights / kE;          // chunks per lane per row
  constexpr int kF4 = kE / 4;                      // float4 latent slots per chunk
  constexpr int kN = TG * kVRows;                  // partial sums per lane per token group
  static_assert(kN <= 32 && (kN & (kN - 1)) == 0, "token group x rows must be a power of two <= 32");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y, e0 = blockIdx.x * kVBlockRows + warp * kVRows;
  const int r = p.kv_lora_rank, nch = r / kE, r4 = r / 4;
  const int i_begin = blockIdx.z * kMlaStreamTokens, i_end = min(p.m, i_begin + kMlaStreamTokens);
  const int64_t out_stride = static_cast<int64_t>(p.heads) * p.v;

  // Every weight load of the lane first, so they are all in flight together.
  uint4 raw[kVRows][kCh];
  const auto* wg = static_cast<const unsigned char*>(p.kv_b.data);
#pragma unroll
  for (int rr = 0; rr < kVRows; ++rr)
#pragma unroll
    for (int j = 0; j < kCh; ++j) {
      const int ch = j * 32 + lane;
      const int64_t row = static_cast<int64_t>(h) * (p.nope + p.v) + p.nope + e0 + rr;
      raw[rr][j] = e0 + rr < p.v && ch < nch
                       ? dev::ld_stream16(wg + (row * r + static_cast<int64_t>(ch) * kE) * es)
                       : make_uint4(0, 0, 0, 0);
    }
  float scale[kVRows][kCh];
#pragma unroll
  for (int rr = 0; rr < kVRows; ++rr)
#pragma unroll
    for (int j = 0; j < kCh; ++j) {
      scale[rr][j] = 1.0f;
      if constexpr (F == DenseWeightFormat::FP8Block) {
        const int ch = j * 32 + lane;
        const int64_t row = static_cast<int64_t>(h) * (p.nope + p.v) + p.nope + e0 + rr;
        const int64_t scale_cols = (r + p.kv_b.block - 1) / p.kv_b.block;
        scale[rr][j] = e0 + rr < p.v && ch < nch
                           ? __ldg(p.kv_b.scale + (row / p.kv_b.block) * scale_cols + ch * kE / p.kv_b.block)
                           : 0.0f;
      }
    }

  // Stage (up to) kVStage tokens from i0: slot q (float4 q of a token's latent) is chunk q / kF4, part
  // q % kF4; it is stored at part * nch + chunk, so the lanes of a warp (consecutive chunks) read consecutive
  // float4 slots. Whole token groups are staged; the padding is zero.
  auto stage = [&](int i0) {
    const int sn = min(kVStage, i_end - i0);
    const int staged = min(kVStage, (sn + TG - 1) / TG * TG);
    __syncthreads();  // the previous stage's readers are done
    for (int idx = tid; idx < staged * r4; idx += kThreads) {
      const int t = idx / r4, q = idx % r4;
      lat_s[t * r4 + (q % kF4) * nch + q / kF4] =
          t < sn ? *reinterpret_cast<const float4*>(p.lat + (static_cast<int64_t>(i0 + t) * p.heads + h) * r +
                                                    q * 4)
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __syncthreads();
  };
  stage(i_begin);  // its loads overlap the weight loads still in flight

  // The weights as f32, once: raw is dead from here on.
  float w[kVRows][kVLaneWeights];
#pragma unroll
  for (int rr = 0; rr < kVRows; ++rr)
#pragma unroll
    for (int j = 0; j < kCh; ++j) {
      const uint32_t u[4] = {raw[rr][j].x, raw[rr][j].y, raw[rr][j].z, raw[rr][j].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float* o = &w[rr][j * kE];
        if constexpr (F == DenseWeightFormat::F32) {
          o[k] = __uint_as_float(u[k]);
        } else if constexpr (F == DenseWeightFormat::BF16) {
          o[2 * k] = bf16_lo(u[k]), o[2 * k + 1] = bf16_hi(u[k]);
        } else {
          const float2 a = fp8x2_to_f32(u[k]), b = fp8x2_to_f32(u[k] >> 16);
          const float s = scale[rr][j];
          o[4 * k] = a.x * s, o[4 * k + 1] = a.y * s, o[4 * k + 2] = b.x * s, o[4 * k + 3] = b.y * s;
        }
      }
    }

  for (int i0 = i_begin;;) {
    const int sn = min(kVStage, i_end - i0);
    for (int g = 0; g < sn; g += TG) {
      float acc[kN];
#pragma unroll
      for (int n = 0; n < kN; ++n) acc[n] = 0.0f;
#pragma unroll
      for (int t = 0; t < TG; ++t)
#pragma unroll
        for (int j = 0; j < kCh; ++j) {
          const int ch = j * 32 + lane;
#pragma unroll
          for (int f = 0; f < kF4; ++f) {
            const float4 a =
                ch < nch ? lat_s[(g + t) * r4 + f * nch + ch] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int rr = 0; rr < kVRows; ++rr) {
              const float* wr = &w[rr][j * kE + f * 4];
              float s = acc[t * kVRows + rr];
              s = fmaf(a.x, wr[0], s);
              s = fmaf(a.y, wr[1], s);
              s = fmaf(a.z, wr[2], s);
              s = fmaf(a.w, wr[3], s);
              acc[t * kVRows + rr] = s;
            }
          }
        }
      transpose_reduce<kN, 16>(acc, lane);
      constexpr int kLanesPerSum = 32 / kN;
      if (lane % kLanesPerSum == 0) {
        const int n = lane / kLanesPerSum, t = n / kVRows, rr = n % kVRows;
        if (g + t < sn && e0 + rr < p.v)
          p.out[static_cast<int64_t>(i0 + g + t) * out_stride + static_cast<int64_t>(h) * p.v + e0 + rr] =
              acc[0];
      }
    }
    i0 += kVStage;
    if (i0 >= i_end) break;
    stage(i0);
  }
}

int token_group(int m) {
  return m >= 8 ? 8 : m >= 4 ? (m == 4 ? 4 : 8) : m >= 2 ? (m == 2 ? 2 : 4) : 1;
}

bool aligned16(const void* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

template <DenseWeightFormat F>
const void* absorb_q_kernel_for(int tg) {
  switch (tg) {
    case 1:
      return reinterpret_cast<const void*>(absorb_q_stream_kernel<F, 1>);
    case 2:
      return reinterpret_cast<const void*>(absorb_q_stream_kernel<F, 2>);
    case 4:
      return reinterpret_cast<const void*>(absorb_q_stream_kernel<F, 4>);
    default:
      return reinterpret_cast<const void*>(absorb_q_stream_kernel<F, 8>);
  }
}

template <DenseWeightFormat F>
const void* out_v_kernel_for(int tg) {
  switch (tg) {
    case 1:
      return reinterpret_cast<const void*>(out_v_stream_kernel<F, 1>);
    case 2:
      return reinterpret_cast<const void*>(out_v_stream_kernel<F, 2>);
    case 4:
      return reinterpret_cast<const void*>(out_v_stream_kernel<F, 4>);
    default:
      return reinterpret_cast<const void*>(out_v_stream_kernel<F, 8>);
  }
}

const void* pick(DenseWeightFormat f, int tg, bool absorb) {
  switch (f) {
    case DenseWeightFormat::F32:
      return absorb ? absorb_q_kernel_for<DenseWeightFormat::F32>(tg)
                    : out_v_kernel_for<DenseWeightFormat::F32>(tg);
    case DenseWeightFormat::BF16:
      return absorb ? absorb_q_kernel_for<DenseWeightFormat::BF16>(tg)
                    : out_v_kernel_for<DenseWeightFormat::BF16>(tg);
    default:
      return absorb ? absorb_q_kernel_for<DenseWeightFormat::FP8Block>(tg)
                    : out_v_kernel_for<DenseWeightFormat::FP8Block>(tg);
  }
}

size_t out_v_smem(int m, int r) {
  const int tg = token_group(m);
  const int staged = std::min(kVStage, (std::min(m, kVStage) + tg - 1) / tg * tg);
  return static_cast<size_t>(staged) * r * sizeof(float);
}

std::string grid_refusal(int m, int heads, const char* op) {
  const int64_t tiles = (static_cast<int64_t>(m) + kMlaStreamTokens - 1) / kMlaStreamTokens;
  if (tiles > 65535)
    return fmt::format("{}: m {} needs {} token tiles, more than a grid's 65535", op, m, tiles);
  if (heads > 65535) return fmt::format("{}: heads {} exceed a grid's 65535", op, heads);
  return {};
}

}  // namespace

std::string absorb_q_stream_refusal(const MlaAbsorbQParams& p, const DeviceCaps& caps) {
  const DenseWeightFormat f = p.kv_b.format;
  const int per16 = 16 / bytes_of(f);
  if (!aligned16(p.kv_b.data)) return "mla_absorb_q streaming: kv_b.data is not 16-byte aligned";
  if (p.kv_lora_rank % per16 != 0)
    return fmt::format(
        "mla_absorb_q streaming: kv_lora_rank {} is not a multiple of {} (16-byte weight rows)",
        p.kv_lora_rank, per16);
  if (f == DenseWeightFormat::FP8Block && p.kv_b.block % kQCols != 0)
    return fmt::format("mla_absorb_q streaming: kv_b.block {} is not a multiple of the {}-column slice",
                       p.kv_b.block, kQCols);
  const size_t smem = q_smem(f, p.nope, token_group(std::max(p.m, 1))).total;
  if (smem > caps.smem_per_block_optin)
    return fmt::format("mla_absorb_q streaming: nope {} needs {} bytes of shared memory, {} allows {}",
                       p.nope, smem, caps.name, caps.smem_per_block_optin);
  return grid_refusal(p.m, p.heads, "mla_absorb_q streaming");
}

std::string out_v_stream_refusal(const MlaOutVParams& p, const DeviceCaps& caps) {
  const DenseWeightFormat f = p.kv_b.format;
  const int per16 = 16 / bytes_of(f);
  if (!aligned16(p.kv_b.data)) return "mla_out_v streaming: kv_b.data is not 16-byte aligned";
  if (!aligned16(p.lat)) return "mla_out_v streaming: lat is not 16-byte aligned";
  if (p.kv_lora_rank % per16 != 0)
    return fmt::format("mla_out_v streaming: kv_lora_rank {} is not a multiple of {} (16-byte weight rows)",
                       p.kv_lora_rank, per16);
  if (p.kv_lora_rank > 32 * kVLaneWeights)
    return fmt::format("mla_out_v streaming: kv_lora_rank {} exceeds {} (weights a warp holds per row)",
                       p.kv_lora_rank, 32 * kVLaneWeights);
  if (f == DenseWeightFormat::FP8Block && p.kv_b.block % per16 != 0)
    return fmt::format("mla_out_v streaming: kv_b.block {} is not a multiple of {}", p.kv_b.block, per16);
  const size_t smem = out_v_smem(std::max(p.m, 1), p.kv_lora_rank);
  if (smem > caps.smem_per_block_optin)
    return fmt::format("mla_out_v streaming: kv_lora_rank {} needs {} bytes of shared memory, {} allows {}",
                       p.kv_lora_rank, smem, caps.name, caps.smem_per_block_optin);
  return grid_refusal(p.m, p.heads, "mla_out_v streaming");
}

void absorb_q_stream(const MlaAbsorbQParams& p, const DeviceCaps& caps, cudaStream_t stream) {
  const int tg = token_group(p.m);
  const QSmem L = q_smem(p.kv_b.format, p.nope, tg);
  const void* kernel = pick(p.kv_b.format, tg, true);
  prepare_smem(caps, "mla_absorb_q streaming", kernel, L.total);
  const dim3 grid((p.kv_lora_rank + kQCols - 1) / kQCols, p.heads,
                  (p.m + kMlaStreamTokens - 1) / kMlaStreamTokens);
  MlaAbsorbQParams a = p;
  void* args[] = {&a, const_cast<QSmem*>(&L)};
  launch_kernel_args("mla_absorb_q streaming", kernel, grid, dim3(kThreads), args, L.total, stream);
}

void out_v_stream(const MlaOutVParams& p, const DeviceCaps& caps, cudaStream_t stream) {
  const int tg = token_group(p.m);
  const size_t smem = out_v_smem(p.m, p.kv_lora_rank);
  const void* kernel = pick(p.kv_b.format, tg, false);
  prepare_smem(caps, "mla_out_v streaming", kernel, smem);
  const dim3 grid((p.v + kVBlockRows - 1) / kVBlockRows, p.heads,
                  (p.m + kMlaStreamTokens - 1) / kMlaStreamTokens);
  MlaOutVParams a = p;
  void* args[] = {&a};
  launch_kernel_args("mla_out_v streaming", kernel, grid, dim3(kThreads), args, smem, stream);
}

}  // namespace ms::cuda::detail
