// blockIdx.y walks weight rows, x-threads walk columns: coalesced reads of the stored row and writes of the
// scratch row.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/weight_decode.cuh"
#include "kernels/cuda/gemm/dequant_weight.h"

namespace ms::cuda {
namespace {

template <WeightFormat F, bool kBf16>
__global__ void dequant_weight_kernel(DequantWeightParams p) {
  const int64_t k = p.w.cols;
  for (int64_t r = blockIdx.y; r < p.n; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < k;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const float v = dev::weight_at<F>(p.w, p.row0 + r, c);
      if constexpr (kBf16)
        reinterpret_cast<uint16_t*>(p.out_bf16)[r * p.out_stride + c] = dev::f32_to_bf16_bits(v);
      else
        p.out_f32[r * p.out_stride + c] = v;
    }
  }
}

template <WeightFormat F>
void launch(const DequantWeightParams& p, cudaStream_t stream) {
  const dim3 grid = rows_grid(p.n, p.w.cols);
  if (p.out_bf16)
    dequant_weight_kernel<F, true><<<grid, kElementwiseThreads, 0, stream>>>(p);
  else
    dequant_weight_kernel<F, false><<<grid, kElementwiseThreads, 0, stream>>>(p);
}

}  // namespace

void dequant_weight(const DequantWeightParams& p, cudaStream_t stream) {
  check_weight(p.w, "dequant_weight");
  MS_CHECK(p.row0 >= 0 && p.n >= 0 && p.row0 + p.n <= p.w.rows,
           "dequant_weight: rows [{}, {}) outside the weight's {} rows", p.row0, p.row0 + p.n, p.w.rows);
  MS_CHECK((p.out_bf16 == nullptr) != (p.out_f32 == nullptr),
           "dequant_weight: exactly one of out_bf16 and out_f32 must be set");
  check_matrix(p.out_bf16 ? static_cast<const void*>(p.out_bf16) : p.out_f32, p.n, p.w.cols, p.out_stride,
               "dequant_weight", "out");
  if (p.n == 0) return;
  switch (p.w.format) {
    case WeightFormat::F32:
      launch<WeightFormat::F32>(p, stream);
      break;
    case WeightFormat::BF16:
      launch<WeightFormat::BF16>(p, stream);
      break;
    case WeightFormat::FP8Block:
      launch<WeightFormat::FP8Block>(p, stream);
      break;
    case WeightFormat::NVFP4:
      launch<WeightFormat::NVFP4>(p, stream);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ms::cuda
