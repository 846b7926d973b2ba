#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/common/weight_decode.cuh"
#include "kernels/cuda/elementwise/embedding.h"

namespace ms::cuda {
namespace {

constexpr int64_t kEmbedSlice = 1024;  // columns of one block (4 per thread)

// One block per output row; threads stride over the hidden size (coalesced on table and out).
template <WeightFormat F>
__global__ void embedding_kernel(EmbeddingParams p) {
  dev::grid_dep_enter();
  // blockIdx.y: a slice of kEmbedSlice columns, so that one token's row is spread over several blocks.
  const int64_t i = blockIdx.x;
  const int64_t id = p.ids[i];
  float* out = p.out + i * p.out_stride;
  const int64_t hidden = p.table.cols;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kEmbedSlice;
  const int64_t c1 = c0 + kEmbedSlice < hidden ? c0 + kEmbedSlice : hidden;
  if (id < 0 || id >= p.table.rows) {
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) out[c] = __uint_as_float(0x7fc00000u);
    return;
  }
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) out[c] = dev::weight_at<F>(p.table, id, c);
}

}  // namespace

void embedding(const EmbeddingParams& p, cudaStream_t stream) {
  check_weight(p.table, "embedding table");
  MS_CHECK(p.table.format == WeightFormat::F32 || p.table.format == WeightFormat::BF16,
           "embedding: table format {} is not supported (f32 or bf16)", weight_format_name(p.table.format));
  MS_CHECK(p.m >= 0 && p.m <= 0x7fffffff, "embedding: m = {} out of range", p.m);
  check_matrix(p.out, p.m, p.table.cols, p.out_stride, "embedding", "out");
  if (p.m == 0) return;
  MS_CHECK(p.ids != nullptr, "embedding: ids is null");
  const dim3 grid(static_cast<unsigned>(p.m),
                  static_cast<unsigned>((p.table.cols + kEmbedSlice - 1) / kEmbedSlice));
  if (p.table.format == WeightFormat::F32)
    launch_kernel("embedding", embedding_kernel<WeightFormat::F32>, grid, kElementwiseThreads, 0, stream, p);
  else
    launch_kernel("embedding", embedding_kernel<WeightFormat::BF16>, grid, kElementwiseThreads, 0, stream, p);
}

}  // namespace ms::cuda
