// The simple kernels (any shape; the streaming ones in mla_absorb_stream.cu take decode shapes) and the
// launchers that choose between them.
// mla_absorb_q: block (128-column slice of W_UK_h, head h, tile of kMlaAbsorbTokens tokens); thread c owns
// column c and accumulates it for every token of the tile, the tile's q_nope rows staged in shared memory.
// mla_out_v: block (32 rows of W_UV_h, head h, token tile); one warp per row reads it once, lanes across the
// row, dotting it with every token's latent (staged in shared memory), then a warp reduction per token.
#include <cuda_fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/mla_attention/mla_absorb.h"
#include "kernels/cuda/mla_attention/mla_absorb_stream.h"
#include "kernels/cuda/paged_kv/current_caps.h"

namespace ms::cuda {
namespace {

constexpr int kAbsorbCols = 128;  // threads of an absorb block = columns it owns
constexpr int kOutWarps = 8;
constexpr int kOutRowsPerWarp = 4;
constexpr int kOutRows = kOutWarps * kOutRowsPerWarp;  // W_UV rows per out_v block
constexpr int kT = kMlaAbsorbTokens;

// Element (row, col) of the weight as f32, exactly as kernels/cpu dequantize_row computes it.
__device__ __forceinline__ float weight_at(const DenseWeightView& w, int64_t row, int64_t col) {
  const int64_t i = row * w.cols + col;
  switch (w.format) {
    case DenseWeightFormat::F32:
      return __ldg(static_cast<const float*>(w.data) + i);
    case DenseWeightFormat::BF16:
      return __uint_as_float(static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(w.data) + i))
                             << 16);
    default: {
      const int64_t scale_cols = (w.cols + w.block - 1) / w.block;
      const float s = __ldg(w.scale + (row / w.block) * scale_cols + col / w.block);
      const __half_raw h =
          __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(w.data)[i], __NV_E4M3);
      return __half2float(__half(h)) * s;
    }
  }
}

__global__ void __launch_bounds__(kAbsorbCols) absorb_q_kernel(MlaAbsorbQParams p) {
  dev::grid_dep_enter();
  extern __shared__ float q_s[];  // [kT, nope]
  const int h = blockIdx.y, i0 = blockIdx.z * kT, tn = min(kT, p.m - i0);
  const int qd = p.nope + p.rope, r = p.kv_lora_rank, width = r + p.rope;
  for (int idx = threadIdx.x; idx < kT * p.nope; idx += blockDim.x) {
    const int t = idx / p.nope, d = idx % p.nope;
    q_s[idx] = t < tn ? p.q[(static_cast<int64_t>(i0 + t) * p.heads + h) * qd + d] : 0.0f;
  }
  __syncthreads();
  const int c = blockIdx.x * kAbsorbCols + threadIdx.x;
  if (c < r) {
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
    const int64_t row0 = static_cast<int64_t>(h) * (p.nope + p.v);
    for (int d = 0; d < p.nope; ++d) {
      const float wv = weight_at(p.kv_b, row0 + d, c);
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[t] = fmaf(q_s[t * p.nope + d], wv, acc[t]);
    }
#pragma unroll
    for (int t = 0; t < kT; ++t)
      if (t < tn) p.q_cat[(static_cast<int64_t>(i0 + t) * p.heads + h) * width + c] = acc[t];
  }
  if (blockIdx.x == 0)
    for (int idx = threadIdx.x; idx < tn * p.rope; idx += blockDim.x) {
      const int t = idx / p.rope, e = idx % p.rope;
      const int64_t tok = static_cast<int64_t>(i0 + t) * p.heads + h;
      p.q_cat[tok * width + r + e] = p.q[tok * qd + p.nope + e];
    }
}

__global__ void __launch_bounds__(kOutWarps * 32) out_v_kernel(MlaOutVParams p) {
  dev::grid_dep_enter();
  extern __shared__ float lat_s[];  // [kT, kv_lora_rank]
  const int h = blockIdx.y, i0 = blockIdx.z * kT, tn = min(kT, p.m - i0), r = p.kv_lora_rank;
  for (int idx = threadIdx.x; idx < kT * r; idx += blockDim.x) {
    const int t = idx / r, c = idx % r;
    lat_s[idx] = t < tn ? p.lat[(static_cast<int64_t>(i0 + t) * p.heads + h) * r + c] : 0.0f;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k = 0; k < kOutRowsPerWarp; ++k) {
    const int e = blockIdx.x * kOutRows + warp * kOutRowsPerWarp + k;
    if (e >= p.v) break;  // warp-uniform
    const int64_t row = static_cast<int64_t>(h) * (p.nope + p.v) + p.nope + e;
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
    for (int c = lane; c < r; c += 32) {
      const float wv = weight_at(p.kv_b, row, c);
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[t] = fmaf(lat_s[t * r + c], wv, acc[t]);
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      float s = acc[t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0 && t < tn)
        p.out[static_cast<int64_t>(i0 + t) * p.heads * p.v + static_cast<int64_t>(h) * p.v + e] = s;
    }
  }
}

