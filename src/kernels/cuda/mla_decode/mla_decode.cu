// MLA decode: split pass (one block = one chunk of one sequence's pages x 64 heads) and combine pass.
//
// Split pass, per page of 64 tokens: the fp8 page is copied raw into shared memory with cp.async (issued one
// page ahead), widened once to bf16 (exact: e4m3 is a subset of bf16) into a padded tile, then
//   S[64 heads, 64 tokens] = Q[64, 576] K^T   on the tensor cores (mma m16n8k16), warp (hg, half) computing
//                                            heads 16hg..16hg+15 x tokens 32half..32half+31, into shared S;
//   online softmax per head row (both warps of a head group compute it, identically, from shared S);
//   O[64, 512] += P[64, 64] V[64, 512]       warp (hg, half) owning heads 16hg.. x dims 256half.. (128 f32
//                                            accumulators per lane: O of 64 heads fills half the registers).
// The scores are scaled by softmax_scale * kv_scale * log2(e) and exponentiated with exp2; kv_scale on O is
// applied once in the combine pass. More than 64 heads take several blocks per chunk (blockIdx.y), which
// run side by side so the second read of a page mostly hits L2: O of 128 heads (256 KB of f32) would not fit
// one multiprocessor's registers.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/mla_decode/mla_decode.h"

namespace ms::cuda {
namespace {

using namespace mla_decode_config;
constexpr int kMinPagesPerSplit = 2;  // below this the partial outputs cost more than the pages
constexpr float kLog2e = 1.4426950408889634f;

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

struct Layout {
  size_t work, seq, num_work, lse, part, total;
  int capacity;
};

Layout layout(int batch, int heads, int split_target) {
  Layout l;
  l.capacity = split_target + batch;
  l.work = 0;
  l.seq = align256(l.work + sizeof(int4) * l.capacity);
  l.num_work = align256(l.seq + sizeof(int2) * batch);
  l.lse = align256(l.num_work + sizeof(int));
  l.part = align256(l.lse + sizeof(float) * l.capacity * heads);
  l.total = align256(l.part + sizeof(float) * l.capacity * heads * kMlaLatentDim);
  return l;
}

__device__ __forceinline__ int seq_pages(const int32_t* seq_lens, int b, int stride) {
  const int len = min(max(seq_lens[b], 0), stride * kMlaPageSize);
  return (len + kMlaPageSize - 1) / kMlaPageSize;
}

// One block: pages per split chosen so the chunks fill about `target` blocks, then every sequence's pages
// cut into near-equal chunks. work[i] = (sequence, first page, end page, 0); seq[b] = (first item, items).
__global__ void mla_plan_kernel(const int32_t* __restrict__ seq_lens, int batch, int stride, int target,
                                int4* __restrict__ work, int2* __restrict__ seq, int* __restrict__ num_work) {
  dev::grid_dep_enter();
  __shared__ int total;
  __shared__ int per_split;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  int local = 0;
  for (int b = threadIdx.x; b < batch; b += blockDim.x) local += seq_pages(seq_lens, b, stride);
  atomicAdd(&total, local);  // integer sum: the same result in any order
  __syncthreads();
  // Smallest chunk size (>= kMinPagesPerSplit) whose chunk count fits `target`: one wave of blocks, not a
  // second wave for the few chunks that per-sequence rounding adds. Binary search; each probe counts in
  // parallel (integer sums: order-independent).
  __shared__ int probe_count;
  int max_pages = 0;
  for (int b = 0; b < batch; ++b) max_pages = max(max_pages, seq_pages(seq_lens, b, stride));
  int lo = max(kMinPagesPerSplit, (total + target - 1) / target), hi = max(lo, max_pages);
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    __syncthreads();
    if (threadIdx.x == 0) probe_count = 0;
    __syncthreads();
    int c = 0;
    for (int b = threadIdx.x; b < batch; b += blockDim.x)
      c += (seq_pages(seq_lens, b, stride) + mid - 1) / mid;
    atomicAdd(&probe_count, c);
    __syncthreads();
    if (probe_count <= target)
      hi = mid;
    else
      lo = mid + 1;
  }
  if (threadIdx.x == 0) {
    per_split = lo;
    int off = 0;
    for (int b = 0; b < batch; ++b) {
      const int n = seq_pages(seq_lens, b, stride);
      const int s = (n + per_split - 1) / per_split;
      seq[b] = make_int2(off, s);
      off += s;
    }
    *num_work = off;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    const int n = seq_pages(seq_lens, b, stride);
    const int2 s = seq[b];
    for (int i = 0; i < s.y; ++i)
      work[s.x + i] = make_int4(b, static_cast<int>(static_cast<long>(i) * n / s.y),
                                static_cast<int>(static_cast<long>(i + 1) * n / s.y), 0);
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

using tc::fp8x2_to_bf16x2;
using tc::ldsm_x4;
using tc::ldsm_x4_trans;
using tc::mma_bf16;
using tc::pack_bf16;

__global__ void __launch_bounds__(kThreads, 1)
    mla_split_kernel(MlaDecodeParams p, const int4* __restrict__ work, const int* __restrict__ num_work,
                     float* __restrict__ lse_out, float* __restrict__ part_out) {
  dev::grid_dep_enter();
  const int wi = blockIdx.x;
  if (wi >= *num_work) return;
  const int4 item = work[wi];
  const int b = item.x, page_begin = item.y, page_end = item.z;
  const int len = min(max(p.seq_lens[b], 0), p.block_table_stride * kMlaPageSize);
  const int head0 = blockIdx.y * kHeadsPerBlock;

  extern __shared__ uint4 smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem);  // [64][kRowStride]
  __nv_bfloat16* kv_s =
      reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<char*>(smem) + kQBytes);              // [64][..]
  uint4* raw = reinterpret_cast<uint4*>(reinterpret_cast<char*>(smem) + kQBytes + kKvBytes);  // [64*576] fp8
  float* s_s = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + kQBytes + kKvBytes + kPageBytes);

