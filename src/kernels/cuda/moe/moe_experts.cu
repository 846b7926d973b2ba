// Grouped expert GEMMs on CUDA cores (f32 math on weights dequantised into shared memory), correct first; the
// tensor-core and bulk-copy versions replace these per regime later.
//
// Block tile: kMoeTokenTile (32) token rows x 64 weight rows x kMoeKTile (64) k per step, 256 threads.
//   gate_up: weight rows 0..31 are gate rows n0..n0+31, rows 32..63 the up rows of the same columns, so a
//            thread holds gate and up of its two columns and applies SiLU-and-mul in registers.
//   down:    weight rows 0..63 are down rows n0..n0+63 (output columns).
// Shared memory, both transposed so the compute reads are conflict-free broadcasts:
//   xs [64 k][32 tokens] f32, ws [64 k][64 rows] f32.
// Loads: thread (r = tid % 64, seg = tid / 64) reads 16 consecutive k of weight row r (one 16..64-byte piece,
// whole 32-byte sectors); thread (t = tid % 32, seg = tid / 32) reads 8 k of token row t. The next step's
// bytes are loaded into registers before the current step is computed, so loads overlap compute.
// Compute: thread (tp = tid / 16, wp = tid % 16) owns tokens tp, tp + 16 and weight rows wp + 16 j (j < 4);
// threads whose tokens lie past the tile's row count skip the math (decode tiles hold a few tokens).
//
// General path (any hidden / inter): the same block tile, thread roles for compute and summation order, but
// every element is loaded on its own and bounds-checked (k past the row and weight rows past the output
// read as 0), straight into shared memory without register prefetch. Thread tid loads k = tid % 64 of
// weight rows tid / 64 + 4 j (j < 16) and of token rows tid / 64 + 4 j (j < 8), so a warp reads 32
// consecutive k of one row; the shared arrays are padded (xs [64][33], ws [64][65]) so those stores, 32
// consecutive k apart by a row stride, land in 32 different banks.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_decode.h"
#include "kernels/cuda/moe/moe_experts_decode_fp8.h"
#include "kernels/cuda/moe/moe_experts_stream.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kT = kMoeTokenTile;
constexpr int kK = kMoeKTile;
constexpr int kW = 64;    // weight rows per block tile
constexpr int kZMax = 8;  // most blocks sharing one expert's token tiles
constexpr int kSmemFloats = kK * kT + kK * kW;
constexpr int kXsLdGeneral = kT + 1;  // padded row strides of the general path's shared arrays
constexpr int kWsLdGeneral = kW + 1;
constexpr int kSmemFloatsGeneral = kK * kXsLdGeneral + kK * kWsLdGeneral;

static_assert(kT == 32 && kK == 64 && kW == 64 && kThreads == 256, "the thread mappings below assume these");

// E2M1 code (bit 3 = sign) -> f32, exact, without a table lookup.
__device__ __forceinline__ float e2m1_to_f32(uint32_t c) {
  const uint32_t m = c & 7u;
  uint32_t bits = m >= 2u ? ((((m >> 1) + 126u) << 23) | ((m & 1u) << 22)) : (m == 1u ? 0x3f000000u : 0u);
  bits |= (c & 8u) << 28;
  return __uint_as_float(bits);
}

__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float fp8_to_f32(uint32_t byte) {
  return fp8x2_to_float2(byte & 0xffu).x;
}

// 16 consecutive k of one weight row, as stored, plus the scale that applies to all of them.
struct RawW {
  uint4 v[4];
  float s;
};

// One matrix of one expert as this thread's loader row sees it.
struct WRow {
  const uint8_t* data;  // start of the row
  const void* scale;    // FP8Block: f32 scale row (r / block); NVFP4: e4m3 scales of the row
  float scale2;
};

