// DSA indexer: scores kernel and select kernel (see dsa_indexer.h).
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/dsa_indexer/dsa_indexer.h"
#include "kernels/cuda/paged_kv/current_caps.h"

namespace ms::cuda {
namespace {

constexpr int kScoreThreads = 256;
constexpr int kSelectThreads = 512;

__host__ __device__ inline int padded(int dim) {
  return dim | 1;  // odd row stride: one column of different rows falls in different banks
}

size_t score_smem_bytes(int heads, int dim, int keys_per_block) {
  const size_t h = static_cast<size_t>(heads), d = static_cast<size_t>(padded(dim));
  const size_t kb = static_cast<size_t>(keys_per_block);
  return sizeof(float) * (h * d + h + kb * d + kb * (h + 1));
}

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

__device__ __forceinline__ int visible_keys(const DsaIndexerParams& p, int i) {
  return min(p.meta.positions[i] + 1, p.max_keys);
}

// Block (token i0 + blockIdx.y, every gridDim.x-th chunk of kb keys from blockIdx.x): scores[row, j] for the
// visible keys j of its chunks. The grid is sized for the GPU, not for the context capacity (max_keys / kb
// blocks per token, nearly all empty at short contexts, cost ~2 us per thousand), and the token's q and head
// weights are staged once per block.
__global__ void __launch_bounds__(kScoreThreads)
    score_kernel(DsaIndexerParams p, int i0, int kb, float* __restrict__ scores) {
  dev::grid_dep_enter();
  const int row = blockIdx.y, i = i0 + row;
  const int n = visible_keys(p, i);
  if (n <= p.topk || static_cast<int64_t>(blockIdx.x) * kb >= n) return;  // block-uniform
  const int heads = p.heads, dim = p.dim, ds = padded(dim), seq = p.meta.token_seq[i];
  extern __shared__ float smem[];
  float* q_s = smem;                                   // [heads, ds]
  float* w_s = q_s + static_cast<size_t>(heads) * ds;  // [heads]
  float* k_s = w_s + heads;                            // [kb, ds]
  float* part_s = k_s + static_cast<size_t>(kb) * ds;  // [kb, heads + 1]
  for (int idx = threadIdx.x; idx < heads * dim; idx += kScoreThreads)
    q_s[(idx / dim) * ds + idx % dim] = p.q[static_cast<int64_t>(i) * heads * dim + idx];
  for (int h = threadIdx.x; h < heads; h += kScoreThreads) w_s[h] = p.w[static_cast<int64_t>(i) * heads + h];
  for (int64_t j0 = static_cast<int64_t>(blockIdx.x) * kb; j0 < n;
       j0 += static_cast<int64_t>(gridDim.x) * kb) {
    const int kn = static_cast<int>(min(static_cast<int64_t>(kb), n - j0));
    __syncthreads();  // q_s / w_s staged; the previous chunk's k_s and part_s are no longer read
    for (int idx = threadIdx.x; idx < kn * dim; idx += kScoreThreads) {
      const int kk = idx / dim, c = idx % dim;
      const int64_t slot = kv_slot(p.keys, p.meta, seq, static_cast<int>(j0) + kk);
      k_s[kk * ds + c] = slot >= 0 ? kv_read(p.keys, slot, c) : 0.0f;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < heads * kn; idx += kScoreThreads) {
      const int h = idx / kn, kk = idx % kn;
      const float* q = q_s + h * ds;
      const float* k = k_s + kk * ds;
      float dot = 0.0f;
      for (int c = 0; c < dim; ++c) dot = fmaf(q[c], k[c], dot);
      const float s = dot * p.softmax_scale;
      part_s[kk * (heads + 1) + h] = w_s[h] * (s > 0.0f ? s : 0.0f);
    }
    __syncthreads();
    for (int kk = threadIdx.x; kk < kn; kk += kScoreThreads) {
      float total = 0.0f;
      for (int h = 0; h < heads; ++h) total += part_s[kk * (heads + 1) + h];
      scores[static_cast<int64_t>(row) * p.max_keys + j0 + kk] = total == 0.0f ? 0.0f : total;  // no -0
    }
  }
}

// Order-preserving unsigned image of a float: a > b as floats <=> key(a) > key(b) (no NaN, no -0).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block per token: radix select of the topk-th largest key, then an ascending scan writing the selection.
__global__ void __launch_bounds__(kSelectThreads)
    select_kernel(DsaIndexerParams p, int i0, const float* __restrict__ scores) {
  dev::grid_dep_enter();
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ unsigned hist[256];
  __shared__ uint32_t prefix_s, mask_s;
  __shared__ int remaining_s;
  const int row = blockIdx.x, i = i0 + row, n = visible_keys(p, i);
  int32_t* out = p.out + static_cast<int64_t>(i) * p.topk;
  if (n <= p.topk) {
    for (int j = threadIdx.x; j < p.topk; j += kSelectThreads) out[j] = j < n ? j : -1;
    return;
  }
  const float* s = scores + static_cast<int64_t>(row) * p.max_keys;
  if (threadIdx.x == 0) {
    prefix_s = 0;
    mask_s = 0;
    remaining_s = p.topk;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kSelectThreads) hist[b] = 0;
    __syncthreads();  // also publishes the previous pass's prefix
    const uint32_t prefix = prefix_s, mask = mask_s;
    for (int j = threadIdx.x; j < n; j += kSelectThreads) {
      const uint32_t u = order_key(s[j]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Highest bin whose keys, with all keys in higher bins, reach the remaining count.
      int above = 0, bin = 0;
      for (int b = 255; b >= 0; --b) {
        if (above + static_cast<int>(hist[b]) >= remaining_s) {
          bin = b;
          break;
        }
        above += static_cast<int>(hist[b]);
      }
      remaining_s -= above;
      prefix_s = prefix | (static_cast<uint32_t>(bin) << shift);
      mask_s = mask | (255u << shift);
    }
    __syncthreads();  // hist read and the prefix written before the next pass clears it
  }
  const uint32_t threshold = prefix_s;
  const int need_equal = remaining_s;  // keys equal to the threshold to keep, the lowest positions first
  int taken = 0, equal_seen = 0;
  for (int j0 = 0; j0 < n; j0 += kSelectThreads) {
    const int j = j0 + threadIdx.x;
    const uint32_t u = j < n ? order_key(s[j]) : 0u;
    const int gt = j < n && u > threshold, eq = j < n && u == threshold;
    int eq_rank = 0, eq_total = 0, take_rank = 0, take_total = 0;
    Scan(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
    __syncthreads();
    const int take = gt || (eq && equal_seen + eq_rank < need_equal);
    Scan(scan_tmp).ExclusiveSum(take, take_rank, take_total);
    __syncthreads();
    if (take) out[taken + take_rank] = j;
    taken += take_total;
    equal_seen += eq_total;
  }
}

}  // namespace

size_t dsa_indexer_workspace_bytes(int rows, int max_keys) {
  return align256(sizeof(float) * static_cast<size_t>(std::max(rows, 0)) *
                  static_cast<size_t>(std::max(max_keys, 0)));
}

void dsa_indexer(const DsaIndexerParams& p, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.heads > 0 && p.dim > 0 && p.topk > 0 && p.max_keys > 0,
           "dsa_indexer: m {} heads {} dim {} topk {} max_keys {}", p.m, p.heads, p.dim, p.topk, p.max_keys);
  MS_CHECK(p.keys.data && p.keys.width == p.dim && p.keys.num_pages > 0 && p.keys.page_size > 0,
           "dsa_indexer: key cache [{}, {}, {}] does not match dim {}", p.keys.num_pages, p.keys.page_size,
           p.keys.width, p.dim);
  MS_CHECK(p.keys.format != KvFormat::FP8E4M3 || p.keys.scale > 0.0f,
           "dsa_indexer: fp8 key scale {} must be positive", p.keys.scale);
  MS_CHECK(p.meta.max_blocks > 0, "dsa_indexer: max_blocks {} must be positive", p.meta.max_blocks);
  if (p.m == 0) return;
  MS_CHECK(p.q && p.w && p.out && p.meta.token_seq && p.meta.positions && p.meta.block_table,
           "dsa_indexer: q, w, out, token_seq, positions and block_table must be set");
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(p.max_keys);
  MS_CHECK(
      p.workspace && reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0 && p.workspace_bytes >= row_bytes,
      "dsa_indexer: workspace of {} bytes must be 256-byte aligned and hold one row of {} scores",
      p.workspace_bytes, p.max_keys);
  const DeviceCaps caps = current_device_caps();
  int kb = 64;
  while (kb > 8 && score_smem_bytes(p.heads, p.dim, kb) > caps.smem_per_block_optin) kb /= 2;
  const size_t smem = score_smem_bytes(p.heads, p.dim, kb);
  prepare_smem(caps, "dsa_indexer_scores", score_kernel, smem);
  const int rows =
      static_cast<int>(std::min<size_t>({p.workspace_bytes / row_bytes, static_cast<size_t>(p.m), 65535}));
  auto* scores = static_cast<float*>(p.workspace);
  const int key_blocks = (p.max_keys + kb - 1) / kb;
  for (int i0 = 0; i0 < p.m; i0 += rows) {
    const int n = std::min(rows, p.m - i0);
    // About four blocks per multiprocessor over the pass's tokens; each walks its token's chunks.
    const int per_token = std::clamp((4 * std::max(caps.multiprocessors, 1) + n - 1) / n, 1, key_blocks);
    launch_kernel("score", score_kernel, dim3(static_cast<unsigned>(per_token), static_cast<unsigned>(n)),
                  kScoreThreads, smem, stream, p, i0, kb, scores);
    launch_kernel("select", select_kernel, static_cast<unsigned>(n), kSelectThreads, 0, stream, p, i0,
                  scores);
  }
}

}  // namespace ms::cuda