  const int32_t* table = p.block_table + static_cast<size_t>(b) * p.block_table_stride;
  auto issue_page = [&](int pg) {
    const int id =
        min(max(table[pg], 0), p.num_pages - 1);  // a bad id reads a wrong page, never out of bounds
    const uint4* src = reinterpret_cast<const uint4*>(p.kv + static_cast<size_t>(id) * kPageBytes);
    for (int i = threadIdx.x; i < kPageBytes / 16; i += kThreads) cp_async16(raw + i, src + i);
    cp_async_commit();
  };
  issue_page(page_begin);

  // Q of this block's 64 heads (rows past `heads` are zero and never written out).
  for (int i = threadIdx.x; i < kHeadsPerBlock * (kMlaHeadDim / 8); i += kThreads) {
    const int r = i / (kMlaHeadDim / 8), c = i % (kMlaHeadDim / 8), h = head0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < p.heads)
      v = __ldg(
          reinterpret_cast<const uint4*>(p.q + b * p.q_batch_stride + static_cast<int64_t>(h) * kMlaHeadDim) +
          c);
    *reinterpret_cast<uint4*>(q_s + r * kRowStride + c * 8) = v;
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int hg = warp & 3, half = warp >> 2;
  const float score_scale = p.softmax_scale * p.kv_scale * kLog2e;

