// Multi-head latent attention in the absorbed form. Per query token and head:
//   q_cat = [q_nope W_UK_h (kv_lora_rank), q_pe (rope dim, rotated)]        (mla_absorb_q)
//   p_j   = softmax_j(scale * q_cat . kv_j) over the token's keys j          (mla_attention)
//   lat   = sum_j p_j kv_j[:kv_lora_rank];  o_h = W_UV_h lat                 (mla_out_v)
// where kv_j is the 576-wide cached row (normalised latent, rotated k_pe) and W_UK_h / W_UV_h are head h's
// rows of kv_b_proj ([heads * (nope + v), kv_lora_rank]: nope rows first, then v rows, per head).
#pragma once

#include <cstdint>

#include "kernels/cpu/paged_cache.h"
#include "kernels/cpu/weight_view.h"

namespace ms::kernels::cpu {

struct MlaAbsorbQParams {
  const float* __restrict__ q = nullptr;  // [m, heads, nope + rope] from q_b_proj (nope first), rope rotated
  WeightView kv_b;                        // [heads * (nope + v), kv_lora_rank]
  float* __restrict__ q_cat = nullptr;    // [m, heads, kv_lora_rank + rope]
  int64_t m = 0, heads = 0, nope = 0, rope = 0, v = 0, kv_lora_rank = 0;
};
void mla_absorb_q(const MlaAbsorbQParams& p);

struct MlaAttentionParams {
  const float* __restrict__ q_cat = nullptr;  // [m, heads, width] width = kv_lora_rank + rope
  PagedCacheView kv;                          // [pages, page_size, width]
  float* __restrict__ lat = nullptr;          // [m, heads, kv_lora_rank] out
  int64_t m = 0, heads = 0, kv_lora_rank = 0;
  const int32_t* __restrict__ token_seq = nullptr;    // [m] batch sequence of each token
  const int32_t* __restrict__ positions = nullptr;    // [m] keys 0..position are visible (causal)
  const int32_t* __restrict__ block_table = nullptr;  // [n_seqs, max_blocks]
  int64_t max_blocks = 0;
  // DSA: [m, topk_width] selected key positions (-1 = empty slot), or null for dense causal attention.
  const int32_t* __restrict__ topk = nullptr;
  int64_t topk_width = 0;
  float softmax_scale = 1.0f;
  // Caller-owned scratch of mla_attention_scratch_floats(...) floats: the kernel allocates nothing.
  float* __restrict__ scratch = nullptr;
  int64_t max_keys = 0;  // upper bound on keys per token (max position + 1, or topk_width)
};
int64_t mla_attention_scratch_floats(int64_t heads, int64_t max_keys, int64_t width, int threads);
void mla_attention(const MlaAttentionParams& p);

struct MlaOutVParams {
  const float* __restrict__ lat = nullptr;  // [m, heads, kv_lora_rank]
  WeightView kv_b;                          // [heads * (nope + v), kv_lora_rank]
  float* __restrict__ out = nullptr;        // [m, heads * v]
  int64_t m = 0, heads = 0, nope = 0, v = 0, kv_lora_rank = 0;
};
void mla_out_v(const MlaOutVParams& p);

}  // namespace ms::kernels::cpu
