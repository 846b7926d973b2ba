#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "kernels/cpu/paged_cache.h"
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

moe::RouterConfig make_router_config(const io::ModelConfig& c) {
  moe::RouterConfig rc;
  rc.n_experts = c.n_routed_experts;
  rc.top_k = c.num_experts_per_tok;
  rc.n_group = c.n_group;
  rc.topk_group = c.topk_group;
  rc.scoring = c.scoring_func == "softmax" ? moe::Scoring::Softmax : moe::Scoring::Sigmoid;
  rc.use_correction_bias = c.topk_method == "noaux_tc";
  rc.norm_topk_prob = c.norm_topk_prob;
  rc.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  rc.group_score = c.topk_method == "group_limited_greedy" ? moe::GroupScore::Max : moe::GroupScore::Top2Sum;
  // Parity with transformers: DeepseekV3MoE (also used for V3.2 and Kimi K2) fills the dropped groups'
  // experts with 0.0, GlmMoeDsaMoE with -inf. They differ only when n_group > 1 and biased scores go
  // negative.
  rc.masked_fill = c.arch == io::ModelArch::GlmMoeDsa ? moe::MaskedFill::NegInf : moe::MaskedFill::Zero;
  return rc;
}

double cache_elem_bytes(const Tensor& t) {
  return static_cast<double>(dtype_bits(t.dtype())) / 8.0;
}

// An elementwise f32 op over n values reading `reads` and writing `writes` arrays of n, plus `extra` bytes.
profiler::OpCost elementwise_cost(double n, double reads, double writes, double flops_per, double extra = 0) {
  const double bytes = 4.0 * n * (reads + writes) + extra;
  return {bytes, bytes, flops_per * n};
}

// The planted bug (ModelOptions::debug_cast_whole_pool): every slot of the layer's pool cast to f32. What
// the step needs is the rows of its own sequences (ctx_rows); what this moves is the whole pool.
void debug_pool_cast(profiler::OpSink* sink, int layer, const ops::PagedCacheLayer& cache, int64_t ctx_rows,
                     std::vector<float>& out) {
  const Tensor& d = cache.data;
  const int64_t slots = d.size(0) * d.size(1), width = d.size(2);
  const double per_row = static_cast<double>(width) * (cache_elem_bytes(d) + 4.0);
  NamedOp op(sink, layer, "attn.debug_pool_cast",
             {static_cast<double>(ctx_rows) * per_row, static_cast<double>(slots) * per_row, 0},
             sink ? fmt::format("kv {}[{},{},{}] -> f32", dtype_name(d.dtype()), d.size(0), d.size(1), width)
                  : std::string());
  kernels::cpu::PagedCacheView v;
  v.data = d.raw();
  v.format = d.dtype() == DType::F32    ? kernels::cpu::CacheFormat::F32
             : d.dtype() == DType::BF16 ? kernels::cpu::CacheFormat::BF16
                                        : kernels::cpu::CacheFormat::FP8E4M3;
  v.scale = cache.scale;
  v.num_pages = d.size(0);
  v.page_size = d.size(1);
  v.width = width;
  out.resize(static_cast<size_t>(slots * width));
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slots; ++s) kernels::cpu::cache_read_row(v, s, out.data() + s * width);
}

}  // namespace

