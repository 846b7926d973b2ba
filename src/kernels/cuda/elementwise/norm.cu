// One block per row. Rows whose length is a multiple of 4 (16-byte aligned, up to 4 * kRegThreads * 8
// elements) take the register kernels: each thread loads its float4 pieces of the row (and of the residual)
// at once into registers, so the loads of a row are all in flight together (a decode step normalises one
// row: the looped kernel waited on one load latency per 256 elements, ~15 us for 6144). Other rows take the
// looped kernels. Every pass walks the row with the same thread-to-element mapping, so an output that
// aliases an input is only written by the thread that read that element.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/elementwise/norm.h"

#include <initializer_list>
#include <type_traits>
#include <utility>

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
  dev::grid_dep_enter();
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
  dev::grid_dep_enter();
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
  dev::grid_dep_enter();
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

constexpr int kRegThreads = 512;

// Row in registers: thread t holds float4 pieces t, t + 512, ... (V of them; pieces past n / 4 are zero).
template <int V>
__global__ void __launch_bounds__(kRegThreads) rms_norm_reg_kernel(RmsNormParams p) {
  dev::grid_dep_enter();
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float4* x = reinterpret_cast<const float4*>(p.x + r * p.x_stride);
  float4* o = reinterpret_cast<float4*>(p.out + r * p.out_stride);
  const float4* w = reinterpret_cast<const float4*>(p.weight);
  const int n4 = static_cast<int>(p.n / 4);
  float4 v[V];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int i = threadIdx.x + j * kRegThreads;
    v[j] = i < n4 ? x[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int j = 0; j < V; ++j) ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.n) + p.eps);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int i = threadIdx.x + j * kRegThreads;
    if (i < n4) {
      const float4 g = __ldg(w + i);
      o[i] =
          make_float4(g.x * (v[j].x * inv), g.y * (v[j].y * inv), g.z * (v[j].z * inv), g.w * (v[j].w * inv));
    }
  }
}

// As rms_norm_reg_kernel with h += delta first. Its normalise-and-store tail is written out rather than
// shared with rms_norm_reg_kernel: as a shared device function, nvcc fuses the other product of the sum of
// squares (V = 1), which changes the rounding.
template <int V>
__global__ void __launch_bounds__(kRegThreads) add_rms_norm_reg_kernel(AddRmsNormParams p) {
  dev::grid_dep_enter();
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float4* h = reinterpret_cast<float4*>(p.h + r * p.h_stride);
  const float4* d = reinterpret_cast<const float4*>(p.delta + r * p.delta_stride);
  float4* o = reinterpret_cast<float4*>(p.out + r * p.out_stride);
  const float4* w = reinterpret_cast<const float4*>(p.weight);
  const int n4 = static_cast<int>(p.n / 4);
  float4 v[V], dv[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int i = threadIdx.x + j * kRegThreads;
    v[j] = i < n4 ? h[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    dv[j] = i < n4 ? d[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    v[j] = make_float4(v[j].x + dv[j].x, v[j].y + dv[j].y, v[j].z + dv[j].z, v[j].w + dv[j].w);
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    const int i = threadIdx.x + j * kRegThreads;
    if (i < n4) h[i] = v[j];
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.n) + p.eps);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int i = threadIdx.x + j * kRegThreads;
    if (i < n4) {
      const float4 g = __ldg(w + i);
      o[i] =
          make_float4(g.x * (v[j].x * inv), g.y * (v[j].y * inv), g.z * (v[j].z * inv), g.w * (v[j].w * inv));
    }
  }
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// float4 pieces per thread of the register kernels for rows of n, or 0 when they do not apply.
int reg_pieces(int64_t n, std::initializer_list<std::pair<const void*, int64_t>> rows) {
  if (n % 4 != 0 || n > int64_t{4} * kRegThreads * 8) return 0;
  for (const auto& [ptr, stride] : rows)
    if (!aligned16(ptr) || stride % 4 != 0) return 0;
  const int64_t per = (n / 4 + kRegThreads - 1) / kRegThreads;
  return per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 8;
}

// Runs reg(std::integral_constant<int, V>{}) for V = pieces (1, 2, 4 or 8: reg_pieces), looped() for 0.
template <class Reg, class Looped>
void dispatch_pieces(int pieces, Reg&& reg, Looped&& looped) {
  switch (pieces) {
    case 1:
      reg(std::integral_constant<int, 1>{});
      break;
    case 2:
      reg(std::integral_constant<int, 2>{});
      break;
    case 4:
      reg(std::integral_constant<int, 4>{});
      break;
    case 8:
      reg(std::integral_constant<int, 8>{});
      break;
    default:
      looped();
  }
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
  const unsigned grid = static_cast<unsigned>(p.m);
  dispatch_pieces(
      reg_pieces(p.n, {{p.x, p.x_stride}, {p.out, p.out_stride}, {p.weight, 0}}),
      [&](auto v) {
        launch_kernel("rms_norm_reg", rms_norm_reg_kernel<decltype(v)::value>, grid, kRegThreads, 0, stream,
                      p);
      },
      [&] { launch_kernel("rms_norm", rms_norm_kernel, grid, kNormThreads, 0, stream, p); });
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
  const unsigned grid = static_cast<unsigned>(p.m);
  dispatch_pieces(
      reg_pieces(p.n, {{p.h, p.h_stride}, {p.delta, p.delta_stride}, {p.out, p.out_stride}, {p.weight, 0}}),
      [&](auto v) {
        launch_kernel("add_rms_norm_reg", add_rms_norm_reg_kernel<decltype(v)::value>, grid, kRegThreads, 0,
                      stream, p);
      },
      [&] { launch_kernel("add_rms_norm", add_rms_norm_kernel, grid, kNormThreads, 0, stream, p); });
}

void layer_norm(const LayerNormParams& p, cudaStream_t stream) {
  check_rows(p.m, p.n, "layer_norm");
  check_matrix(p.x, p.m, p.n, p.x_stride, "layer_norm", "x");
  check_matrix(p.out, p.m, p.n, p.out_stride, "layer_norm", "out");
  if (p.m == 0 || p.n == 0) return;
  MS_CHECK(p.weight != nullptr, "layer_norm: weight is null");
  MS_CHECK(p.x != p.out || p.x_stride == p.out_stride, "layer_norm: out aliases x with another row stride");
  launch_kernel("layer_norm", layer_norm_kernel, static_cast<unsigned>(p.m), kNormThreads, 0, stream, p);
}

}  // namespace ms::cuda
