// MLA (absorbed) and DSA indexer ops over one layer of a paged cache.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/ctx.h"
#include "ops/linear_weight.h"

namespace ms::ops {

// One layer of a paged cache: rows of `width` values per slot (page * page_size + offset).
struct PagedCacheLayer {
  Tensor data;         // [num_pages, page_size, width] f32, bf16 or fp8_e4m3
  float scale = 1.0f;  // fp8: value = e4m3 * scale
  // >= 0: f32 pages holding values as a per-token, per-128-tile fp8 format would decode them, the last
  // fp8_tile_sim_rope values of a row as bf16 (kv::KvCacheDType::FP8E4M3Tile128Sim); CPU only.
  int64_t fp8_tile_sim_rope = -1;
};

// Per-step attention metadata: tensors on the op's device (filled once per step by the executor, at fixed
// addresses on CUDA so a captured graph can be replayed), plus the host scalars that shapes and scratch sizes
// need.
struct AttentionMeta {
  Tensor token_seq;    // i32 [m] batch sequence of each token
  Tensor positions;    // i32 [m]
  Tensor slots;        // i64 [m] cache slot each token's key is written to
  Tensor block_table;  // i32 [n_seqs, max_blocks], -1 past a sequence's pages
  Tensor seq_lens;     // i32 [n_seqs] context length after this step
  int64_t m = 0, n_seqs = 0, max_blocks = 0;
  int32_t max_position = 0;  // over the batch
  // Keys a query may see at most: the executor's context capacity (the same in every captured graph), above
  // every position; the GPU indexer sizes its score rows by it.
  int64_t max_keys = 0;
};

// Stores rows x [m, width] into the cache at meta.slots (converting to the cache dtype).
void cache_write(const Ctx& ctx, const Tensor& x, const PagedCacheLayer& cache, const AttentionMeta& meta);

// q [m, heads, nope + rope] (rope part rotated) -> q_cat [m, heads, kv_lora_rank + rope].
void mla_absorb_q(const Ctx& ctx, const Tensor& q, const LinearWeight& kv_b, int64_t nope, int64_t v,
                  const Tensor& q_cat);

// Scratch floats mla_attention needs on `device` for up to max_keys keys per token (a workspace sizes it once
// with its worst case; on the CPU it grows with the OpenMP thread count).
int64_t mla_attention_scratch_floats(Device device, int64_t heads, int64_t max_keys, int64_t width);
// lat [m, heads, kv_lora_rank] = softmax(scale * q_cat . kv_j) kv_j[:kv_lora_rank] over the visible keys (all
// positions 0..pos, or the DSA selection topk [m, topk_width] when defined). scratch: f32 [>= the size
// above]. topk_compact: the selection is what dsa_indexer writes (ascending positions, -1 only at the tail,
// at most positions[i] + 1 entries), so a device kernel may stop at a token's first positions[i] + 1 entries.
void mla_attention(const Ctx& ctx, const Tensor& q_cat, const PagedCacheLayer& cache,
                   const AttentionMeta& meta, const Tensor& topk, float softmax_scale, const Tensor& lat,
                   const Tensor& scratch, bool topk_compact = false);

// out [m, heads * v] = per-head W_UV lat.
void mla_out_v(const Ctx& ctx, const Tensor& lat, const LinearWeight& kv_b, int64_t nope, int64_t v,
               const Tensor& out);

int64_t dsa_indexer_scratch_floats(Device device, int64_t max_keys, int64_t dim);
// DSA selection: q [m, heads, dim] rotated, w [m, heads], keys cache of width dim -> topk i32 [m, topk].
// scratch: f32 [>= dsa_indexer_scratch_floats].
void dsa_indexer(const Ctx& ctx, const Tensor& q, const Tensor& w, const PagedCacheLayer& keys,
                 const AttentionMeta& meta, float softmax_scale, const Tensor& topk, const Tensor& scratch);

// The planted whole-pool cast (model option debug_cast_whole_pool): every slot of the cache cast to f32 into
// out [>= slots * width]. Needless work on purpose, for the profiler's test.
void debug_pool_cast(const Ctx& ctx, const PagedCacheLayer& cache, const Tensor& out);

}  // namespace ms::ops
