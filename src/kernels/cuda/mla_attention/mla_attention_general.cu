// General paged MLA attention: block (token i, group of heads_per_block heads), 256 threads. Per chunk of
// keys_per_chunk keys (positions k0.. of the sequence, or entries k0.. of the token's selection):
//   slots of the chunk's keys (-1 for a key the token may not see: past its position, unselected, or -1);
//   the chunk's rows converted to f32 into shared memory, zeros for invisible keys, so that whatever an
//     unused page tail holds (NaN bytes) never reaches a product;
//   S[h, k] = softmax_scale * q[h] . kv_k (one thread per (head, key); -inf when invisible);
//   online softmax per head (one warp per head): running max, rescale of the running sum and accumulators;
//   acc[h, c] = acc[h, c] * corr[h] + sum_k P[h, k] kv_k[c] (each thread owns fixed (h, c) elements).
// lat = acc / l, or zeros when the token saw no key (as the CPU reference).
#include <cmath>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/mla_attention/mla_attention_general.h"
#include "kernels/cuda/paged_kv/current_caps.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = kMlaGeneralThreads;
constexpr int kWarps = kThreads / 32;

// Odd row stride in floats: threads reading the same column of different rows hit different banks.
__host__ __device__ inline int padded(int width) {
  return width | 1;
}

__global__ void __launch_bounds__(kThreads) mla_general_kernel(MlaAttentionParams p, int hg, int kc) {
  dev::grid_dep_enter();
  const int i = blockIdx.x, h0 = blockIdx.y * hg, hn = min(hg, p.heads - h0);
  const int r = p.kv_lora_rank, width = p.kv.width, ws = padded(width);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int64_t* slot_s = reinterpret_cast<int64_t*>(smem_raw);  // [kc]
  float* q_s = reinterpret_cast<float*>(slot_s + kc);      // [hg, ws]
  float* k_s = q_s + static_cast<size_t>(hg) * ws;         // [kc, ws]
  float* s_s = k_s + static_cast<size_t>(kc) * ws;         // [hg, kc]
  float* acc_s = s_s + static_cast<size_t>(hg) * kc;       // [hg, r]
  float* m_s = acc_s + static_cast<size_t>(hg) * r;        // [hg] running max
  float* l_s = m_s + hg;                                   // [hg] running sum
  float* corr_s = l_s + hg;                                // [hg] this chunk's rescale

  const int seq = p.meta.token_seq[i], pos = p.meta.positions[i];
  const int n_keys = p.topk ? p.topk_width : pos + 1;
  const int32_t* sel = p.topk ? p.topk + static_cast<int64_t>(i) * p.topk_width : nullptr;

  for (int idx = threadIdx.x; idx < hg * width; idx += kThreads) {
    const int h = idx / width, c = idx % width;
    q_s[h * ws + c] = h < hn ? p.q_cat[(static_cast<int64_t>(i) * p.heads + h0 + h) * width + c] : 0.0f;
  }
  for (int idx = threadIdx.x; idx < hg * r; idx += kThreads) acc_s[idx] = 0.0f;
  for (int h = threadIdx.x; h < hg; h += kThreads) {
    m_s[h] = -INFINITY;
    l_s[h] = 0.0f;
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k0 = 0; k0 < n_keys; k0 += kc) {
    __syncthreads();  // the previous chunk's k_s, s_s and corr_s reads are done (first pass: q_s, state set)
    for (int kk = threadIdx.x; kk < kc; kk += kThreads) {
      int64_t slot = -1;
      if (k0 + kk < n_keys) {
        const int j = sel ? sel[k0 + kk] : k0 + kk;
        if (j >= 0 && j <= pos) slot = kv_slot(p.kv, p.meta, seq, j);
      }
      slot_s[kk] = slot;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kc * width; idx += kThreads) {
      const int kk = idx / width, c = idx % width;
      const int64_t slot = slot_s[kk];
      k_s[kk * ws + c] = slot >= 0 ? kv_read(p.kv, slot, c) : 0.0f;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < hg * kc; idx += kThreads) {
      const int h = idx / kc, kk = idx % kc;
      float s = -INFINITY;
      if (slot_s[kk] >= 0) {
        const float* q = q_s + h * ws;
        const float* k = k_s + kk * ws;
        float dot = 0.0f;
        for (int c = 0; c < width; ++c) dot = fmaf(q[c], k[c], dot);
        s = dot * p.softmax_scale;
      }
      s_s[idx] = s;
    }
    __syncthreads();
    for (int h = warp; h < hg; h += kWarps) {
      const float m_old = m_s[h];
      float mx = -INFINITY;
      for (int kk = lane; kk < kc; kk += 32) mx = fmaxf(mx, s_s[h * kc + kk]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int kk = lane; kk < kc; kk += 32) {
        const float s = s_s[h * kc + kk];
        const float e = s == -INFINITY ? 0.0f : expf(s - m_new);
        s_s[h * kc + kk] = e;
        sum += e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) {
        const float corr = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
        m_s[h] = m_new;
        l_s[h] = l_s[h] * corr + sum;
        corr_s[h] = corr;
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < hn * r; idx += kThreads) {
      const int h = idx / r, c = idx % r;
      const float* pr = s_s + h * kc;
      float a = acc_s[idx] * corr_s[h];
      for (int kk = 0; kk < kc; ++kk) a = fmaf(pr[kk], k_s[kk * ws + c], a);
      acc_s[idx] = a;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < hn * r; idx += kThreads) {
    const int h = idx / r, c = idx % r;
    const float l = l_s[h];
    p.lat[(static_cast<int64_t>(i) * p.heads + h0 + h) * r + c] = l > 0.0f ? acc_s[idx] / l : 0.0f;
  }
}

}  // namespace

size_t mla_general_smem_bytes(int heads_per_block, int keys_per_chunk, int width, int kv_lora_rank) {
  const size_t hg = static_cast<size_t>(heads_per_block), kc = static_cast<size_t>(keys_per_chunk);
  const size_t ws = static_cast<size_t>(padded(width));
  return sizeof(int64_t) * kc +
         sizeof(float) * (hg * ws + kc * ws + hg * kc + hg * static_cast<size_t>(kv_lora_rank) + 3 * hg);
}

void mla_general_launch(const MlaAttentionParams& p, int heads_per_block, int keys_per_chunk,
                        const DeviceCaps& caps, cudaStream_t stream) {
  MS_CHECK(heads_per_block > 0 && keys_per_chunk > 0, "mla_attention: tile {} heads x {} keys is empty",
           heads_per_block, keys_per_chunk);
  if (p.m == 0) return;
  const size_t smem = mla_general_smem_bytes(heads_per_block, keys_per_chunk, p.kv.width, p.kv_lora_rank);
  prepare_smem(caps, "mla_attention_general", mla_general_kernel, smem);
  const dim3 grid(static_cast<unsigned>(p.m),
                  static_cast<unsigned>((p.heads + heads_per_block - 1) / heads_per_block));
  MS_CHECK(grid.y <= 65535u, "mla_attention: {} head groups exceed the grid", grid.y);
  launch_kernel("mla_general", mla_general_kernel, grid, kThreads, smem, stream, p, heads_per_block,
                keys_per_chunk);
}

}  // namespace ms::cuda
