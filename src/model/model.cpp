#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "moe/router.h"
#include "ops/attention.h"
#include "ops/ops.h"

namespace ms::model {

namespace {

constexpr float kLoraNormEps =
    1e-6f;  // q_a_layernorm, kv_a_layernorm, indexer k_norm: the modules' default eps

// A profiler scope whose name lives as long as the op; costs nothing when no sink is attached.
class NamedOp {
 public:
  NamedOp(profiler::OpSink* sink, int layer, std::string_view kind, profiler::OpCost cost,
          std::string shapes = {})
      : sink_(sink) {
    if (!sink_) return;
    name_ = layer >= 0 ? fmt::format("layer.{}.{}", layer, kind) : std::string(kind);
    kind_ = kind;
    profiler::OpInfo info{name_, kind_, std::move(shapes), cost};
    sink_->op_begin(info);
  }
  ~NamedOp() {
    if (sink_) sink_->op_end();
  }
  NamedOp(const NamedOp&) = delete;
  NamedOp& operator=(const NamedOp&) = delete;

 private:
  profiler::OpSink* sink_;
  std::string name_, kind_;
};

profiler::OpCost linear_cost(const ops::LinearWeight& w, int64_t m) {
  const double md = static_cast<double>(m);
  profiler::OpCost c;
  c.bytes_floor = w.bytes() + 4.0 * md * static_cast<double>(w.in + w.out);
  c.bytes_moved = c.bytes_floor;
  c.flops = 2.0 * md * static_cast<double>(w.in) * static_cast<double>(w.out);
  return c;
}

void run_linear(profiler::OpSink* sink, int layer, std::string_view kind, const Tensor& x,
                const ops::LinearWeight& w, const Tensor& y) {
  NamedOp op(sink, layer, kind, linear_cost(w, x.size(0)));
  ops::linear(x, w, y);
}

// SwiGLU MLP on x [m, H] into out [m, H].
void run_mlp(profiler::OpSink* sink, int layer, std::string_view prefix, const Tensor& x, const MlpWeights& w,
             const Tensor& out) {
  const int64_t m = x.size(0), inter = w.gate.out;
  Tensor gu = Tensor::empty({m, 2 * inter}, DType::F32);
  Tensor act = Tensor::empty({m, inter}, DType::F32);
  {
    profiler::OpCost c = linear_cost(w.gate, m);
    profiler::OpCost u = linear_cost(w.up, m);
    c.bytes_floor += u.bytes_floor;
    c.bytes_moved += u.bytes_moved;
    c.flops += u.flops;
    NamedOp op(sink, layer, fmt::format("{}.gate_up", prefix), c);
    ops::linear(x, w.gate, gu.slice(1, 0, inter));
    ops::linear(x, w.up, gu.slice(1, inter, 2 * inter));
  }
  {
    NamedOp op(sink, layer, fmt::format("{}.silu_mul", prefix),
               {12.0 * m * inter, 12.0 * m * inter, 4.0 * m * inter});
    ops::silu_mul(gu, act);
  }
  run_linear(sink, layer, fmt::format("{}.down", prefix), act, w.down, out);
}

double cache_elem_bytes(const Tensor& t) {
  return static_cast<double>(dtype_bits(t.dtype())) / 8.0;
}

}  // namespace

Model::Model(io::ModelConfig cfg, ModelWeights weights, ModelOptions opt)
    : cfg_(std::move(cfg)), w_(std::move(weights)), opt_(opt) {
  scales_ =
      make_attention_scales(cfg_, opt_.indexer_rope_interleaved.value_or(default_indexer_interleaved(cfg_)));
  MS_CHECK(static_cast<int>(w_.layers.size()) == cfg_.num_hidden_layers,
           "model: {} layers of weights for {} in config", w_.layers.size(), cfg_.num_hidden_layers);
  if (cfg_.has_indexer)
    MS_CHECK(
        cfg_.indexer_types.empty() || static_cast<int>(cfg_.indexer_types.size()) == cfg_.num_hidden_layers,
        "model config: indexer_types has {} entries for {} layers", cfg_.indexer_types.size(),
        cfg_.num_hidden_layers);
}

kv::KvPoolConfig Model::kv_pool_config(int32_t num_pages, int32_t page_size, kv::KvCacheDType dtype) const {
  kv::KvPoolConfig c;
  c.num_layers = cfg_.num_hidden_layers;
  c.width = cfg_.kv_cache_width();
  c.index_width = cfg_.has_indexer ? cfg_.index_head_dim : 0;
  c.num_pages = num_pages;
  c.page_size = page_size;
  c.dtype = dtype == kv::KvCacheDType::Auto ? kv::KvCacheDType::BF16 : dtype;
  return c;
}

void Model::check_batch(const kv::ForwardBatch& b, const kv::KvPool& pool) const {
  const size_t m = b.token_ids.size();
  MS_CHECK(m > 0, "forward: the batch has no tokens");
  MS_CHECK(b.positions.size() == m && b.token_seq.size() == m && b.slot_mapping.size() == m,
           "forward: batch arrays disagree ({} tokens, {} positions, {} seq ids, {} slots)", m,
           b.positions.size(), b.token_seq.size(), b.slot_mapping.size());
  MS_CHECK(b.max_blocks > 0 && b.block_table.size() == static_cast<size_t>(b.max_blocks) * b.seq_lens.size(),
           "forward: block table of {} entries is not [{} seqs, {}]", b.block_table.size(), b.seq_lens.size(),
           b.max_blocks);
  const auto& pc = pool.config();
  MS_CHECK(pc.num_layers == cfg_.num_hidden_layers && pc.width == cfg_.kv_cache_width(),
           "forward: KV pool of {} layers x {} wide does not fit the model ({} x {})", pc.num_layers,
           pc.width, cfg_.num_hidden_layers, cfg_.kv_cache_width());
  for (size_t i = 0; i < m; ++i) {
    const int32_t s = b.token_seq[i];
    MS_CHECK(s >= 0 && static_cast<size_t>(s) < b.seq_lens.size(), "forward: token {} names sequence {}", i,
             s);
    MS_CHECK(b.positions[i] >= 0 && b.positions[i] < b.seq_lens[static_cast<size_t>(s)],
             "forward: token {} at position {} beyond its sequence length {}", i, b.positions[i],
             b.seq_lens[static_cast<size_t>(s)]);
    MS_CHECK(b.positions[i] < cfg_.max_position_embeddings, "forward: position {} past the context limit {}",
             b.positions[i], cfg_.max_position_embeddings);
  }
  for (int32_t p : b.block_table)
    MS_CHECK(p >= -1 && p < pc.num_pages, "forward: block table names page {} of {}", p, pc.num_pages);
  for (int32_t r : b.logit_rows)
    MS_CHECK(r >= 0 && static_cast<size_t>(r) < m, "forward: logit row {} outside {} tokens", r, m);
}

Tensor Model::forward(const kv::ForwardBatch& b, kv::KvPool& pool, profiler::OpSink* sink) {
  check_batch(b, pool);
  const io::ModelConfig& c = cfg_;
  const int64_t m = b.n_tokens(), H = c.hidden_size, Hn = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const float eps = static_cast<float>(c.rms_norm_eps);
  ops::AttentionMeta meta;
  meta.token_seq = b.token_seq;
  meta.positions = b.positions;
  meta.slots = b.slot_mapping;
  meta.block_table = b.block_table;
  meta.max_blocks = b.max_blocks;
  meta.max_position = b.max_position();
  int64_t keys_total = 0, ctx_total = 0;  // for cost models
  for (int32_t p : b.positions) keys_total += p + 1;
  for (int32_t l : b.seq_lens) ctx_total += l;

  Tensor h = Tensor::empty({m, H}, DType::F32);
  {
    NamedOp op(sink, -1, "embed", {8.0 * m * H, 8.0 * m * H, 0});
    ops::embedding(b.token_ids, w_.embed, h);
  }
  Tensor xn = Tensor::empty({m, H}, DType::F32);
  Tensor topk;  // i32 [m, index_topk]: the last full indexer layer's selection
  bool have_topk = false;

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
    const AttentionWeights& a = L.attn;
    {
      NamedOp op(sink, l, "attn.norm", {8.0 * m * H, 8.0 * m * H, 3.0 * m * H});
      ops::rms_norm(h, L.input_norm, eps, xn);
    }
    // Queries: [m, Hn, dn + dr], rope channels last.
    Tensor q = Tensor::empty({m, Hn * (dn + dr)}, DType::F32);
    Tensor qa;
    if (c.q_lora_rank) {
      qa = Tensor::empty({m, *c.q_lora_rank}, DType::F32);
      run_linear(sink, l, "attn.q_a_proj", xn, a.q_a_proj, qa);
      {
        NamedOp op(sink, l, "attn.q_a_norm", {8.0 * qa.numel(), 8.0 * qa.numel(), 3.0 * qa.numel()});
        ops::rms_norm(qa, a.q_a_norm, kLoraNormEps, qa);
      }
      run_linear(sink, l, "attn.q_b_proj", qa, a.q_b_proj, q);
    } else {
      run_linear(sink, l, "attn.q_proj", xn, a.q_proj, q);
    }
    Tensor q3 = q.view({m, Hn, dn + dr});
    // Keys: the cached row [latent r | k_pe dr].
    Tensor kv = Tensor::empty({m, r + dr}, DType::F32);
    run_linear(sink, l, "attn.kv_a_proj", xn, a.kv_a_proj, kv);
    {
      NamedOp op(sink, l, "attn.rope",
                 {8.0 * m * (Hn + 1) * dr, 8.0 * m * (Hn + 1) * dr, 6.0 * m * (Hn + 1) * dr});
      ops::rms_norm(kv.slice(1, 0, r), a.kv_a_norm, kLoraNormEps, kv.slice(1, 0, r));
      ops::rope(q3, dn, b.positions, scales_.rope);
      ops::rope(kv.view({m, 1, r + dr}), r, b.positions, scales_.rope);
    }
    const ops::PagedCacheLayer cache{pool.latent(l), pool.scale(l)};
    const double row_bytes = static_cast<double>(r + dr) * cache_elem_bytes(cache.data);
    {
      NamedOp op(sink, l, "attn.kv_store",
                 {m * (4.0 * (r + dr) + row_bytes), m * (4.0 * (r + dr) + row_bytes), 0});
      ops::cache_write(kv, cache, meta);
    }

    // DSA: choose index_topk keys per query (a shared layer reuses the last full layer's choice).
    if (c.has_indexer) {
      const bool full =
          c.indexer_types.empty() || c.indexer_types[static_cast<size_t>(l)] == io::IndexerKind::Full;
      if (full || !have_topk) {
        MS_CHECK(a.has_indexer, "layer {}: the DSA indexer has no weights", l);
        const IndexerWeights& iw = a.indexer;
        const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
        Tensor iq = Tensor::empty({m, Hi * Di}, DType::F32);
        Tensor ik = Tensor::empty({m, Di}, DType::F32);
        Tensor iwt = Tensor::empty({m, Hi}, DType::F32);
        run_linear(sink, l, "indexer.wq_b", qa, iw.wq_b, iq);
        run_linear(sink, l, "indexer.wk", xn, iw.wk, ik);
        run_linear(sink, l, "indexer.weights_proj", xn, iw.weights_proj, iwt);
        const ops::PagedCacheLayer keys{pool.index_keys(l), 1.0f};
        const double key_bytes = static_cast<double>(Di) * cache_elem_bytes(keys.data);
        {
          NamedOp op(sink, l, "indexer.k_norm_rope", {8.0 * m * Di * (Hi + 1), 8.0 * m * Di * (Hi + 1), 0});
          ops::layer_norm(ik, iw.k_norm_weight, iw.k_norm_bias, kLoraNormEps, ik);
          ops::rope(iq.view({m, Hi, Di}), 0, b.positions, scales_.indexer_rope);
          ops::rope(ik.view({m, 1, Di}), 0, b.positions, scales_.indexer_rope);
          const float wscale = 1.0f / std::sqrt(static_cast<float>(Hi));
          float* wd = iwt.data<float>();
          for (int64_t i = 0; i < m * Hi; ++i) wd[i] *= wscale;
          ops::cache_write(ik, keys, meta);
        }
        topk = Tensor::empty({m, c.index_topk}, DType::I32);
        {
          profiler::OpCost cost{static_cast<double>(ctx_total) * key_bytes + 4.0 * m * Hi * Di,
                                static_cast<double>(keys_total) * key_bytes + 4.0 * m * Hi * Di,
                                2.0 * static_cast<double>(keys_total) * Hi * Di};
          NamedOp op(sink, l, "indexer.topk", cost);
          ops::dsa_indexer(iq.view({m, Hi, Di}), iwt, keys, meta, scales_.indexer_softmax_scale, topk,
                           scratch_.indexer);
        }
        if (opt_.indexer_probe) {
          const Tensor q3 = iq.view({m, Hi, Di});
          opt_.indexer_probe(IndexerProbe{l, &q3, &iwt, &topk, &b});
        }
        have_topk = true;
      }
    }

    Tensor q_cat = Tensor::empty({m, Hn, r + dr}, DType::F32);
    {
      profiler::OpCost cost = linear_cost(a.kv_b_proj, m);
      cost.bytes_floor *= static_cast<double>(dn) / static_cast<double>(dn + dv);
      cost.bytes_moved = cost.bytes_floor;
      cost.flops *= static_cast<double>(dn) / static_cast<double>(dn + dv);
      NamedOp op(sink, l, "attn.absorb_q", cost);
      ops::mla_absorb_q(q3, a.kv_b_proj, dn, dv, q_cat);
    }
    Tensor lat = Tensor::empty({m, Hn, r}, DType::F32);
    {
      const double keys =
          c.has_indexer ? static_cast<double>(m) * std::min<int64_t>(c.index_topk, meta.max_position + 1)
                        : static_cast<double>(keys_total);
      profiler::OpCost cost{static_cast<double>(ctx_total) * row_bytes + 4.0 * m * Hn * (2 * r + dr),
                            2.0 * keys * row_bytes + 4.0 * m * Hn * (2 * r + dr),
                            2.0 * keys * Hn * (2 * r + dr)};
      NamedOp op(sink, l, m == b.n_seqs() ? "attn.mla_decode" : "attn.mla", cost,
                 sink ? fmt::format("q f32[{},{},{}] kv {}[pages {} x {} x {}]", m, Hn, r + dr,
                                    dtype_name(cache.data.dtype()), cache.data.size(0), cache.data.size(1),
                                    cache.data.size(2))
                      : std::string());
      ops::mla_attention(q_cat, cache, meta, c.has_indexer ? topk : Tensor(), scales_.softmax_scale, lat,
                         scratch_.attn);
    }
    Tensor o = Tensor::empty({m, Hn * dv}, DType::F32);
    {
      profiler::OpCost cost = linear_cost(a.kv_b_proj, m);
      cost.bytes_floor *= static_cast<double>(dv) / static_cast<double>(dn + dv);
      cost.bytes_moved = cost.bytes_floor;
      cost.flops *= static_cast<double>(dv) / static_cast<double>(dn + dv);
      NamedOp op(sink, l, "attn.out_v", cost);
      ops::mla_out_v(lat, a.kv_b_proj, dn, dv, o);
    }
    Tensor attn_out = Tensor::empty({m, H}, DType::F32);
    run_linear(sink, l, "attn.o_proj", o, a.o_proj, attn_out);
    ops::add_inplace(h, attn_out);

    {
      NamedOp op(sink, l, "ffn.norm", {8.0 * m * H, 8.0 * m * H, 3.0 * m * H});
      ops::rms_norm(h, L.post_attn_norm, eps, xn);
    }
    Tensor ffn = Tensor::zeros({m, H}, DType::F32);
    if (L.is_moe) {
      const MoeWeights& mw = L.moe;
      const int E = c.n_routed_experts, K = c.num_experts_per_tok;
      Tensor logits = Tensor::empty({m, E}, DType::F32);
      run_linear(sink, l, "moe.router", xn, mw.router, logits);
      scratch_.topk_ids.resize(static_cast<size_t>(m * K));
      scratch_.topk_weights.resize(static_cast<size_t>(m * K));
      {
        NamedOp op(sink, l, "moe.route", {4.0 * m * E, 4.0 * m * E, 4.0 * m * E});
        moe::RouterConfig rc;
        rc.n_experts = E;
        rc.top_k = K;
        rc.n_group = c.n_group;
        rc.topk_group = c.topk_group;
        rc.scoring = c.scoring_func == "softmax" ? moe::Scoring::Softmax : moe::Scoring::Sigmoid;
        rc.use_correction_bias = mw.correction_bias.numel() > 0 && c.topk_method == "noaux_tc";
        rc.norm_topk_prob = c.norm_topk_prob;
        rc.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
        moe::RouterParams rp;
        rp.logits = logits.data<float>();
        rp.correction_bias = rc.use_correction_bias ? mw.correction_bias.data<float>() : nullptr;
        rp.topk_ids = scratch_.topk_ids.data();
        rp.topk_weights = scratch_.topk_weights.data();
        rp.n_tokens = static_cast<int>(m);
        moe::route_cpu(rc, moe::OeaConfig{}, rp);
      }
      if (opt_.router_probe) opt_.router_probe(RouterProbe{l, &logits, scratch_.topk_ids.data()});
      {
        const int distinct = moe::count_distinct_experts(scratch_.topk_ids.data(), static_cast<int>(m), K, E);
        const ops::ExpertWeights& e0 = mw.experts.front();
        const double per_expert = e0.gate.bytes() + e0.up.bytes() + e0.down.bytes();
        const double slots = static_cast<double>(m) * K;
        profiler::OpCost cost{
            distinct * per_expert + 8.0 * m * H, distinct * per_expert + 8.0 * slots * H,
            slots * 6.0 * static_cast<double>(H) * static_cast<double>(c.moe_intermediate_size)};
        NamedOp op(sink, l, "moe.experts", cost);
        ops::moe_experts(xn, scratch_.topk_ids, scratch_.topk_weights, K, mw.experts, ffn, scratch_.moe);
      }
      if (mw.has_shared) {
        Tensor sh = Tensor::empty({m, H}, DType::F32);
        run_mlp(sink, l, "moe.shared", xn, mw.shared, sh);
        ops::add_inplace(ffn, sh);
      }
    } else {
      run_mlp(sink, l, "mlp", xn, L.mlp, ffn);
    }
    ops::add_inplace(h, ffn);
  }

  const int64_t n_out = static_cast<int64_t>(b.logit_rows.size());
  Tensor logits = Tensor::empty({n_out, c.vocab_size}, DType::F32);
  if (n_out == 0) return logits;
  Tensor last = Tensor::empty({n_out, H}, DType::F32);
  for (int64_t i = 0; i < n_out; ++i) {
    const float* src = h.data<float>() + static_cast<int64_t>(b.logit_rows[static_cast<size_t>(i)]) * H;
    std::copy(src, src + H, last.data<float>() + i * H);
  }
  {
    NamedOp op(sink, -1, "final_norm", {8.0 * n_out * H, 8.0 * n_out * H, 3.0 * n_out * H});
    ops::rms_norm(last, w_.final_norm, eps, last);
  }
  run_linear(sink, -1, "lm_head", last, w_.lm_head, logits);
  return logits;
}

}  // namespace ms::model