template <MoeWeightFormat F>
__device__ __forceinline__ WRow weight_row(const void* data, const void* scale, float scale2, int64_t row,
                                           int cols, int block) {
  WRow w;
  w.scale2 = scale2;
  const uint8_t* d = static_cast<const uint8_t*>(data);
  if constexpr (F == MoeWeightFormat::F32) {
    w.data = d + row * cols * 4;
    w.scale = nullptr;
  } else if constexpr (F == MoeWeightFormat::BF16) {
    w.data = d + row * cols * 2;
    w.scale = nullptr;
  } else if constexpr (F == MoeWeightFormat::FP8Block) {
    w.data = d + row * cols;
    const int64_t scale_cols = (cols + block - 1) / block;
    w.scale = static_cast<const float*>(scale) + (row / block) * scale_cols;
  } else {
    w.data = d + row * (cols / 2);
    w.scale = static_cast<const uint8_t*>(scale) + row * (cols / 16);
  }
  return w;
}

template <MoeWeightFormat F>
__device__ __forceinline__ void load_w(const WRow& w, int k0, int block, RawW& r) {
  if constexpr (F == MoeWeightFormat::F32) {
    const uint4* src = reinterpret_cast<const uint4*>(w.data + static_cast<int64_t>(k0) * 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.v[i] = __ldg(src + i);
  } else if constexpr (F == MoeWeightFormat::BF16) {
    const uint4* src = reinterpret_cast<const uint4*>(w.data + static_cast<int64_t>(k0) * 2);
    r.v[0] = __ldg(src);
    r.v[1] = __ldg(src + 1);
  } else if constexpr (F == MoeWeightFormat::FP8Block) {
    r.v[0] = __ldg(reinterpret_cast<const uint4*>(w.data + k0));
    r.s = __ldg(static_cast<const float*>(w.scale) + k0 / block);
  } else {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(w.data + k0 / 2));
    r.v[0].x = q.x;
    r.v[0].y = q.y;
    // The product order of the CPU dequantiser: e4m3(scale) * scale2, then code * that.
    r.s = fp8_to_f32(__ldg(static_cast<const uint8_t*>(w.scale) + k0 / 16)) * w.scale2;
  }
}

using dev::word_of;

// Dequantises the 16 values to ws[(k_base + i) * kW + row].
template <MoeWeightFormat F>
__device__ __forceinline__ void store_w(const RawW& r, float* ws_col) {
  if constexpr (F == MoeWeightFormat::F32) {
#pragma unroll
    for (int i = 0; i < 16; ++i) ws_col[i * kW] = __uint_as_float(word_of(r.v[i / 4], i % 4));
  } else if constexpr (F == MoeWeightFormat::BF16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t two = word_of(r.v[i / 4], i % 4);
      ws_col[(2 * i) * kW] = __uint_as_float(two << 16);
      ws_col[(2 * i + 1) * kW] = __uint_as_float(two & 0xffff0000u);
    }
  } else if constexpr (F == MoeWeightFormat::FP8Block) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t word = word_of(r.v[0], i / 2);
      const float2 f = fp8x2_to_float2((i % 2) == 0 ? (word & 0xffffu) : (word >> 16));
      ws_col[(2 * i) * kW] = f.x * r.s;
      ws_col[(2 * i + 1) * kW] = f.y * r.s;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t byte = (word_of(r.v[0], i / 4) >> (8 * (i % 4))) & 0xffu;
      ws_col[(2 * i) * kW] = e2m1_to_f32(byte & 15u) * r.s;
      ws_col[(2 * i + 1) * kW] = e2m1_to_f32(byte >> 4) * r.s;
    }
  }
}

