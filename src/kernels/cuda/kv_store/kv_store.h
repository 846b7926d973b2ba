// Writes new KV rows into one layer of a paged cache on the device, converting to the cache's format with
// the CPU codec's exact rounding (kernels/cpu/paged_cache.h cache_write): f32 copy, bf16 round to nearest
// even, fp8 e4m3 round to nearest even of x * (1 / scale), saturating at +-448.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda {

enum class KvCacheFormat : uint8_t { F32, BF16, FP8E4M3 };

struct KvStoreParams {
  const float* __restrict__ x = nullptr;  // [m, width] rows x_stride apart
  int64_t x_stride = 0;
  // [m] on the device: page * page_size + offset. A slot < 0 (padding rows of a captured batch) or past the
  // cache's last slot is skipped: nothing is written for that row.
  const int64_t* __restrict__ slots = nullptr;
  int64_t m = 0;
  void* __restrict__ cache = nullptr;  // [num_pages, page_size, width] in `format`, packed
  KvCacheFormat format = KvCacheFormat::BF16;
  float scale = 1.0f;  // FP8E4M3: stored value = e4m3 * scale
  int64_t num_pages = 0, page_size = 0, width = 0;
};
void kv_store(const KvStoreParams& p, cudaStream_t stream);

}  // namespace ms::cuda