Model::Model(io::ModelConfig cfg, ModelWeights weights, ModelOptions opt)
    : cfg_(std::move(cfg)), w_(std::move(weights)), opt_(opt) {
  scales_ =
      make_attention_scales(cfg_, opt_.indexer_rope_interleaved.value_or(default_indexer_interleaved(cfg_)));
  router_ = make_router_config(cfg_);
  if (const char* e = std::getenv("MOESERVE_DEBUG_PLANT_POOL_CAST"); e && std::string_view(e) == "1")
    opt_.debug_cast_whole_pool = true;
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

void Model::check_batch(const kv::ForwardBatch& b, const kv::KvPool& pool, const StepRouting& routing) const {
  const size_t m = b.token_ids.size();
  MS_CHECK(m > 0, "forward: the batch has no tokens");
  MS_CHECK(routing.decode_tokens.empty() || routing.decode_tokens.size() == m,
           "forward: {} decode-token flags for {} tokens", routing.decode_tokens.size(), m);
  if (routing.oea.enabled) moe::validate(router_, routing.oea);
  if (routing.expert_stats)
    MS_CHECK(routing.expert_stats->n_layers() == cfg_.num_hidden_layers &&
                 routing.expert_stats->n_experts() == cfg_.n_routed_experts,
             "forward: expert stats for {} layers x {} experts, the model has {} x {}",
             routing.expert_stats->n_layers(), routing.expert_stats->n_experts(), cfg_.num_hidden_layers,
             cfg_.n_routed_experts);
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
  // Attention reads every position below a sequence's length through its block table: each of those pages
  // must be there, or the kernels would read (or write) outside the pool.
  for (size_t s = 0; s < b.seq_lens.size(); ++s) {
    const int64_t len = b.seq_lens[s];
    MS_CHECK(len > 0 && len <= static_cast<int64_t>(b.max_blocks) * pc.page_size,
             "forward: sequence {} of length {} does not fit its block table of {} pages of {}", s, len,
             b.max_blocks, pc.page_size);
    const int64_t pages = (len + pc.page_size - 1) / pc.page_size;
    for (int64_t j = 0; j < pages; ++j)
      MS_CHECK(
          b.block_table[s * static_cast<size_t>(b.max_blocks) + static_cast<size_t>(j)] >= 0,
          "forward: sequence {} has no page for positions [{}, {}) (block {} of its table is -1) but its "
          "length is {}",
          s, j * pc.page_size, std::min<int64_t>((j + 1) * pc.page_size, len), j, len);
  }
  for (int32_t r : b.logit_rows)
    MS_CHECK(r >= 0 && static_cast<size_t>(r) < m, "forward: logit row {} outside {} tokens", r, m);
}

Tensor Model::forward(const kv::ForwardBatch& b, kv::KvPool& pool, profiler::OpSink* sink,
                      const StepRouting& routing) {
  check_batch(b, pool, routing);
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
    const double row = w_.embed.bytes() / static_cast<double>(w_.embed.out);  // one table row, stored
    NamedOp op(sink, -1, "embed", {m * (row + 4.0 * H), m * (row + 4.0 * H), 0});
    ops::embedding(b.token_ids, w_.embed, h);
  }
  Tensor xn = Tensor::empty({m, H}, DType::F32);
  Tensor topk;  // i32 [m, index_topk]: the last full indexer layer's selection
  bool have_topk = false;

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
    const AttentionWeights& a = L.attn;
    {
      NamedOp op(sink, l, "attn.norm", elementwise_cost(m * H, 1, 1, 3, 4.0 * H));
      ops::rms_norm(h, L.input_norm, eps, xn);
    }
    // Queries: [m, Hn, dn + dr], rope channels last.
    Tensor q = Tensor::empty({m, Hn * (dn + dr)}, DType::F32);
    Tensor qa;
    if (c.q_lora_rank) {
      qa = Tensor::empty({m, *c.q_lora_rank}, DType::F32);
      run_linear(sink, l, "attn.q_a_proj", xn, a.q_a_proj, qa);
      {
        NamedOp op(sink, l, "attn.q_a_norm",
                   elementwise_cost(static_cast<double>(qa.numel()), 1, 1, 3, 4.0 * qa.size(1)));
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
      // kv_a_norm over the r latent channels, then rope on the dr channels of Hn query heads and the key.
      profiler::OpCost cost = elementwise_cost(m * r, 1, 1, 3, 4.0 * r);
      const profiler::OpCost rot = elementwise_cost(m * (Hn + 1) * dr, 1, 1, 6);
      cost.bytes_floor += rot.bytes_floor;
      cost.bytes_moved += rot.bytes_moved;
      cost.flops += rot.flops;
      NamedOp op(sink, l, "attn.rope", cost);
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
    if (opt_.debug_cast_whole_pool) debug_pool_cast(sink, l, cache, ctx_total, scratch_.pool_cast);

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
          // LayerNorm of the key, rope of Hi query heads and the key (in place), weights scaled, the key
          // stored into the index cache.
          const double bytes =
              8.0 * m * Di + 8.0 * Di + 8.0 * m * Di * (Hi + 1) + 8.0 * m * Hi + m * (4.0 * Di + key_bytes);
          NamedOp op(sink, l, "indexer.k_norm_rope", {bytes, bytes, 8.0 * m * Di + 6.0 * m * Di * (Hi + 1)});
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
          // Every key of each sequence once (floor), each token's visible keys (moved: a prefill chunk
          // re-reads its sequence's keys per token); q, head weights in, the selection out.
          const double act = 4.0 * m * (Hi * Di + Hi + c.index_topk);
          profiler::OpCost cost{static_cast<double>(ctx_total) * key_bytes + act,
                                static_cast<double>(keys_total) * key_bytes + act,
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
      // The W_UK rows of kv_b_proj (dn of every dn + dv per head); q in, q_cat out.
      const double bytes = a.kv_b_proj.bytes() * static_cast<double>(dn) / static_cast<double>(dn + dv) +
                           4.0 * m * Hn * (dn + dr) + 4.0 * m * Hn * (r + dr);
      NamedOp op(sink, l, "attn.absorb_q", {bytes, bytes, 2.0 * m * Hn * dn * r});
      ops::mla_absorb_q(q3, a.kv_b_proj, dn, dv, q_cat);
    }
    Tensor lat = Tensor::empty({m, Hn, r}, DType::F32);
    {
      // Rows read per token: its visible keys, or its DSA selection. Floor: each needed row once per
      // sequence (with DSA at most the sequence's tokens x index_topk); moved: once per token (a prefill
      // chunk re-reads its sequence's rows for every token).
      double keys = 0, rows = 0;
      if (c.has_indexer) {
        for (int32_t p : b.positions) keys += static_cast<double>(std::min<int64_t>(c.index_topk, p + 1));
        std::vector<int64_t> per_seq(b.seq_lens.size(), 0);
        for (int32_t s : b.token_seq) per_seq[static_cast<size_t>(s)] += c.index_topk;
        for (size_t s = 0; s < per_seq.size(); ++s)
          rows += static_cast<double>(std::min<int64_t>(per_seq[s], b.seq_lens[s]));
      } else {
        keys = static_cast<double>(keys_total);
        rows = static_cast<double>(ctx_total);
      }
      const double act = 4.0 * m * Hn * (2 * r + dr);
      profiler::OpCost cost{rows * row_bytes + act, keys * row_bytes + act, 2.0 * keys * Hn * (2 * r + dr)};
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
      // The W_UV rows of kv_b_proj; latent in, per-head values out.
      const double bytes = a.kv_b_proj.bytes() * static_cast<double>(dv) / static_cast<double>(dn + dv) +
                           4.0 * m * Hn * r + 4.0 * m * Hn * dv;
      NamedOp op(sink, l, "attn.out_v", {bytes, bytes, 2.0 * m * Hn * r * dv});
      ops::mla_out_v(lat, a.kv_b_proj, dn, dv, o);
    }
    Tensor attn_out = Tensor::empty({m, H}, DType::F32);
    run_linear(sink, l, "attn.o_proj", o, a.o_proj, attn_out);
    {
      NamedOp op(sink, l, "attn.residual", elementwise_cost(m * H, 2, 1, 1));
      ops::add_inplace(h, attn_out);
    }

    {
      NamedOp op(sink, l, "ffn.norm", elementwise_cost(m * H, 1, 1, 3, 4.0 * H));
      ops::rms_norm(h, L.post_attn_norm, eps, xn);
    }
    Tensor ffn = Tensor::zeros({m, H}, DType::F32);
    if (L.is_moe) {
      const MoeWeights& mw = L.moe;
      const int E = c.n_routed_experts, K = c.num_experts_per_tok;
      Tensor logits = Tensor::empty({m, E}, DType::F32);
      run_linear(sink, l, "moe.router", xn, mw.router, logits);
      {
        NamedOp op(sink, l, "moe.route", {4.0 * m * E + 8.0 * m * K, 4.0 * m * E + 8.0 * m * K, 4.0 * m * E});
        route(l, mw, logits, routing);
      }
      if (opt_.router_probe) opt_.router_probe(RouterProbe{l, &logits, scratch_.topk_ids.data()});
      {
        const int distinct = moe::count_distinct_experts(scratch_.topk_ids.data(), static_cast<int>(m), K, E);
        const ops::ExpertWeights& e0 = mw.experts.front();
        const double per_expert = e0.gate.bytes() + e0.up.bytes() + e0.down.bytes();
        const double slots = static_cast<double>(m) * K;
        // Floor: the weights of the experts routed to (not all E), x read, out read and written. Moved: each
        // (token, expert) slot gathers its row, writes its result and adds it into out.
        profiler::OpCost cost{
            distinct * per_expert + 12.0 * m * H, distinct * per_expert + 20.0 * slots * H,
            slots * 6.0 * static_cast<double>(H) * static_cast<double>(c.moe_intermediate_size)};
        NamedOp op(sink, l, "moe.experts", cost);
        ops::moe_experts(xn, scratch_.topk_ids, scratch_.topk_weights, K, mw.experts, ffn, scratch_.moe);
      }
      if (mw.has_shared) {
        Tensor sh = Tensor::empty({m, H}, DType::F32);
        run_mlp(sink, l, "moe.shared", xn, mw.shared, sh);
        NamedOp op(sink, l, "moe.shared_add", elementwise_cost(m * H, 2, 1, 1));
        ops::add_inplace(ffn, sh);
      }
    } else {
      run_mlp(sink, l, "mlp", xn, L.mlp, ffn);
    }
    {
      NamedOp op(sink, l, "ffn.residual", elementwise_cost(m * H, 2, 1, 1));
      ops::add_inplace(h, ffn);
    }
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
    NamedOp op(sink, -1, "final_norm", elementwise_cost(n_out * H, 1, 1, 3, 4.0 * H));
    ops::rms_norm(last, w_.final_norm, eps, last);
  }
  run_linear(sink, -1, "lm_head", last, w_.lm_head, logits);
  return logits;
}

// Plain routing for every token, except that decode tokens use OEA when it is on (base set over the step's
// decode tokens only, so a prefill chunk never widens it). Results in scratch_.topk_ids / topk_weights.
void Model::route(int layer, const MoeWeights& mw, const Tensor& logits, const StepRouting& routing) {
  const int E = router_.n_experts, K = router_.top_k;
  const int m = static_cast<int>(logits.size(0));
  moe::RouterConfig rc = router_;
  rc.use_correction_bias = rc.use_correction_bias && mw.correction_bias.numel() > 0;
  scratch_.topk_ids.resize(static_cast<size_t>(m) * K);
  scratch_.topk_weights.resize(static_cast<size_t>(m) * K);
  auto& rows = scratch_.decode_rows;
  rows.clear();
  for (int i = 0; i < static_cast<int>(routing.decode_tokens.size()); ++i)
    if (routing.decode_tokens[static_cast<size_t>(i)]) rows.push_back(i);
  const int n_dec = static_cast<int>(rows.size());
  const bool use_oea = routing.oea.enabled && n_dec > 0;
  moe::RouterParams rp;
  rp.logits = logits.data<float>();
  rp.correction_bias = rc.use_correction_bias ? mw.correction_bias.data<float>() : nullptr;
  rp.topk_ids = scratch_.topk_ids.data();
  rp.topk_weights = scratch_.topk_weights.data();
  rp.n_tokens = m;
  // Plain routing: for prefill tokens, and as the baseline of the decode tokens when stats are wanted.
  const bool stats = routing.expert_stats != nullptr && n_dec > 0;
  if (!use_oea || n_dec < m || stats) moe::route_cpu(rc, moe::OeaConfig{}, rp);
  auto& ids = scratch_.decode_ids;
  auto gather_ids = [&] {
    ids.resize(static_cast<size_t>(n_dec) * K);
    for (int j = 0; j < n_dec; ++j)
      std::copy_n(scratch_.topk_ids.data() + static_cast<int64_t>(rows[j]) * K, K,
                  ids.data() + static_cast<int64_t>(j) * K);
  };
  if (stats) {
    gather_ids();
    routing.expert_stats->record_batch(layer, moe::RoutingKind::Baseline, ids.data(), n_dec, K);
  }
  if (!use_oea) return;
  if (n_dec == m) {
    moe::route_cpu(rc, routing.oea, rp);
  } else {
    // Decode tokens are scattered among prefill chunks: route them as one contiguous block.
    std::vector<float>& lg = scratch_.router_logits;
    lg.resize(static_cast<size_t>(n_dec) * E);
    for (int j = 0; j < n_dec; ++j)
      std::copy_n(logits.data<float>() + static_cast<int64_t>(rows[j]) * E, E,
                  lg.data() + static_cast<int64_t>(j) * E);
    ids.resize(static_cast<size_t>(n_dec) * K);
    scratch_.decode_weights.resize(static_cast<size_t>(n_dec) * K);
    moe::RouterParams dp = rp;
    dp.logits = lg.data();
    dp.topk_ids = ids.data();
    dp.topk_weights = scratch_.decode_weights.data();
    dp.n_tokens = n_dec;
    moe::route_cpu(rc, routing.oea, dp);
    for (int j = 0; j < n_dec; ++j) {
      const int64_t dst = static_cast<int64_t>(rows[j]) * K, src = static_cast<int64_t>(j) * K;
      std::copy_n(ids.data() + src, K, scratch_.topk_ids.data() + dst);
      std::copy_n(scratch_.decode_weights.data() + src, K, scratch_.topk_weights.data() + dst);
    }
  }
  if (stats) {
    gather_ids();
    routing.expert_stats->record_batch(layer, moe::RoutingKind::Oea, ids.data(), n_dec, K);
  }
}

}  // namespace ms::model