// xs [kK][kXsLd], ws [kK][kWsLd].
template <int kTokens, int kXsLd = kT, int kWsLd = kW>
__device__ __forceinline__ void mma_step(const float* xs, const float* ws, int tp, int wp,
                                         float (&acc)[2][4]) {
#pragma unroll 8
  for (int kk = 0; kk < kK; ++kk) {
    float b[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = ws[kk * kWsLd + wp + 16 * j];
#pragma unroll
    for (int ti = 0; ti < kTokens; ++ti) {
      const float a = xs[kk * kXsLd + tp + 16 * ti];
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[ti][j] = fmaf(a, b[j], acc[ti][j]);
    }
  }
}

// kGateUp: grid (inter / 32, n_experts, z); else (down): grid (hidden / 64, n_experts, z).
template <MoeWeightFormat F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_experts_gemm_kernel(const MoeExpertsParams p) {
  dev::grid_dep_enter();
  __shared__ float smem[kSmemFloats];
  float* xs = smem;            // [kK][kT]
  float* ws = smem + kK * kT;  // [kK][kW]

  const int e = blockIdx.y;
  const int count = p.expert_counts[e];
  const int tiles = (count + kT - 1) / kT;
  if (static_cast<int>(blockIdx.z) >= tiles) return;  // untouched experts end here, before any weight read

  const int tid = threadIdx.x;
  const MoeExpertWeights ew = p.experts[e];
  const int cols = kGateUp ? p.hidden : p.inter;  // k of this GEMM
  const int n_out = kGateUp ? p.inter : p.hidden;
  const int n0 = blockIdx.x * (kGateUp ? kW / 2 : kW);

  // Loader roles.
  const int lr = tid % kW, lseg = tid / kW;  // weight row, 16-wide k piece
  const int xt = tid % kT, xseg = tid / kT;  // token row, 8-wide k piece
  WRow wrow;
  if constexpr (kGateUp) {
    const bool is_up = lr >= kW / 2;
    const int64_t row = n0 + (is_up ? lr - kW / 2 : lr);
    wrow = is_up ? weight_row<F>(ew.up, ew.up_scale, ew.up_scale2, row, cols, p.fp8_block)
                 : weight_row<F>(ew.gate, ew.gate_scale, ew.gate_scale2, row, cols, p.fp8_block);
  } else {
    wrow = weight_row<F>(ew.down, ew.down_scale, ew.down_scale2, n0 + lr, cols, p.fp8_block);
  }
  // Compute roles.
  const int tp = tid / 16, wp = tid % 16;
  const int off = p.expert_offsets[e];
  const int nk = cols / kK;

  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int rows = min(kT, count - tile * kT);
    const float* xrow = nullptr;
    if (xt < rows) {
      const int64_t pos = off + static_cast<int64_t>(tile) * kT + xt;
      if constexpr (kGateUp) {
        const int64_t token = p.sorted_slots[pos] / p.top_k;
        xrow = p.x + token * p.ldx;
      } else {
        xrow = p.act + pos * p.inter;
      }
    }
    float acc[2][4] = {};
    RawW rw;
    float4 rx[2];
    auto load = [&](int kc) {
      load_w<F>(wrow, kc * kK + lseg * 16, p.fp8_block, rw);
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
      const float4* src =
          xrow != nullptr ? reinterpret_cast<const float4*>(xrow + kc * kK + xseg * 8) : nullptr;
      rx[0] = src != nullptr ? __ldg(src) : zero;
      rx[1] = src != nullptr ? __ldg(src + 1) : zero;
    };
    load(0);
    for (int kc = 0; kc < nk; ++kc) {
      __syncthreads();  // the previous step's compute is done with xs / ws
      store_w<F>(rw, ws + (lseg * 16) * kW + lr);
      float* xcol = xs + (xseg * 8) * kT + xt;
      const float xv[8] = {rx[0].x, rx[0].y, rx[0].z, rx[0].w, rx[1].x, rx[1].y, rx[1].z, rx[1].w};
#pragma unroll
      for (int i = 0; i < 8; ++i) xcol[i * kT] = xv[i];
      __syncthreads();
      if (kc + 1 < nk) load(kc + 1);
      if (tp + 16 < rows) {
        mma_step<2>(xs, ws, tp, wp, acc);
      } else if (tp < rows) {
        mma_step<1>(xs, ws, tp, wp, acc);
      }
    }

#pragma unroll
    for (int ti = 0; ti < 2; ++ti) {
      const int t = tp + 16 * ti;
      if (t >= rows) continue;
      const int64_t pos = off + static_cast<int64_t>(tile) * kT + t;
      if constexpr (kGateUp) {
        float* dst = p.act + pos * p.inter;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int col = n0 + wp + 16 * j;
          const float g = acc[ti][j], u = acc[ti][j + 2];
          if (col < n_out) dst[col] = g / (1.0f + expf(-g)) * u;  // the CPU silu_mul's expression
        }
      } else {
        float* dst = p.slot_out + static_cast<int64_t>(p.sorted_slots[pos]) * p.hidden;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = n0 + wp + 16 * j;
          if (col < n_out) dst[col] = acc[ti][j];
        }
      }
    }
  }
}

