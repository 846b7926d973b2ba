#include <cmath>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/float_codecs.cuh"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/kv_store/kv_store.h"

namespace ms::cuda {
namespace {

// blockIdx.y walks rows, x-threads walk the row's width. `inv_scale` is 1 / scale computed on the host in
// f32, as the CPU reference computes it.
template <KvCacheFormat F>
__global__ void kv_store_kernel(KvStoreParams p, float inv_scale) {
  dev::grid_dep_enter();
  const int64_t total_slots = p.num_pages * p.page_size;
  for (int64_t r = blockIdx.y; r < p.m; r += gridDim.y) {
    const int64_t slot = p.slots[r];
    if (slot < 0 || slot >= total_slots) continue;
    const float* x = p.x + r * p.x_stride;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.width;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      if constexpr (F == KvCacheFormat::F32) {
        static_cast<float*>(p.cache)[slot * p.width + c] = x[c];
      } else if constexpr (F == KvCacheFormat::BF16) {
        static_cast<uint16_t*>(p.cache)[slot * p.width + c] = dev::f32_to_bf16_bits(x[c]);
      } else {
        static_cast<uint8_t*>(p.cache)[slot * p.width + c] = dev::f32_to_fp8_e4m3_sat(x[c] * inv_scale);
      }
    }
  }
}

}  // namespace

void kv_store(const KvStoreParams& p, cudaStream_t stream) {
  check_matrix(p.x, p.m, p.width, p.x_stride, "kv_store", "x");
  MS_CHECK(p.num_pages >= 0 && p.page_size > 0 && p.width > 0,
           "kv_store: cache shape [num_pages = {}, page_size = {}, width = {}] is not valid", p.num_pages,
           p.page_size, p.width);
  if (p.m == 0) return;
  MS_CHECK(p.cache != nullptr || p.num_pages == 0, "kv_store: cache is null");
  MS_CHECK(p.slots != nullptr, "kv_store: slots is null");
  MS_CHECK(p.format != KvCacheFormat::FP8E4M3 || (std::isfinite(p.scale) && p.scale > 0.0f),
           "kv_store: fp8 cache scale {} must be positive and finite", p.scale);
  const float inv_scale = 1.0f / p.scale;
  const dim3 grid = rows_grid(p.m, p.width);
  switch (p.format) {
    case KvCacheFormat::F32:
      launch_kernel("kv_store", kv_store_kernel<KvCacheFormat::F32>, grid, kElementwiseThreads, 0, stream, p,
                    inv_scale);
      break;
    case KvCacheFormat::BF16:
      launch_kernel("kv_store", kv_store_kernel<KvCacheFormat::BF16>, grid, kElementwiseThreads, 0, stream, p,
                    inv_scale);
      break;
    case KvCacheFormat::FP8E4M3:
      launch_kernel("kv_store", kv_store_kernel<KvCacheFormat::FP8E4M3>, grid, kElementwiseThreads, 0, stream,
                    p, inv_scale);
      break;
    default:
      MS_THROW("kv_store: unknown cache format {}", static_cast<int>(p.format));
  }
}

}  // namespace ms::cuda
