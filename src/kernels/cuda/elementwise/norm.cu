// One block of kNormThreads per row. Every pass walks the row with the same thread-to-element mapping, so
// an output that aliases an input is only written by the thread that read that element.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/elementwise/norm.h"

namespace ms::cuda {
namespace {

constexpr int kNormThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block, returned to every thread; `red` [32] may be reused by the next call.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // earlier readers of red are done
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  const int warps = (blockDim.x + 31) >> 5;
  for (int w = 0; w < warps; ++w) s += red[w];
  return s;
}

__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  float* o = p.out + r * p.out_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) ss += x[i] * x[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.n) + p.eps);
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) o[i] = p.weight[i] * (x[i] * inv);
}

__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(AddRmsNormParams p) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float* h = p.h + r * p.h_stride;
  const float* d = p.delta + r * p.delta_stride;
  float* o = p.out + r * p.out_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
    const float v = h[i] + d[i];
    h[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.n) + p.eps);
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) o[i] = p.weight[i] * (h[i] * inv);
}

__global__ void __launch_bounds__(kNormThreads) layer_norm_kernel(LayerNormParams p) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  float* o = p.out + r * p.out_stride;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) sum += x[i];
  const float mean = block_sum(sum, red) / static_cast<float>(p.n);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) var += (x[i] - mean) * (x[i] - mean);
  var = block_sum(var, red);
  const float inv = 1.0f / sqrtf(var / static_cast<float>(p.n) + p.eps);
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x)
    o[i] = (x[i] - mean) * inv * p.weight[i] + (p.bias ? p.bias[i] : 0.0f);
}

void check_rows(int64_t m, int64_t n, const char* kernel) {
  MS_CHECK(m >= 0 && m <= 0x7fffffff, "{}: m = {} out of range", kernel, m);
  MS_CHECK(n >= 0, "{}: n = {} must not be negative", kernel, n);
}

}  // namespace

void rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  check_rows(p.m, p.n, "rms_norm");
  check_matrix(p.x, p.m, p.n, p.x_stride, "rms_norm", "x");
  check_matrix(p.out, p.m, p.n, p.out_stride, "rms_norm", "out");
  if (p.m == 0 || p.n == 0) return;
  MS_CHECK(p.weight != nullptr, "rms_norm: weight is null");
  MS_CHECK(p.x != p.out || p.x_stride == p.out_stride, "rms_norm: out aliases x with another row stride");
  rms_norm_kernel<<<static_cast<unsigned>(p.m), kNormThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream) {
  check_rows(p.m, p.n, "add_rms_norm");
  check_matrix(p.h, p.m, p.n, p.h_stride, "add_rms_norm", "h");
  check_matrix(p.delta, p.m, p.n, p.delta_stride, "add_rms_norm", "delta");
  check_matrix(p.out, p.m, p.n, p.out_stride, "add_rms_norm", "out");
  if (p.m == 0 || p.n == 0) return;
  MS_CHECK(p.weight != nullptr, "add_rms_norm: weight is null");
  MS_CHECK(p.out != p.h && p.delta != p.h, "add_rms_norm: out and delta must not alias the residual h");
  MS_CHECK(p.out != p.delta || p.out_stride == p.delta_stride,
           "add_rms_norm: out aliases delta with another row stride");
  add_rms_norm_kernel<<<static_cast<unsigned>(p.m), kNormThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void layer_norm(const LayerNormParams& p, cudaStream_t stream) {
  check_rows(p.m, p.n, "layer_norm");
  check_matrix(p.x, p.m, p.n, p.x_stride, "layer_norm", "x");
  check_matrix(p.out, p.m, p.n, p.out_stride, "layer_norm", "out");
  if (p.m == 0 || p.n == 0) return;
  MS_CHECK(p.weight != nullptr, "layer_norm: weight is null");
  MS_CHECK(p.x != p.out || p.x_stride == p.out_stride, "layer_norm: out aliases x with another row stride");
  layer_norm_kernel<<<static_cast<unsigned>(p.m), kNormThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ms::cuda