// Element k of row `row` of one stored matrix [rows, cols], dequantised as the CPU does (same products, same
// order). Reads only bytes of that element (and its scale).
template <MoeWeightFormat F>
__device__ __forceinline__ float weight_at(const void* data, const void* scale, float scale2, int64_t row,
                                           int k, int cols, int block) {
  if constexpr (F == MoeWeightFormat::F32) {
    return __ldg(static_cast<const float*>(data) + row * cols + k);
  } else if constexpr (F == MoeWeightFormat::BF16) {
    const uint32_t b = __ldg(static_cast<const unsigned short*>(data) + row * cols + k);
    return __uint_as_float(b << 16);
  } else if constexpr (F == MoeWeightFormat::FP8Block) {
    const int64_t scale_cols = (cols + block - 1) / block;
    const float s = __ldg(static_cast<const float*>(scale) + (row / block) * scale_cols + k / block);
    return fp8_to_f32(__ldg(static_cast<const uint8_t*>(data) + row * cols + k)) * s;
  } else {
    const uint32_t byte = __ldg(static_cast<const uint8_t*>(data) + row * (cols / 2) + k / 2);
    const float s =
        fp8_to_f32(__ldg(static_cast<const uint8_t*>(scale) + row * (cols / 16) + k / 16)) * scale2;
    return e2m1_to_f32((k & 1) != 0 ? byte >> 4 : byte & 15u) * s;
  }
}

// The general path. kGateUp: grid (ceil(inter / 32), n_experts, z); else (down): grid (ceil(hidden / 64),
// n_experts, z).
template <MoeWeightFormat F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_experts_gemm_general_kernel(const MoeExpertsParams p) {
  dev::grid_dep_enter();
  __shared__ float smem[kSmemFloatsGeneral];
  float* xs = smem;                      // [kK][kXsLdGeneral]
  float* ws = smem + kK * kXsLdGeneral;  // [kK][kWsLdGeneral]

  const int e = blockIdx.y;
  const int count = p.expert_counts[e];
  const int tiles = (count + kT - 1) / kT;
  if (static_cast<int>(blockIdx.z) >= tiles) return;  // untouched experts end here, before any weight read

  const int tid = threadIdx.x;
  const MoeExpertWeights ew = p.experts[e];
  const int cols = kGateUp ? p.hidden : p.inter;  // k of this GEMM
  const int n_out = kGateUp ? p.inter : p.hidden;
  const int n0 = blockIdx.x * (kGateUp ? kW / 2 : kW);

  // Loader roles: k offset lk in the step, rows lr0 + 4 j.
  constexpr int kRowStep = kThreads / kK;  // 4
  const int lk = tid % kK, lr0 = tid / kK;
  // Compute roles.
  const int tp = tid / 16, wp = tid % 16;
  const int off = p.expert_offsets[e];
  const int nk = (cols + kK - 1) / kK;

  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int rows = min(kT, count - tile * kT);
    const float* xrow[kT / kRowStep];
#pragma unroll
    for (int j = 0; j < kT / kRowStep; ++j) {
      const int t = lr0 + kRowStep * j;
      xrow[j] = nullptr;
      if (t < rows) {
        const int64_t pos = off + static_cast<int64_t>(tile) * kT + t;
        if constexpr (kGateUp) {
          xrow[j] = p.x + static_cast<int64_t>(p.sorted_slots[pos] / p.top_k) * p.ldx;
        } else {
          xrow[j] = p.act + pos * p.inter;
        }
      }
    }
    float acc[2][4] = {};
    for (int kc = 0; kc < nk; ++kc) {
      const int k = kc * kK + lk;
      const bool k_in = k < cols;
      __syncthreads();  // the previous step's compute is done with xs / ws
#pragma unroll
      for (int j = 0; j < kT / kRowStep; ++j) {
        const int t = lr0 + kRowStep * j;
        xs[lk * kXsLdGeneral + t] = (k_in && xrow[j] != nullptr) ? __ldg(xrow[j] + k) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kW / kRowStep; ++j) {
        const int r = lr0 + kRowStep * j;
        float v = 0.0f;
        if constexpr (kGateUp) {
          // Rows 0..31: gate rows n0 + r; rows 32..63: up rows n0 + r - 32.
          const bool is_up = r >= kW / 2;
          const int row = n0 + (is_up ? r - kW / 2 : r);
          if (k_in && row < n_out) {
            v = is_up ? weight_at<F>(ew.up, ew.up_scale, ew.up_scale2, row, k, cols, p.fp8_block)
                      : weight_at<F>(ew.gate, ew.gate_scale, ew.gate_scale2, row, k, cols, p.fp8_block);
          }
        } else {
          const int row = n0 + r;
          if (k_in && row < n_out) {
            v = weight_at<F>(ew.down, ew.down_scale, ew.down_scale2, row, k, cols, p.fp8_block);
          }
        }
        ws[lk * kWsLdGeneral + r] = v;
      }
      __syncthreads();
      if (tp + 16 < rows) {
        mma_step<2, kXsLdGeneral, kWsLdGeneral>(xs, ws, tp, wp, acc);
      } else if (tp < rows) {
        mma_step<1, kXsLdGeneral, kWsLdGeneral>(xs, ws, tp, wp, acc);
      }
    }

#pragma unroll
    for (int ti = 0; ti < 2; ++ti) {
      const int t = tp + 16 * ti;
      if (t >= rows) continue;
      const int64_t pos = off + static_cast<int64_t>(tile) * kT + t;
      if constexpr (kGateUp) {
        float* dst = p.act + pos * p.inter;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int col = n0 + wp + 16 * j;
          const float g = acc[ti][j], u = acc[ti][j + 2];
          if (col < n_out) dst[col] = g / (1.0f + expf(-g)) * u;  // the CPU silu_mul's expression
        }
      } else {
        float* dst = p.slot_out + static_cast<int64_t>(p.sorted_slots[pos]) * p.hidden;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = n0 + wp + 16 * j;
          if (col < n_out) dst[col] = acc[ti][j];
        }
      }
    }
  }
}

