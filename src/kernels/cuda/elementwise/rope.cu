// One block per row: the row's cos/sin table (dim/2 pairs) is computed once into shared memory, then the
// threads rotate every (head, pair) of the row.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/elementwise/rope.h"

namespace ms::cuda {
namespace {

constexpr int kRopeThreads = 256;
constexpr int64_t kRopeMaxHalf = 4096;  // 32 KB of cos/sin: within the default shared memory of any GPU

__global__ void __launch_bounds__(kRopeThreads) rope_kernel(RopeParams p) {
  dev::grid_dep_enter();
  extern __shared__ float cs[];  // [2, half]: cos then sin, both times attention_scaling
  const int64_t r = blockIdx.x, half = p.dim / 2;
  // f32 angle, then f32 cos and sin of it, as the CPU reference.
  const float pos = static_cast<float>(p.positions[r]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * p.inv_freq[i];
    cs[i] = cosf(angle) * p.attention_scaling;
    cs[half + i] = sinf(angle) * p.attention_scaling;
  }
  __syncthreads();
  float* row = p.x + r * p.row_stride + p.offset;
  for (int64_t t = threadIdx.x; t < p.heads * half; t += blockDim.x) {
    const int64_t h = t / half, i = t % half;
    float* x = row + h * p.head_stride;
    const int64_t a = p.interleaved ? 2 * i : i;
    const int64_t b = p.interleaved ? 2 * i + 1 : i + half;
    const float c = cs[i], s = cs[half + i];
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x1 * c + x0 * s;
  }
}

}  // namespace

void rope(const RopeParams& p, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.m <= 0x7fffffff, "rope: m = {} out of range", p.m);
  MS_CHECK(p.heads >= 0, "rope: heads = {} must not be negative", p.heads);
  MS_CHECK(p.dim > 0 && p.dim % 2 == 0 && p.dim / 2 <= kRopeMaxHalf, "rope: dim = {} must be even in [2, {}]",
           p.dim, 2 * kRopeMaxHalf);
  MS_CHECK(p.offset >= 0, "rope: offset = {} must not be negative", p.offset);
  if (p.m == 0 || p.heads == 0) return;
  MS_CHECK(p.x != nullptr && p.positions != nullptr && p.inv_freq != nullptr,
           "rope: x, positions and inv_freq must be set");
  MS_CHECK(p.heads == 1 || p.head_stride >= p.offset + p.dim,
           "rope: head_stride {} is smaller than offset + dim = {}", p.head_stride, p.offset + p.dim);
  MS_CHECK(p.m == 1 || p.row_stride >= (p.heads - 1) * p.head_stride + p.offset + p.dim,
           "rope: row_stride {} is smaller than the {} heads it holds", p.row_stride, p.heads);
  const size_t smem = static_cast<size_t>(p.dim) * sizeof(float);
  launch_kernel("rope", rope_kernel, static_cast<unsigned>(p.m), kRopeThreads, smem, stream, p);
}

}  // namespace ms::cuda
