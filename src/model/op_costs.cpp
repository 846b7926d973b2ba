#include "model/op_costs.h"

#include <algorithm>
#include <vector>

namespace ms::model::costs {

StepShape StepShape::of(const kv::ForwardBatch& b) {
  StepShape s;
  s.m = b.n_tokens();
  s.n_seqs = b.n_seqs();
  for (int32_t p : b.positions) s.keys_total += p + 1;
  for (int32_t l : b.seq_lens) s.ctx_total += l;
  s.batch = &b;
  return s;
}

profiler::OpCost linear(const ops::LinearWeight& w, int64_t m) {
  const double md = static_cast<double>(m);
  profiler::OpCost c;
  c.bytes_floor = w.bytes() + 4.0 * md * static_cast<double>(w.in + w.out);
  c.bytes_moved = c.bytes_floor;
  c.flops = 2.0 * md * static_cast<double>(w.in) * static_cast<double>(w.out);
  return c;
}

profiler::OpCost sum(profiler::OpCost a, const profiler::OpCost& b) {
  a.bytes_floor += b.bytes_floor;
  a.bytes_moved += b.bytes_moved;
  a.flops += b.flops;
  return a;
}

profiler::OpCost elementwise(double n, double reads, double writes, double flops_per, double extra) {
  const double bytes = 4.0 * n * (reads + writes) + extra;
  return {bytes, bytes, flops_per * n};
}

profiler::OpCost rms_norm(int64_t m, int64_t n) {
  return elementwise(static_cast<double>(m * n), 1, 1, 3, 4.0 * static_cast<double>(n));
}

profiler::OpCost add_rms_norm(int64_t m, int64_t n) {
  return sum(elementwise(static_cast<double>(m * n), 2, 1, 1), rms_norm(m, n));
}

profiler::OpCost embed(const ops::LinearWeight& table, int64_t m, int64_t hidden) {
  const double row = table.bytes() / static_cast<double>(table.out);  // one table row, stored
  const double b = static_cast<double>(m) * (row + 4.0 * static_cast<double>(hidden));
  return {b, b, 0};
}

profiler::OpCost silu_mul(int64_t m, int64_t inter) {
  const double n = static_cast<double>(m * inter);
  return {12.0 * n, 12.0 * n, 4.0 * n};
}

profiler::OpCost attn_rope(const io::ModelConfig& c, int64_t m) {
  const int64_t r = c.kv_lora_rank, dr = c.qk_rope_head_dim, Hn = c.num_attention_heads;
  return sum(elementwise(static_cast<double>(m * r), 1, 1, 3, 4.0 * static_cast<double>(r)),
             elementwise(static_cast<double>(m * (Hn + 1) * dr), 1, 1, 6));
}

profiler::OpCost kv_store(const io::ModelConfig& c, int64_t m, double cache_elem_bytes) {
  const double w = static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim);
  const double b = static_cast<double>(m) * (4.0 * w + w * cache_elem_bytes);
  return {b, b, 0};
}

profiler::OpCost debug_pool_cast(const io::ModelConfig& c, int64_t ctx_rows, int64_t pool_slots,
                                 double cache_elem_bytes) {
  // What the step needs is the rows of its own sequences; what the planted cast moves is the whole pool.
  const double per_row = static_cast<double>(c.kv_cache_width()) * (cache_elem_bytes + 4.0);
  return {static_cast<double>(ctx_rows) * per_row, static_cast<double>(pool_slots) * per_row, 0};
}

profiler::OpCost indexer_k_norm_rope(const io::ModelConfig& c, int64_t m, double key_elem_bytes) {
  // LayerNorm of the key, rope of Hi query heads and the key (in place), weights scaled, the key stored.
  const double md = static_cast<double>(m), Hi = c.index_n_heads, Di = c.index_head_dim;
  const double key_bytes = Di * key_elem_bytes;
  const double bytes =
      8.0 * md * Di + 8.0 * Di + 8.0 * md * Di * (Hi + 1) + 8.0 * md * Hi + md * (4.0 * Di + key_bytes);
  return {bytes, bytes, 8.0 * md * Di + 6.0 * md * Di * (Hi + 1)};
}

