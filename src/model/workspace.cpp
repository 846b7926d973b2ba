#include "model/workspace.h"

#include <algorithm>

#include "core/error.h"
#include "ops/attention.h"

namespace ms::model {

Workspace Workspace::make(const io::ModelConfig& c, const WorkspaceLimits& lim, Device device,
                          const TensorAlloc& alloc) {
  MS_CHECK(lim.max_tokens > 0 && lim.max_seqs > 0 && lim.max_context > 0,
           "workspace: max tokens ({}), sequences ({}) and context ({}) must be positive", lim.max_tokens,
           lim.max_seqs, lim.max_context);
  Workspace w;
  w.limits = lim;
  if (w.limits.max_logit_rows <= 0) w.limits.max_logit_rows = lim.max_seqs;
  w.device = device;
  const int64_t T = lim.max_tokens, H = c.hidden_size, Hn = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  auto f32 = [&](int64_t cols) { return alloc({T, cols}, DType::F32); };
  w.h = f32(H);
  w.xn = f32(H);
  if (c.q_lora_rank) w.qa = f32(*c.q_lora_rank);
  w.q = f32(Hn * (dn + dr));
  w.kv = f32(r + dr);
  // The output of a fused q_a / kv_a / wk product (AttentionWeights::qkv_a), which only the GPU upload makes.
  if (c.q_lora_rank && device == Device::CUDA)
    w.qkv = f32(*c.q_lora_rank + r + dr + (c.has_indexer ? c.index_head_dim : 0));
  if (c.has_indexer) {
    w.iq = f32(static_cast<int64_t>(c.index_n_heads) * c.index_head_dim);
    w.ik = f32(c.index_head_dim);
    w.iw = f32(c.index_n_heads);
    w.topk = alloc({T, c.index_topk}, DType::I32);
  }
  w.q_cat = alloc({T, Hn, r + dr}, DType::F32);
  w.lat = alloc({T, Hn, r}, DType::F32);
  w.o = f32(Hn * dv);
  w.attn_out = f32(H);
  w.ffn = f32(H);
  const int64_t shared_inter = c.moe_intermediate_size * std::max(c.n_shared_experts, 0);
  const int64_t inter = std::max<int64_t>(c.intermediate_size, shared_inter);
  if (shared_inter > 0) w.shared = f32(H);
  w.gate_up = f32(2 * inter);
  w.act = f32(inter);
  const int E = c.n_routed_experts, K = c.num_experts_per_tok;
  if (E > 0) {
    w.router_logits = f32(E);
    w.topk_ids = alloc({T, K}, DType::I32);
    w.topk_weights = alloc({T, K}, DType::F32);
    if (shared_inter > 0) {  // the router's choice plus the shared expert (ModelOptions::fuse_shared_expert)
      w.topk_ids_ext = alloc({T, K + 1}, DType::I32);
      w.topk_weights_ext = alloc({T, K + 1}, DType::F32);
    }
    w.plain_ids = alloc({T, K}, DType::I32);
    w.local_ids = alloc({T, K}, DType::I32);
    // With the shared expert fused (ModelOptions::fuse_shared_expert) the op sees K + 1 slots of E + 1
    // experts.
    const int fused = shared_inter > 0 ? 1 : 0;
    w.moe = ops::MoeScratch::make(alloc, T, K + fused, E + fused, H, c.moe_intermediate_size);
    w.route = moe::RouteScratch::make(alloc, T, E, K);
    w.host_ids.resize(static_cast<size_t>(T * K));
    w.host_plain_ids.resize(static_cast<size_t>(T * K));
    w.host_dec.reserve(static_cast<size_t>(T * K));
    w.host_mask.resize(static_cast<size_t>(T));
  }
  w.last = alloc({w.limits.max_logit_rows, H}, DType::F32);
  w.logits = alloc({w.limits.max_logit_rows, c.vocab_size}, DType::F32);
  // Attention reads every visible key (max_context) or the DSA selection (index_topk) per query.
  const int64_t attn_keys = std::max<int64_t>(lim.max_context, c.has_indexer ? c.index_topk : 0);
  w.attn_scratch = alloc({ops::mla_attention_scratch_floats(device, Hn, attn_keys, r + dr)}, DType::F32);
  if (c.has_indexer)
    w.indexer_scratch =
        alloc({ops::dsa_indexer_scratch_floats(device, lim.max_context, c.index_head_dim)}, DType::F32);
  if (lim.debug_pool_floats > 0) w.pool_cast = alloc({lim.debug_pool_floats}, DType::F32);
  return w;
}

size_t Workspace::bytes() const {
  size_t b = 0;
  for (const Tensor* t : {&h,
                          &xn,
                          &qa,
                          &q,
                          &kv,
                          &qkv,
                          &iq,
                          &ik,
                          &iw,
                          &topk,
                          &q_cat,
                          &lat,
                          &o,
                          &attn_out,
                          &ffn,
                          &shared,
                          &gate_up,
                          &act,
                          &router_logits,
                          &topk_ids,
                          &topk_weights,
                          &topk_ids_ext,
                          &topk_weights_ext,
                          &plain_ids,
                          &local_ids,
                          &last,
                          &logits,
                          &attn_scratch,
                          &indexer_scratch,
                          &pool_cast,
                          &moe.offsets,
                          &moe.cursor,
                          &moe.order,
                          &moe.x,
                          &moe.gate_up,
                          &moe.act,
                          &moe.y,
                          &route.decode_rows,
                          &route.decode_logits,
                          &route.decode_ids,
                          &route.decode_weights})
    if (t->raw() != nullptr) b += t->nbytes();
  return b;
}

}  // namespace ms::model