constexpr int kCombineThreads = 256;

// One block per token: out[t] += sum over its valid slots, in slot order, of weight * slot_out row.
__global__ void __launch_bounds__(kCombineThreads) moe_experts_combine_kernel(const MoeExpertsParams p) {
  dev::grid_dep_enter();
  const int64_t t = blockIdx.x;
  const int32_t* ids = p.topk_ids + t * p.top_k;
  const float* wts = p.topk_weights + t * p.top_k;
  float4* o = reinterpret_cast<float4*>(p.out + t * p.ldo);
  for (int c = threadIdx.x; c < p.hidden / 4; c += kCombineThreads) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < p.top_k; ++k) {
      const int32_t id = ids[k];
      if (id < 0 || id >= p.n_experts) continue;
      const float w = wts[k];
      const float4 y = reinterpret_cast<const float4*>(p.slot_out + (t * p.top_k + k) * p.hidden)[c];
      acc.x = fmaf(w, y.x, acc.x);
      acc.y = fmaf(w, y.y, acc.y);
      acc.z = fmaf(w, y.z, acc.z);
      acc.w = fmaf(w, y.w, acc.w);
    }
    float4 v = o[c];
    v.x += acc.x;
    v.y += acc.y;
    v.z += acc.z;
    v.w += acc.w;
    o[c] = v;
  }
}

// The general path's combine: one column per thread, the same per-element sum as the vector kernel.
__global__ void __launch_bounds__(kCombineThreads)
    moe_experts_combine_general_kernel(const MoeExpertsParams p) {
  dev::grid_dep_enter();
  const int64_t t = blockIdx.x;
  const int32_t* ids = p.topk_ids + t * p.top_k;
  const float* wts = p.topk_weights + t * p.top_k;
  float* o = p.out + t * p.ldo;
  for (int c = threadIdx.x; c < p.hidden; c += kCombineThreads) {
    float acc = 0.0f;
    for (int k = 0; k < p.top_k; ++k) {
      const int32_t id = ids[k];
      if (id < 0 || id >= p.n_experts) continue;
      acc = fmaf(wts[k], p.slot_out[(t * p.top_k + k) * p.hidden + c], acc);
    }
    o[c] += acc;
  }
}

int token_splits(int m) {
  return std::max(1, std::min(kZMax, (m + kT - 1) / kT));
}

