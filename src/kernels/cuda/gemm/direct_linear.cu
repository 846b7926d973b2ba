// Shared-memory tiled GEMM: a block owns a [kBM rows of x] x [kBN weight rows] output tile and walks k in
// kBK steps. Each step stages the x tile and the dequantised weight tile (f32) in shared memory, both loaded
// along k so consecutive threads read consecutive addresses; each thread then accumulates 1 x 4 outputs.
// Rows are padded by one float so the inner loop's reads hit distinct banks.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/weight_decode.cuh"
#include "kernels/cuda/gemm/direct_linear.h"

namespace ms::cuda {
namespace {

constexpr int kBM = 16, kBN = 64, kBK = 64, kThreads = 256;
constexpr int kTN = kBN * kBM / kThreads;  // outputs per thread (4), weight rows tx + 16 j
static_assert(kThreads == kBM * (kBN / kTN), "one thread per (row, column group)");

template <WeightFormat F>
__global__ void __launch_bounds__(kThreads) direct_linear_kernel(DirectLinearParams p) {
  __shared__ float xs[kBM][kBK + 1];
  __shared__ float ws[kBN][kBK + 1];
  const int tid = threadIdx.x, ty = tid / (kBN / kTN), tx = tid % (kBN / kTN);
  const int64_t row_base = static_cast<int64_t>(blockIdx.y) * kBM;  // rows of x
  const int64_t col_base = static_cast<int64_t>(blockIdx.x) * kBN;  // outputs (weight rows - row0)
  const int64_t k = p.w.cols;
  float acc[kTN] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
    for (int i = tid; i < kBM * kBK; i += kThreads) {
      const int r = i / kBK, c = i % kBK;
      const int64_t gr = row_base + r, gc = k0 + c;
      xs[r][c] = (gr < p.m && gc < k) ? p.x[gr * p.x_stride + gc] : 0.0f;
    }
    for (int i = tid; i < kBN * kBK; i += kThreads) {
      const int r = i / kBK, c = i % kBK;
      const int64_t j = col_base + r, gc = k0 + c;
      ws[r][c] = (j < p.n && gc < k) ? dev::weight_at<F>(p.w, p.row0 + j, gc) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; ++kk) {
      const float a = xs[ty][kk];
#pragma unroll
      for (int t = 0; t < kTN; ++t) acc[t] += a * ws[tx + t * (kBN / kTN)][kk];
    }
    __syncthreads();
  }
  const int64_t row = row_base + ty;
  if (row >= p.m) return;
#pragma unroll
  for (int t = 0; t < kTN; ++t) {
    const int64_t j = col_base + tx + t * (kBN / kTN);
    if (j < p.n) p.y[row * p.y_stride + j] = acc[t];
  }
}

}  // namespace

void direct_linear(const DirectLinearParams& p, cudaStream_t stream) {
  check_weight(p.w, "direct_linear");
  MS_CHECK(p.row0 >= 0 && p.n >= 0 && p.row0 + p.n <= p.w.rows,
           "direct_linear: rows [{}, {}) outside the weight's {} rows", p.row0, p.row0 + p.n, p.w.rows);
  check_matrix(p.x, p.m, p.w.cols, p.x_stride, "direct_linear", "x");
  check_matrix(p.y, p.m, p.n, p.y_stride, "direct_linear", "y");
  if (p.m == 0 || p.n == 0) return;
  const int64_t gy = (p.m + kBM - 1) / kBM, gx = (p.n + kBN - 1) / kBN;
  MS_CHECK(gy <= 65535, "direct_linear: m = {} exceeds the {} rows one launch covers", p.m, 65535 * kBM);
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  switch (p.w.format) {
    case WeightFormat::F32:
      direct_linear_kernel<WeightFormat::F32><<<grid, kThreads, 0, stream>>>(p);
      break;
    case WeightFormat::BF16:
      direct_linear_kernel<WeightFormat::BF16><<<grid, kThreads, 0, stream>>>(p);
      break;
    case WeightFormat::FP8Block:
      direct_linear_kernel<WeightFormat::FP8Block><<<grid, kThreads, 0, stream>>>(p);
      break;
    case WeightFormat::NVFP4:
      direct_linear_kernel<WeightFormat::NVFP4><<<grid, kThreads, 0, stream>>>(p);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ms::cuda