  float o[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  const __nv_bfloat16* qa = q_s + (16 * hg + (lane & 15)) * kRowStride + (lane >> 4) * 8;
  const __nv_bfloat16* kb =
      kv_s + (32 * half + (lane & 7) + ((lane >> 4) << 3)) * kRowStride + ((lane >> 3) & 1) * 8;
  const __nv_bfloat16* vb =
      kv_s + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRowStride + 256 * half + (lane >> 4) * 8;

  for (int pg = page_begin; pg < page_end; ++pg) {
    const int valid = min(kMlaPageSize, len - pg * kMlaPageSize);
    cp_async_wait_all();
    __syncthreads();  // raw page landed; the previous page's S and V reads are finished
    for (int i = threadIdx.x; i < kPageBytes / 16; i += kThreads) {
      const int token = i / (kMlaHeadDim / 16), c = i % (kMlaHeadDim / 16);
      uint4 lo = make_uint4(0, 0, 0, 0), hi = make_uint4(0, 0, 0, 0);
      if (token < valid) {  // tokens past the sequence end may hold anything (NaN bytes): zero them
        const uint4 v = raw[i];
        lo = make_uint4(fp8x2_to_bf16x2(v.x), fp8x2_to_bf16x2(v.x >> 16), fp8x2_to_bf16x2(v.y),
                        fp8x2_to_bf16x2(v.y >> 16));
        hi = make_uint4(fp8x2_to_bf16x2(v.z), fp8x2_to_bf16x2(v.z >> 16), fp8x2_to_bf16x2(v.w),
                        fp8x2_to_bf16x2(v.w >> 16));
      }
      uint4* dst = reinterpret_cast<uint4*>(kv_s + token * kRowStride + c * 16);
      dst[0] = lo;
      dst[1] = hi;
    }
    __syncthreads();
    if (pg + 1 < page_end) issue_page(pg + 1);

    // S for heads 16hg.. x tokens 32half..32half+31.
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll 4
    for (int ks = 0; ks < kMlaHeadDim / 16; ++ks) {
      uint32_t a[4];
      ldsm_x4(a, qa + 16 * ks);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        ldsm_x4(r, kb + np * 16 * kRowStride + 16 * ks);
        mma_bf16(acc[2 * np], a, r[0], r[1]);
        mma_bf16(acc[2 * np + 1], a, r[2], r[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int col = 32 * half + 8 * nt + 2 * t;
      const float x0 = col < valid ? acc[nt][0] * score_scale : -INFINITY;
      const float x1 = col + 1 < valid ? acc[nt][1] * score_scale : -INFINITY;
      const float x2 = col < valid ? acc[nt][2] * score_scale : -INFINITY;
      const float x3 = col + 1 < valid ? acc[nt][3] * score_scale : -INFINITY;
      *reinterpret_cast<float2*>(s_s + (16 * hg + g) * kSStride + col) = make_float2(x0, x1);
      *reinterpret_cast<float2*>(s_s + (16 * hg + g + 8) * kSStride + col) = make_float2(x2, x3);
    }
    __syncthreads();

    // Online softmax over this page for rows 16hg+g and 16hg+g+8, in the A-fragment layout of P.
    float sv[2][4][4];
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const float* row = s_s + (16 * hg + g + 8 * rr) * kSStride + 16 * kk + 2 * t;
        const float2 u = *reinterpret_cast<const float2*>(row), w = *reinterpret_cast<const float2*>(row + 8);
        sv[rr][kk][0] = u.x;
        sv[rr][kk][1] = u.y;
        sv[rr][kk][2] = w.x;
        sv[rr][kk][3] = w.y;
        mx[rr] = fmaxf(mx[rr], fmaxf(fmaxf(u.x, u.y), fmaxf(w.x, w.y)));
      }
    float corr[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
      mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
      const float m_new = fmaxf(m_run[rr], mx[rr]);
      corr[rr] = exp2f(m_run[rr] - m_new);
      m_run[rr] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sv[rr][kk][e] = exp2f(sv[rr][kk][e] - m_new);
          sum += sv[rr][kk][e];
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l_run[rr] = l_run[rr] * corr[rr] + sum;
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      o[i][0] *= corr[0];
      o[i][1] *= corr[0];
      o[i][2] *= corr[1];
      o[i][3] *= corr[1];
    }
    // O[16 heads, 256 dims] += P[16, 64] V[64, 256].
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sv[0][kk][0], sv[0][kk][1]), pack_bf16(sv[1][kk][0], sv[1][kk][1]),
                              pack_bf16(sv[0][kk][2], sv[0][kk][3]), pack_bf16(sv[1][kk][2], sv[1][kk][3])};
#pragma unroll
      for (int np = 0; np < 16; ++np) {
        uint32_t r[4];
        ldsm_x4_trans(r, vb + kk * 16 * kRowStride + np * 16);
        mma_bf16(o[2 * np], pa, r[0], r[1]);
        mma_bf16(o[2 * np + 1], pa, r[2], r[3]);
      }
    }
  }

  // Partial output of this chunk, normalised, and its log2-sum-exp.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int h = head0 + 16 * hg + g + 8 * rr;
    if (h >= p.heads) continue;
    const float inv = 1.f / l_run[rr];
    float* dst = part_out + (static_cast<size_t>(wi) * p.heads + h) * kMlaLatentDim + 256 * half + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 32; ++nt)
      *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(o[nt][2 * rr] * inv, o[nt][2 * rr + 1] * inv);
    if (half == 0 && t == 0) lse_out[static_cast<size_t>(wi) * p.heads + h] = m_run[rr] + log2f(l_run[rr]);
  }
}

