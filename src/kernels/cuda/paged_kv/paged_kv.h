// One layer of a paged cache and the per-step attention metadata as CUDA kernels read them: rows of `width`
// values per token slot (slot = page * page_size + offset) in f32, bf16 or fp8 e4m3 with one scale, read in
// place one value at a time (the pool is never converted). Mirrors kernels/cpu/paged_cache.h.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda {

enum class KvFormat : uint8_t { F32, BF16, FP8E4M3 };

inline const char* kv_format_name(KvFormat f) {
  return f == KvFormat::F32 ? "f32" : f == KvFormat::BF16 ? "bf16" : "fp8_e4m3";
}
inline int kv_format_bytes(KvFormat f) {
  return f == KvFormat::F32 ? 4 : f == KvFormat::BF16 ? 2 : 1;
}

struct PagedKvLayer {
  const void* __restrict__ data = nullptr;  // [num_pages, page_size, width] in `format`
  KvFormat format = KvFormat::BF16;
  float scale = 1.0f;  // FP8E4M3: value = e4m3 * scale
  int num_pages = 0, page_size = 0, width = 0;
};

// Per-step metadata on the device (from the ForwardBatch). Token i attends to positions 0..positions[i] of
// sequence token_seq[i] (or to its DSA selection); block_table maps a sequence's position / page_size to a
// page.
struct AttentionMetaDevice {
  const int32_t* __restrict__ token_seq = nullptr;    // [m] batch sequence of each token
  const int32_t* __restrict__ positions = nullptr;    // [m] position of each token in its sequence
  const int32_t* __restrict__ block_table = nullptr;  // [n_seqs, max_blocks] page ids, -1 past the end
  int max_blocks = 0;
  const int32_t* __restrict__ seq_lens =
      nullptr;  // [n_seqs] context length after this step (fast decode only)
  int n_seqs = 0;
};

#ifdef __CUDACC__
// Value c of row `slot` as f32, exactly as kernels/cpu cache_read_row decodes it.
__device__ __forceinline__ float kv_read(const PagedKvLayer& kv, int64_t slot, int c) {
  const int64_t i = slot * kv.width + c;
  switch (kv.format) {
    case KvFormat::F32:
      return static_cast<const float*>(kv.data)[i];
    case KvFormat::BF16:
      return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(kv.data)[i]) << 16);
    default: {
      const __half_raw h =
          __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(kv.data)[i], __NV_E4M3);
      return __half2float(__half(h)) * kv.scale;
    }
  }
}

// Slot of position `pos` of sequence `seq`, or -1 when the block table has no page for it. A page id outside
// the pool is clamped: a bad table reads a wrong page, never out of bounds.
__device__ __forceinline__ int64_t kv_slot(const PagedKvLayer& kv, const AttentionMetaDevice& meta, int seq,
                                           int pos) {
  const int blk = pos / kv.page_size;
  if (pos < 0 || blk >= meta.max_blocks) return -1;
  const int page =
      min(max(meta.block_table[static_cast<int64_t>(seq) * meta.max_blocks + blk], 0), kv.num_pages - 1);
  return static_cast<int64_t>(page) * kv.page_size + pos % kv.page_size;
}
#endif

}  // namespace ms::cuda