void check_weight(const DenseWeightView& w, int heads, int nope, int v, int r, const char* op) {
  MS_CHECK(w.data != nullptr, "{}: kv_b weight data is null", op);
  MS_CHECK(w.rows == static_cast<int64_t>(heads) * (nope + v) && w.cols == r,
           "{}: kv_b is [{}, {}], expected [heads {} x (nope {} + v {}), kv_lora_rank {}]", op, w.rows,
           w.cols, heads, nope, v, r);
  if (w.format == DenseWeightFormat::FP8Block)
    MS_CHECK(w.scale != nullptr && w.block > 0,
             "{}: fp8 block weight needs its scales and a block edge (got {})", op, w.block);
}

}  // namespace

void mla_absorb_q(const MlaAbsorbQParams& p, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.heads > 0 && p.nope > 0 && p.rope >= 0 && p.v > 0 && p.kv_lora_rank > 0,
           "mla_absorb_q: bad shape m {} heads {} nope {} rope {} v {} kv_lora_rank {}", p.m, p.heads, p.nope,
           p.rope, p.v, p.kv_lora_rank);
  check_weight(p.kv_b, p.heads, p.nope, p.v, p.kv_lora_rank, "mla_absorb_q");
  if (p.m == 0) return;
  MS_CHECK(p.q && p.q_cat, "mla_absorb_q: q and q_cat must be set");
  const DeviceCaps caps = current_device_caps();
  if (p.kernel != MlaAbsorbKernel::Simple) {
    const std::string why = detail::absorb_q_stream_refusal(p, caps);
    if (why.empty()) {
      detail::absorb_q_stream(p, caps, stream);
      return;
    }
    MS_CHECK(p.kernel == MlaAbsorbKernel::Auto, "{}", why);
  }
  const size_t smem = sizeof(float) * kT * p.nope;
  prepare_smem(caps, "mla_absorb_q", absorb_q_kernel, smem);
  const dim3 grid((p.kv_lora_rank + kAbsorbCols - 1) / kAbsorbCols, p.heads, (p.m + kT - 1) / kT);
  MS_CHECK(grid.z <= 65535u && p.heads <= 65535, "mla_absorb_q: m {} / heads {} exceed the grid", p.m,
           p.heads);
  launch_kernel("absorb_q", absorb_q_kernel, grid, kAbsorbCols, smem, stream, p);
}

void mla_out_v(const MlaOutVParams& p, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.heads > 0 && p.nope > 0 && p.v > 0 && p.kv_lora_rank > 0,
           "mla_out_v: bad shape m {} heads {} nope {} v {} kv_lora_rank {}", p.m, p.heads, p.nope, p.v,
           p.kv_lora_rank);
  check_weight(p.kv_b, p.heads, p.nope, p.v, p.kv_lora_rank, "mla_out_v");
  if (p.m == 0) return;
  MS_CHECK(p.lat && p.out, "mla_out_v: lat and out must be set");
  const DeviceCaps caps = current_device_caps();
  if (p.kernel != MlaAbsorbKernel::Simple) {
    const std::string why = detail::out_v_stream_refusal(p, caps);
    if (why.empty()) {
      detail::out_v_stream(p, caps, stream);
      return;
    }
    MS_CHECK(p.kernel == MlaAbsorbKernel::Auto, "{}", why);
  }
  const size_t smem = sizeof(float) * kT * p.kv_lora_rank;
  prepare_smem(caps, "mla_out_v", out_v_kernel, smem);
  const dim3 grid((p.v + kOutRows - 1) / kOutRows, p.heads, (p.m + kT - 1) / kT);
  MS_CHECK(grid.z <= 65535u && p.heads <= 65535, "mla_out_v: m {} / heads {} exceed the grid", p.m, p.heads);
  launch_kernel("out_v", out_v_kernel, grid, kOutWarps * 32, smem, stream, p);
}

std::string mla_absorb_q_streaming_refusal(const MlaAbsorbQParams& p) {
  return detail::absorb_q_stream_refusal(p, current_device_caps());
}

std::string mla_out_v_streaming_refusal(const MlaOutVParams& p) {
  return detail::out_v_stream_refusal(p, current_device_caps());
}

}  // namespace ms::cuda