// One block per (sequence, head): weights 2^(lse_s - max) over the sequence's chunks, in chunk order.
__global__ void mla_combine_kernel(MlaDecodeParams p, const int2* __restrict__ seq,
                                   const float* __restrict__ lse, const float* __restrict__ part) {
  dev::grid_dep_enter();
  const int b = blockIdx.x, h = blockIdx.y, d = threadIdx.x * 4;
  const int2 s = seq[b];
  float mx = -INFINITY;
  for (int i = 0; i < s.y; ++i) mx = fmaxf(mx, lse[static_cast<size_t>(s.x + i) * p.heads + h]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  for (int i = 0; i < s.y; ++i) {
    const size_t slot = static_cast<size_t>(s.x + i) * p.heads + h;
    const float w = exp2f(lse[slot] - mx);
    const float4 v = *reinterpret_cast<const float4*>(part + slot * kMlaLatentDim + d);
    wsum += w;
    acc.x = fmaf(w, v.x, acc.x);
    acc.y = fmaf(w, v.y, acc.y);
    acc.z = fmaf(w, v.z, acc.z);
    acc.w = fmaf(w, v.w, acc.w);
  }
  const float f = s.y > 0 ? p.kv_scale / wsum : 0.f;
  const size_t o = b * p.out_batch_stride + static_cast<size_t>(h) * kMlaLatentDim + d;
  if (p.out_bf16) {
    auto* out = static_cast<__nv_bfloat16*>(p.out) + o;
    const uint2 v = make_uint2(pack_bf16(acc.x * f, acc.y * f), pack_bf16(acc.z * f, acc.w * f));
    *reinterpret_cast<uint2*>(out) = v;
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(p.out) + o) =
        make_float4(acc.x * f, acc.y * f, acc.z * f, acc.w * f);
  }
}

void check_params(const MlaDecodeParams& p) {
  MS_CHECK(p.batch > 0 && p.heads > 0, "mla_decode: batch = {} and heads = {} must be positive", p.batch,
           p.heads);
  MS_CHECK(p.block_table_stride > 0 && p.num_pages > 0,
           "mla_decode: block_table_stride = {} and num_pages = {} must be positive", p.block_table_stride,
           p.num_pages);
  MS_CHECK(p.split_target > 0, "mla_decode: split_target = {} must be positive (the multiprocessor count)",
           p.split_target);
  MS_CHECK(p.q && p.kv && p.block_table && p.seq_lens && p.out && p.workspace,
           "mla_decode: q, kv, block_table, seq_lens, out and workspace must all be set");
  MS_CHECK(
      reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_batch_stride % 8 == 0 &&
          p.q_batch_stride >= static_cast<int64_t>(p.heads) * kMlaHeadDim,
      "mla_decode: q must be 16-byte aligned with q_batch_stride (= {}) a multiple of 8 and >= heads * 576",
      p.q_batch_stride);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.kv) % 16 == 0, "mla_decode: kv pool must be 16-byte aligned");
  MS_CHECK(
      reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.out_batch_stride % 4 == 0 &&
          p.out_batch_stride >= static_cast<int64_t>(p.heads) * kMlaLatentDim,
      "mla_decode: out must be 16-byte aligned with out_batch_stride (= {}) a multiple of 4 and >= heads * "
      "512",
      p.out_batch_stride);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0,
           "mla_decode: workspace must be 256-byte aligned");
}

int head_groups(int heads) {
  return (heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
}

}  // namespace

size_t mla_decode_workspace_bytes(int batch, int heads, int split_target) {
  return layout(std::max(batch, 0), std::max(heads, 0), std::max(split_target, 0)).total;
}

void mla_decode_plan(const MlaDecodeParams& p, cudaStream_t stream) {
  check_params(p);
  const Layout l = layout(p.batch, p.heads, p.split_target);
  char* ws = static_cast<char*>(p.workspace);
  const int target = std::max(1, p.split_target / head_groups(p.heads));
  launch_kernel("mla_plan", mla_plan_kernel, 1, 256, 0, stream, p.seq_lens, p.batch, p.block_table_stride,
                target, reinterpret_cast<int4*>(ws + l.work), reinterpret_cast<int2*>(ws + l.seq),
                reinterpret_cast<int*>(ws + l.num_work));
}

void mla_decode(const MlaDecodeParams& p, cudaStream_t stream) {
  check_params(p);
  const DeviceCaps caps = current_device_caps();
  check_fit(caps, need());
  CUDA_CHECK(cudaFuncSetAttribute(mla_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSmemBytes)));

  const Layout l = layout(p.batch, p.heads, p.split_target);
  char* ws = static_cast<char*>(p.workspace);
  auto* lse = reinterpret_cast<float*>(ws + l.lse);
  auto* part = reinterpret_cast<float*>(ws + l.part);
  dim3 grid(l.capacity, head_groups(p.heads));
  launch_kernel("mla_split", mla_split_kernel, grid, kThreads, kSmemBytes, stream, p,
                reinterpret_cast<const int4*>(ws + l.work), reinterpret_cast<const int*>(ws + l.num_work),
                lse, part);
  launch_kernel("mla_combine", mla_combine_kernel, dim3(p.batch, p.heads), kMlaLatentDim / 4, 0, stream, p,
                reinterpret_cast<const int2*>(ws + l.seq), lse, part);
}

}  // namespace ms::cuda