profiler::OpCost indexer_topk(const io::ModelConfig& c, const StepShape& s, double key_elem_bytes) {
  // Every key of each sequence once (floor), each token's visible keys (moved: a prefill chunk re-reads its
  // sequence's keys per token); q, head weights in, the selection out.
  const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
  const double key_bytes = static_cast<double>(Di) * key_elem_bytes;
  const double act = 4.0 * static_cast<double>(s.m) * static_cast<double>(Hi * Di + Hi + c.index_topk);
  return {static_cast<double>(s.ctx_total) * key_bytes + act,
          static_cast<double>(s.keys_total) * key_bytes + act,
          2.0 * static_cast<double>(s.keys_total) * static_cast<double>(Hi) * static_cast<double>(Di)};
}

profiler::OpCost absorb_q(const io::ModelConfig& c, const ops::LinearWeight& kv_b, int64_t m) {
  // The W_UK rows of kv_b_proj (dn of every dn + dv per head); q in, q_cat out.
  const int64_t Hn = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim,
                dv = c.v_head_dim, r = c.kv_lora_rank;
  const double bytes = kv_b.bytes() * static_cast<double>(dn) / static_cast<double>(dn + dv) +
                       4.0 * m * Hn * (dn + dr) + 4.0 * m * Hn * (r + dr);
  return {bytes, bytes, 2.0 * m * Hn * dn * r};
}

profiler::OpCost mla(const io::ModelConfig& c, const StepShape& s, double cache_elem_bytes) {
  // Rows read per token: its visible keys, or its DSA selection. Floor: each needed row once per sequence
  // (with DSA at most the sequence's tokens x index_topk); moved: once per token (a prefill chunk re-reads
  // its sequence's rows for every token).
  const int64_t Hn = c.num_attention_heads, dr = c.qk_rope_head_dim, r = c.kv_lora_rank, m = s.m;
  const double row_bytes = static_cast<double>(r + dr) * cache_elem_bytes;
  const kv::ForwardBatch& b = *s.batch;
  double keys = 0, rows = 0;
  if (c.has_indexer) {
    for (int32_t p : b.positions) keys += static_cast<double>(std::min<int64_t>(c.index_topk, p + 1));
    std::vector<int64_t> per_seq(b.seq_lens.size(), 0);
    for (int32_t q : b.token_seq) per_seq[static_cast<size_t>(q)] += c.index_topk;
    for (size_t i = 0; i < per_seq.size(); ++i)
      rows += static_cast<double>(std::min<int64_t>(per_seq[i], b.seq_lens[i]));
  } else {
    keys = static_cast<double>(s.keys_total);
    rows = static_cast<double>(s.ctx_total);
  }
  const double act = 4.0 * m * Hn * (2 * r + dr);
  return {rows * row_bytes + act, keys * row_bytes + act, 2.0 * keys * Hn * (2 * r + dr)};
}

profiler::OpCost out_v(const io::ModelConfig& c, const ops::LinearWeight& kv_b, int64_t m) {
  // The W_UV rows of kv_b_proj; latent in, per-head values out.
  const int64_t Hn = c.num_attention_heads, dn = c.qk_nope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const double bytes = kv_b.bytes() * static_cast<double>(dv) / static_cast<double>(dn + dv) +
                       4.0 * m * Hn * r + 4.0 * m * Hn * dv;
  return {bytes, bytes, 2.0 * m * Hn * r * dv};
}

profiler::OpCost route(const io::ModelConfig& c, int64_t m) {
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  return {4.0 * m * E + 8.0 * m * K, 4.0 * m * E + 8.0 * m * K, 4.0 * m * E};
}

profiler::OpCost moe_experts(const io::ModelConfig& c, std::span<const ops::ExpertWeights> experts, int64_t m,
                             int distinct, int slots_per_token) {
  const ops::ExpertWeights& e0 = experts.front();
  const double per_expert = e0.gate.bytes() + e0.up.bytes() + e0.down.bytes();
  const double H = static_cast<double>(c.hidden_size);
  const double slots = static_cast<double>(m) * slots_per_token;
  // Floor: the weights of the experts routed to (not all E), x read, out read and written. Moved: each
  // (token, expert) slot gathers its row, writes its result and adds it into out.
  return {distinct * per_expert + 12.0 * m * H, distinct * per_expert + 20.0 * slots * H,
          slots * 6.0 * H * static_cast<double>(c.moe_intermediate_size)};
}

}  // namespace ms::model::costs
