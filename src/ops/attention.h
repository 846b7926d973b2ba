// MLA (absorbed) and DSA indexer ops over one layer of a paged cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/linear_weight.h"

namespace ms::ops {

// One layer of a paged cache: rows of `width` values per slot (page * page_size + offset).
struct PagedCacheLayer {
  Tensor data;         // [num_pages, page_size, width] f32, bf16 or fp8_e4m3
  float scale = 1.0f;  // fp8: value = e4m3 * scale
};

// Per-step attention metadata (from the ForwardBatch).
struct AttentionMeta {
  std::span<const int32_t> token_seq;    // [m] batch sequence of each token
  std::span<const int32_t> positions;    // [m]
  std::span<const int64_t> slots;        // [m] cache slot each token's key is written to
  std::span<const int32_t> block_table;  // [n_seqs, max_blocks]
  int64_t max_blocks = 0;
  int32_t max_position = 0;  // over the batch
};

// Stores rows x [m, width] into the cache at meta.slots (converting to the cache dtype).
void cache_write(const Tensor& x, const PagedCacheLayer& cache, const AttentionMeta& meta);

// q [m, heads, nope + rope] (rope part rotated) -> q_cat [m, heads, kv_lora_rank + rope].
void mla_absorb_q(const Tensor& q, const LinearWeight& kv_b, int64_t nope, int64_t v, const Tensor& q_cat);

// lat [m, heads, kv_lora_rank] = softmax(scale * q_cat . kv_j) kv_j[:kv_lora_rank] over the visible keys (all
// positions 0..pos, or the DSA selection topk [m, topk_width] when defined). `scratch` grows, never shrinks.
void mla_attention(const Tensor& q_cat, const PagedCacheLayer& cache, const AttentionMeta& meta,
                   const Tensor& topk, float softmax_scale, const Tensor& lat, std::vector<float>& scratch);

// out [m, heads * v] = per-head W_UV lat.
void mla_out_v(const Tensor& lat, const LinearWeight& kv_b, int64_t nope, int64_t v, const Tensor& out);

// DSA selection: q [m, heads, dim] rotated, w [m, heads], keys cache of width dim -> topk i32 [m, topk].
void dsa_indexer(const Tensor& q, const Tensor& w, const PagedCacheLayer& keys, const AttentionMeta& meta,
                 float softmax_scale, const Tensor& topk, std::vector<float>& scratch);

}  // namespace ms::ops