template <MoeWeightFormat F, bool kGateUp>
void launch_gemm_format(const MoeExpertsParams& p, MoeExpertsPath path, dim3 grid, cudaStream_t stream) {
  if (path == MoeExpertsPath::Tiled) {
    launch_kernel("moe_experts_gemm", moe_experts_gemm_kernel<F, kGateUp>, grid, kThreads, 0, stream, p);
  } else {
    launch_kernel("moe_experts_gemm_general", moe_experts_gemm_general_kernel<F, kGateUp>, grid, kThreads, 0,
                  stream, p);
  }
}

template <bool kGateUp>
void launch_gemm(const MoeExpertsParams& p, cudaStream_t stream) {
  const MoeExpertsPath path = moe_experts_path(p);
  check_smem(current_device_caps(), kGateUp ? "moe_experts_gate_up" : "moe_experts_down",
             moe_experts_smem_bytes(path));
  const int cols_per_block = kGateUp ? kW / 2 : kW;
  const int n_out = kGateUp ? p.inter : p.hidden;
  const dim3 grid((n_out + cols_per_block - 1) / cols_per_block, p.n_experts, token_splits(p.m));
  switch (p.format) {
    case MoeWeightFormat::F32:
      launch_gemm_format<MoeWeightFormat::F32, kGateUp>(p, path, grid, stream);
      break;
    case MoeWeightFormat::BF16:
      launch_gemm_format<MoeWeightFormat::BF16, kGateUp>(p, path, grid, stream);
      break;
    case MoeWeightFormat::FP8Block:
      launch_gemm_format<MoeWeightFormat::FP8Block, kGateUp>(p, path, grid, stream);
      break;
    case MoeWeightFormat::NVFP4:
      launch_gemm_format<MoeWeightFormat::NVFP4, kGateUp>(p, path, grid, stream);
      break;
    default:
      MS_THROW("moe_experts: unknown weight format {}", static_cast<int>(p.format));
  }
  CUDA_CHECK(cudaGetLastError());
}

bool aligned(const void* ptr, size_t a) {
  return reinterpret_cast<uintptr_t>(ptr) % a == 0;
}

}  // namespace

size_t moe_experts_smem_bytes(MoeExpertsPath path) {
  return (path == MoeExpertsPath::Tiled ? kSmemFloats : kSmemFloatsGeneral) * sizeof(float);
}

MoeExpertsPath moe_experts_path(MoeWeightFormat /*format: every format has the same tiled rule today*/,
                                int hidden, int inter) {
  const bool tiles = hidden > 0 && inter > 0 && hidden % kMoeKTile == 0 && inter % kMoeKTile == 0;
  return tiles ? MoeExpertsPath::Tiled : MoeExpertsPath::General;
}

MoeExpertsPath moe_experts_path(const MoeExpertsParams& p) {
  if (moe_experts_path(p.format, p.hidden, p.inter) != MoeExpertsPath::Tiled) return MoeExpertsPath::General;
  const bool vec = aligned(p.x, 16) && aligned(p.out, 16) && aligned(p.act, 16) && aligned(p.slot_out, 16) &&
                   p.ldx % 4 == 0 && p.ldo % 4 == 0;
  return vec ? MoeExpertsPath::Tiled : MoeExpertsPath::General;
}

size_t moe_experts_act_bytes(int m, int top_k, int inter) {
  return static_cast<size_t>(std::max(m, 0)) * std::max(top_k, 0) * std::max(inter, 0) * sizeof(float);
}

size_t moe_experts_slot_out_bytes(int m, int top_k, int hidden) {
  return static_cast<size_t>(std::max(m, 0)) * std::max(top_k, 0) * std::max(hidden, 0) * sizeof(float);
}

