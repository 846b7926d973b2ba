// A view of one layer of a paged cache as kernels read it: rows of `width` values per token slot, slot =
// page * page_size + offset, stored as f32, bf16 or fp8 e4m3 with one scale. Kernels decode one row at a time
// into registers / a row buffer; the pool itself is never converted or copied.
#pragma once

#include <cstdint>

namespace ms::kernels::cpu {

enum class CacheFormat : uint8_t { F32, BF16, FP8E4M3 };

struct PagedCacheView {
  void* data = nullptr;  // [num_pages, page_size, width] in `format`
  CacheFormat format = CacheFormat::BF16;
  float scale = 1.0f;  // FP8E4M3: value = e4m3 * scale
  // F32 only, >= 0: writes round each row as a per-token fp8 format would store it (the first width - rope
  // values in tiles of 128, each e4m3 with scale amax / 448; the last `rope` values bf16); reads are plain.
  int64_t fp8_tile_sim_rope = -1;
  int64_t num_pages = 0, page_size = 0, width = 0;
};

// Where token `pos` of sequence `seq` lives: block_table [n_seqs, max_blocks] of page ids.
inline int64_t cache_slot(const int32_t* block_table, int64_t max_blocks, int64_t seq, int64_t pos,
                          int64_t page_size) {
  return static_cast<int64_t>(block_table[seq * max_blocks + pos / page_size]) * page_size + pos % page_size;
}

// out[0..width) = row `slot` as f32.
void cache_read_row(const PagedCacheView& c, int64_t slot, float* out);

// Writes rows x [m, width] (rows x_stride apart) into slots[m], converting to the cache format (fp8:
// round-to-nearest-even of x / scale, saturating at +-448).
struct CacheWriteParams {
  PagedCacheView cache;
  const float* __restrict__ x = nullptr;  // [m, width]
  int64_t x_stride = 0;
  const int64_t* __restrict__ slots = nullptr;  // [m]
  int64_t m = 0;
};
void cache_write(const CacheWriteParams& p);

// One row through the tiled fp8 format: out[0..width) = what it decodes to (see fp8_tile_sim_rope).
void fp8_tile128_round_row(const float* x, int64_t width, int64_t rope, float* out);

}  // namespace ms::kernels::cpu