void moe_experts_check(const MoeExpertsParams& p) {
  MS_CHECK(p.m >= 0 && p.top_k >= 1, "moe_experts: m {} top_k {}", p.m, p.top_k);
  MS_CHECK(p.n_experts >= 1 && p.n_experts <= 65535, "moe_experts: n_experts {} is outside [1, 65535]",
           p.n_experts);
  MS_CHECK(p.hidden > 0 && p.inter > 0, "moe_experts: hidden {} and inter {} must be positive", p.hidden,
           p.inter);
  MS_CHECK(p.format == MoeWeightFormat::F32 || p.format == MoeWeightFormat::BF16 ||
               p.format == MoeWeightFormat::FP8Block || p.format == MoeWeightFormat::NVFP4,
           "moe_experts: unknown weight format {}", static_cast<int>(p.format));
  MS_CHECK(p.format != MoeWeightFormat::NVFP4 || (p.hidden % 16 == 0 && p.inter % 16 == 0),
           "moe_experts: NVFP4 needs hidden {} and inter {} to be multiples of its 16-element block",
           p.hidden, p.inter);
  MS_CHECK(p.format != MoeWeightFormat::FP8Block || (p.fp8_block > 0 && p.fp8_block % 16 == 0),
           "moe_experts: fp8_block {} must be a positive multiple of 16", p.fp8_block);
  const int64_t slots = static_cast<int64_t>(p.m) * p.top_k;
  MS_CHECK(slots < (int64_t{1} << 31), "moe_experts: m * top_k = {} slots overflow", slots);
  if (p.m == 0) return;
  MS_CHECK(p.x != nullptr && aligned(p.x, 4) && p.ldx >= p.hidden,
           "moe_experts: x must be non-null and 4-byte aligned with ldx {} >= hidden {}", p.ldx, p.hidden);
  MS_CHECK(p.out != nullptr && aligned(p.out, 4) && p.ldo >= p.hidden,
           "moe_experts: out must be non-null and 4-byte aligned with ldo {} >= hidden {}", p.ldo, p.hidden);
  MS_CHECK(p.topk_ids != nullptr && p.topk_weights != nullptr,
           "moe_experts: topk_ids / topk_weights is null");
  MS_CHECK(p.expert_counts != nullptr && p.expert_offsets != nullptr && p.sorted_slots != nullptr,
           "moe_experts: the plan (expert_counts / expert_offsets / sorted_slots) is null");
  MS_CHECK(p.experts != nullptr, "moe_experts: experts (the device array of weight pointers) is null");
  MS_CHECK(p.act != nullptr && aligned(p.act, 4), "moe_experts: act workspace is null or not 4-byte aligned");
  MS_CHECK(p.slot_out != nullptr && aligned(p.slot_out, 4),
           "moe_experts: slot_out workspace is null or not 4-byte aligned");
}

void moe_experts_gate_up(const MoeExpertsParams& p, cudaStream_t stream) {
  moe_experts_check(p);
  if (p.m == 0) return;
  launch_gemm<true>(p, stream);
}

void moe_experts_down(const MoeExpertsParams& p, cudaStream_t stream) {
  moe_experts_check(p);
  if (p.m == 0) return;
  launch_gemm<false>(p, stream);
}

void moe_experts_combine(const MoeExpertsParams& p, cudaStream_t stream) {
  moe_experts_check(p);
  if (p.m == 0) return;
  if (moe_experts_path(p) == MoeExpertsPath::Tiled) {
    launch_kernel("moe_experts_combine", moe_experts_combine_kernel, p.m, kCombineThreads, 0, stream, p);
  } else {
    launch_kernel("moe_experts_combine_general", moe_experts_combine_general_kernel, p.m, kCombineThreads, 0,
                  stream, p);
  }
  CUDA_CHECK(cudaGetLastError());
}

void moe_experts(const MoeExpertsParams& p, cudaStream_t stream) {
  if (p.m > 0 && moe_experts_decode_fp8_applies(p)) {
    moe_experts_decode_fp8(p, stream);  // FP8-block decode, f16 activations: weights streamed into registers
    return;
  }
  if (p.m > 0 && moe_experts_decode_applies(p)) {
    moe_experts_decode(p, stream);  // NVFP4 decode, f16 activations: weights streamed into registers
    return;
  }
  if (p.m > 0 && moe_experts_stream_applies(p)) {
    moe_experts_stream(p, stream);  // NVFP4 decode: two launches, the combine fused into down
    return;
  }
  moe_experts_gate_up(p, stream);
  moe_experts_down(p, stream);
  moe_experts_combine(p, stream);
}

}  // namespace ms::cuda
