#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "kernels/cpu/paged_cache.h"
#include "model/op_costs.h"
#include "model/weight_loader.h"
#include "moe/route_step.h"
#include "moe/router.h"
#include "ops/attention.h"
#include "ops/ops.h"

namespace ms::model {

namespace {

constexpr float kLoraNormEps =
    1e-6f;  // q_a_layernorm, kv_a_layernorm, indexer k_norm: the modules' default eps

// A profiler scope whose name lives as long as the op. With no sink it costs a pointer test: the cost model
// and the shapes (callables) are evaluated only when a sink listens.
class NamedOp {
 public:
  template <typename CostFn>
  NamedOp(profiler::OpSink* sink, int layer, std::string_view kind, CostFn&& cost) : sink_(sink) {
    if (sink_) begin(layer, kind, cost(), {});
  }
  template <typename CostFn, typename ShapesFn>
  NamedOp(profiler::OpSink* sink, int layer, std::string_view kind, CostFn&& cost, ShapesFn&& shapes)
      : sink_(sink) {
    if (sink_) begin(layer, kind, cost(), shapes());
  }
  ~NamedOp() {
    if (sink_) sink_->op_end();
  }
  NamedOp(const NamedOp&) = delete;
  NamedOp& operator=(const NamedOp&) = delete;

 private:
  void begin(int layer, std::string_view kind, const profiler::OpCost& cost, std::string shapes) {
    name_ = layer >= 0 ? fmt::format("layer.{}.{}", layer, kind) : std::string(kind);
    kind_ = kind;
    sink_->op_begin(profiler::OpInfo{name_, kind_, std::move(shapes), cost});
  }
  profiler::OpSink* sink_;
  std::string name_, kind_;
};

void run_linear(const ops::Ctx& ctx, profiler::OpSink* sink, int layer, std::string_view kind,
                const Tensor& x, const ops::LinearWeight& w, const Tensor& y) {
  NamedOp op(sink, layer, kind, [&] { return costs::linear(w, x.size(0)); });
  ops::linear(ctx, x, w, y);
}

// The first m rows of a workspace tensor.
Tensor rows(const Tensor& t, int64_t m) {
  return t.slice(0, 0, m);
}

// SwiGLU MLP on x [m, H] into out [m, H], over the workspace's gate_up / act.
void run_mlp(const ops::Ctx& ctx, profiler::OpSink* sink, int layer, std::string_view prefix, const Tensor& x,
             const MlpWeights& w, Workspace& ws, const Tensor& out) {
  const int64_t m = x.size(0), inter = w.gate.out;
  MS_CHECK(2 * inter <= ws.gate_up.size(1), "workspace: MLP of {} wider than {}", inter,
           ws.gate_up.size(1) / 2);
  const Tensor gu = rows(ws.gate_up, m).slice(1, 0, 2 * inter);
  const Tensor act = rows(ws.act, m).slice(1, 0, inter);
  {
    NamedOp op(sink, layer, fmt::format("{}.gate_up", prefix),
               [&] { return costs::sum(costs::linear(w.gate, m), costs::linear(w.up, m)); });
    ops::linear(ctx, x, w.gate, gu.slice(1, 0, inter));
    ops::linear(ctx, x, w.up, gu.slice(1, inter, 2 * inter));
  }
  {
    NamedOp op(sink, layer, fmt::format("{}.silu_mul", prefix), [&] { return costs::silu_mul(m, inter); });
    ops::silu_mul(ctx, gu, act);
  }
  run_linear(ctx, sink, layer, fmt::format("{}.down", prefix), act, w.down, out);
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

}  // namespace

Model::Model(io::ModelConfig cfg, ModelWeights weights, ModelOptions opt)
    : cfg_(std::move(cfg)), w_(std::move(weights)), opt_(opt) {
  if (w_.shard.sharded()) {
    check_shard(cfg_, w_.shard);
    cfg_ = shard_config(cfg_, w_.shard);
  }
  if (w_.shard.ep_size > 1) build_expert_routes();
  if (opt_.fuse_shared_expert) build_fused_experts();
  scales_ =
      make_attention_scales(cfg_, opt_.indexer_rope_interleaved.value_or(default_indexer_interleaved(cfg_)));
  router_ = make_router_config(cfg_);
  if (const char* e = std::getenv("MOESERVE_DEBUG_PLANT_POOL_CAST"); e && std::string_view(e) == "1")
    opt_.debug_cast_whole_pool = true;
  MS_CHECK(static_cast<int>(w_.layers.size()) == cfg_.num_hidden_layers,
           "model: {} layers of weights for {} in config", w_.layers.size(), cfg_.num_hidden_layers);
  MS_CHECK(w_.kv_scales.empty() || w_.kv_scales.size() == w_.layers.size(),
           "model: {} KV cache scales for {} layers", w_.kv_scales.size(), w_.layers.size());
  if (cfg_.has_indexer)
    MS_CHECK(
        cfg_.indexer_types.empty() || static_cast<int>(cfg_.indexer_types.size()) == cfg_.num_hidden_layers,
        "model config: indexer_types has {} entries for {} layers", cfg_.indexer_types.size(),
        cfg_.num_hidden_layers);
}

void Model::build_fused_experts() {
  fused_experts_.assign(w_.layers.size(), {});
  if (w_.shard.ep_size > 1) return;  // the shared expert is added on one rank only
  auto same = [](const ops::LinearWeight& a, const ops::LinearWeight& b) {
    return a.format == b.format && a.block == b.block && a.out == b.out && a.in == b.in;
  };
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& L = w_.layers[l];
    if (!L.is_moe || !L.moe.has_shared || L.moe.experts.empty()) continue;
    const ops::ExpertWeights& e0 = L.moe.experts.front();
    const MlpWeights& s = L.moe.shared;
    if (!same(s.gate, e0.gate) || !same(s.up, e0.up) || !same(s.down, e0.down)) continue;
    std::vector<ops::ExpertWeights> all = L.moe.experts;
    all.push_back(ops::ExpertWeights{s.gate, s.up, s.down});
    fused_experts_[l] = std::move(all);
  }
}

void Model::build_expert_routes() {
  const int E = cfg_.n_routed_experts, rank = w_.shard.ep_rank;
  expert_route_.assign(w_.layers.size(), {});
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& L = w_.layers[l];
    if (!L.is_moe) continue;
    const MoeWeights& mw = L.moe;
    MS_CHECK(mw.expert_ids.size() == mw.experts.size() && static_cast<int>(mw.expert_copy_ranks.size()) == E,
             "model: layer {} has {} expert weights, {} expert ids and copy ranks of {} experts for {}", l,
             mw.experts.size(), mw.expert_ids.size(), mw.expert_copy_ranks.size(), E);
    std::vector<int32_t> local(static_cast<size_t>(E), -1);
    for (size_t i = 0; i < mw.expert_ids.size(); ++i) {
      const int e = mw.expert_ids[i];
      MS_CHECK(e >= 0 && e < E && local[static_cast<size_t>(e)] < 0,
               "model: layer {} local expert {} (slot {}) is out of range or held twice", l, e, i);
      local[static_cast<size_t>(e)] = static_cast<int32_t>(i);
    }
    size_t max_copies = 1;
    for (const auto& c : mw.expert_copy_ranks) max_copies = std::max(max_copies, c.size());
    ExpertRoute& r = expert_route_[l];
    auto i32 = [](const std::vector<int32_t>& v, Shape shape) {
      Tensor t = Tensor::empty(std::move(shape), DType::I32);
      std::copy(v.begin(), v.end(), t.data<int32_t>());
      return t;
    };
    std::vector<int32_t> copies(static_cast<size_t>(E)), slots(static_cast<size_t>(E) * max_copies, -1);
    for (int e = 0; e < E; ++e) {
      const std::vector<int>& ranks = mw.expert_copy_ranks[static_cast<size_t>(e)];
      MS_CHECK(!ranks.empty(), "model: layer {} expert {} has no copy", l, e);
      copies[static_cast<size_t>(e)] = static_cast<int32_t>(ranks.size());
      int here = 0;
      for (size_t c = 0; c < ranks.size(); ++c)
        if (ranks[c] == rank) {
          slots[static_cast<size_t>(e) * max_copies + c] = local[static_cast<size_t>(e)];
          ++here;
        }
      MS_CHECK(here == (local[static_cast<size_t>(e)] >= 0 ? 1 : 0),
               "model: layer {} expert {}: the copy ranks list this rank {} times, its slots {}", l, e, here,
               local[static_cast<size_t>(e)] >= 0 ? 1 : 0);
    }
    if (max_copies == 1) {
      r.slot = i32(local, {E});
    } else {
      r.copies = i32(copies, {E});
      r.slots = i32(slots, {E, static_cast<int64_t>(max_copies)});
    }
  }
}

kv::KvPoolConfig Model::kv_pool_config(int32_t num_pages, int32_t page_size, kv::KvCacheDType dtype) const {
  kv::KvPoolConfig c;
  c.num_layers = cfg_.num_hidden_layers;
  c.width = cfg_.kv_cache_width();
  c.index_width = cfg_.has_indexer ? cfg_.index_head_dim : 0;
  c.num_pages = num_pages;
  c.page_size = page_size;
  c.dtype = dtype == kv::KvCacheDType::Auto ? kv::KvCacheDType::BF16 : dtype;
  c.rope_width = cfg_.qk_rope_head_dim;
  // Only an fp8 pool stores scaled values; the other dtypes hold the latent as is.
  if (c.dtype == kv::KvCacheDType::FP8E4M3) c.scales = w_.kv_scales;
  return c;
}

void Model::place_tables(const ops::Ctx& ctx, const TensorAlloc& alloc) {
  for (ops::RopeTable* t : {&scales_.rope, &scales_.indexer_rope}) {
    if (!t->inv_freq.defined() || t->inv_freq.numel() == 0) continue;
    const Tensor host = t->inv_freq;
    Tensor dev = alloc(host.shape(), DType::F32);
    ops::copy_from_host(ctx, host.data<float>(), dev, host.nbytes());
    t->inv_freq = dev;
  }
  for (ExpertRoute& r : expert_route_)
    for (Tensor* t : {&r.slot, &r.copies, &r.slots}) {
      if (!t->defined() || t->device() == ctx.device) continue;
      const Tensor host = *t;
      *t = alloc(host.shape(), DType::I32);
      ops::copy_from_host(ctx, host.data<int32_t>(), *t, host.nbytes());
    }
}

bool Model::dsa_dense_step(const kv::ForwardBatch& b) const {
  if (!cfg_.has_indexer || !opt_.dsa_dense_when_short || opt_.indexer_probe || b.positions.empty())
    return false;
  const int32_t last = *std::max_element(b.positions.begin(), b.positions.end());
  return static_cast<int64_t>(last) + 1 <= cfg_.index_topk;
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

Tensor Model::forward(const ops::Ctx& ctx, const StepInputs& in, kv::KvPool& pool, Workspace& ws,
                      const StepRouting& routing, profiler::OpSink* sink) const {
  const io::ModelConfig& c = cfg_;
  const int64_t m = in.m(), H = c.hidden_size, Hn = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const float eps = static_cast<float>(c.rms_norm_eps);
  MS_CHECK(m > 0 && in.host, "forward: the step has no tokens");
  MS_CHECK(m <= ws.limits.max_tokens && in.n_logit_rows <= ws.limits.max_logit_rows,
           "forward: step of {} tokens, {} logit rows exceeds the workspace ({}, {})", m, in.n_logit_rows,
           ws.limits.max_tokens, ws.limits.max_logit_rows);
  MS_CHECK(ws.device == ctx.device, "forward: workspace and context on different devices");
  const kv::ForwardBatch& b = *in.host;
  const ops::AttentionMeta& meta = in.meta;
  // Sharded: attention heads and dense MLPs over tp ranks, routed experts over ep ranks, one group of
  // max(tp, ep) ranks (both > 1 only as tp == ep). Each sum below is where the ranks meet.
  const dist::ShardSpec& sp = w_.shard;
  dist::Communicator* comm = ws.comm;
  if (sp.sharded())
    MS_CHECK(comm != nullptr && comm->size() == std::max(sp.tp_size, sp.ep_size),
             "forward: a model split over tp {} x ep {} needs its group's communicator (got {})", sp.tp_size,
             sp.ep_size, comm ? comm->describe() : "none");
  auto all_reduce = [&](int layer, std::string_view kind, const Tensor& t) {
    NamedOp op(sink, layer, kind,
               [&] { return costs::elementwise(static_cast<double>(t.numel()), 1, 1, 1); });
    comm->all_reduce_sum(t.raw(), t.numel(), t.dtype(), ctx.stream);
  };
  // Host-side shape of the step for the cost models, computed only when a profiler listens.
  costs::StepShape shape;
  if (sink) shape = costs::StepShape::of(b);

  const Tensor h = rows(ws.h, m), xn = rows(ws.xn, m);
  {
    NamedOp op(sink, -1, "embed", [&] { return costs::embed(w_.embed, m, H); });
    ops::embedding(ctx, in.token_ids, w_.embed, h);
  }
  {
    NamedOp op(sink, 0, "attn.norm", [&] { return costs::rms_norm(m, H); });
    ops::rms_norm(ctx, h, w_.layers.front().input_norm, eps, xn);
  }
  const Tensor topk = c.has_indexer ? rows(ws.topk, m) : Tensor();  // the last full indexer layer's choice
  bool have_topk = false;
  const bool dense_dsa = dsa_dense_step(b);  // the indexer would select every visible key

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
    const AttentionWeights& a = L.attn;
    // xn = attn_norm(h) here (the previous layer's ffn.residual, or attn.norm for layer 0).
    // Queries: [m, Hn, dn + dr], rope channels last.
    const Tensor q = rows(ws.q, m);
    // A fused q_a / kv_a (/ indexer wk) weight (AttentionWeights::qkv_a): one product into ws.qkv, whose
    // column ranges are qa, kv and ik (rows ws.qkv's width apart); kv3 / ik3 are the [m, 1, width] views rope
    // takes.
    const bool fused = a.qkv_a.defined();
    Tensor qkv, kv3_fused, ik3_fused;
    if (fused) {
      qkv = rows(ws.qkv, m).slice(1, 0, a.qkv_a.out);
      run_linear(ctx, sink, l, "attn.qkv_a_proj", xn, a.qkv_a, qkv);
    }
    auto qkv_cols = [&](int64_t off, int64_t width, Tensor* as_heads) {
      if (as_heads) *as_heads = rows(ws.qkv, m).view({m, 1, ws.qkv.size(1)}).slice(2, off, off + width);
      return qkv.slice(1, off, off + width);
    };
    Tensor qa;
    if (c.q_lora_rank) {
      if (fused) {
        qa = qkv_cols(0, a.qkv_a_q, nullptr);
      } else {
        qa = rows(ws.qa, m);
        run_linear(ctx, sink, l, "attn.q_a_proj", xn, a.q_a_proj, qa);
      }
      {
        NamedOp op(sink, l, "attn.q_a_norm", [&] { return costs::rms_norm(m, qa.size(1)); });
        ops::rms_norm(ctx, qa, a.q_a_norm, kLoraNormEps, qa);
      }
      run_linear(ctx, sink, l, "attn.q_b_proj", qa, a.q_b_proj, q);
    } else {
      run_linear(ctx, sink, l, "attn.q_proj", xn, a.q_proj, q);
    }
    const Tensor q3 = q.view({m, Hn, dn + dr});
    // Keys: the cached row [latent r | k_pe dr].
    const Tensor kv = fused ? qkv_cols(a.qkv_a_q, r + dr, &kv3_fused) : rows(ws.kv, m);
    if (!fused) run_linear(ctx, sink, l, "attn.kv_a_proj", xn, a.kv_a_proj, kv);
    {
      // kv_a_norm over the r latent channels, then rope on the dr channels of Hn query heads and the key.
      NamedOp op(sink, l, "attn.rope", [&] { return costs::attn_rope(c, m); });
      ops::rms_norm(ctx, kv.slice(1, 0, r), a.kv_a_norm, kLoraNormEps, kv.slice(1, 0, r));
      ops::rope(ctx, q3, dn, meta.positions, scales_.rope);
      ops::rope(ctx, fused ? kv3_fused : kv.view({m, 1, r + dr}), r, meta.positions, scales_.rope);
    }
    const ops::PagedCacheLayer cache{pool.latent(l), pool.scale(l), pool.fp8_tile_sim_rope()};
    {
      NamedOp op(sink, l, "attn.kv_store",
                 [&] { return costs::kv_store(c, m, cache_elem_bytes(cache.data)); });
      ops::cache_write(ctx, kv, cache, meta);
    }
    if (opt_.debug_cast_whole_pool) {
      const Tensor& d = cache.data;
      NamedOp op(
          sink, l, "attn.debug_pool_cast",
          [&] {
            return costs::debug_pool_cast(c, shape.ctx_total, d.size(0) * d.size(1), cache_elem_bytes(d));
          },
          [&] {
            return fmt::format("kv {}[{},{},{}] -> f32", dtype_name(d.dtype()), d.size(0), d.size(1),
                               d.size(2));
          });
      ops::debug_pool_cast(ctx, cache, ws.pool_cast);
    }

    // DSA: choose index_topk keys per query (a shared layer reuses the last full layer's choice).
    if (c.has_indexer) {
      const bool full =
          c.indexer_types.empty() || c.indexer_types[static_cast<size_t>(l)] == io::IndexerKind::Full;
      if (full || !have_topk) {
        MS_CHECK(a.has_indexer, "layer {}: the DSA indexer has no weights", l);
        const IndexerWeights& iw = a.indexer;
        const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
        const bool ik_fused = fused && a.qkv_a_wk;
        const Tensor iq = rows(ws.iq, m), iwt = rows(ws.iw, m);
        const Tensor ik = ik_fused ? qkv_cols(a.qkv_a_q + r + dr, Di, &ik3_fused) : rows(ws.ik, m);
        if (!dense_dsa) run_linear(ctx, sink, l, "indexer.wq_b", qa, iw.wq_b, iq);
        if (!ik_fused) run_linear(ctx, sink, l, "indexer.wk", xn, iw.wk, ik);
        if (!dense_dsa) run_linear(ctx, sink, l, "indexer.weights_proj", xn, iw.weights_proj, iwt);
        const ops::PagedCacheLayer keys{pool.index_keys(l), 1.0f};
        {
          NamedOp op(sink, l, "indexer.k_norm_rope",
                     [&] { return costs::indexer_k_norm_rope(c, m, cache_elem_bytes(keys.data)); });
          ops::layer_norm(ctx, ik, iw.k_norm_weight, iw.k_norm_bias, kLoraNormEps, ik);
          if (!dense_dsa) ops::rope(ctx, iq.view({m, Hi, Di}), 0, meta.positions, scales_.indexer_rope);
          ops::rope(ctx, ik_fused ? ik3_fused : ik.view({m, 1, Di}), 0, meta.positions, scales_.indexer_rope);
          if (!dense_dsa) ops::scale(ctx, iwt, 1.0f / std::sqrt(static_cast<float>(Hi)));
          ops::cache_write(ctx, ik, keys, meta);  // later, longer steps select from these keys
        }
        if (!dense_dsa) {
          NamedOp op(sink, l, "indexer.topk",
                     [&] { return costs::indexer_topk(c, shape, cache_elem_bytes(keys.data)); });
          ops::dsa_indexer(ctx, iq.view({m, Hi, Di}), iwt, keys, meta, scales_.indexer_softmax_scale, topk,
                           ws.indexer_scratch);
        }
        if (opt_.indexer_probe) {
          const Tensor iq3 = iq.view({m, Hi, Di});
          opt_.indexer_probe(IndexerProbe{l, &iq3, &iwt, &topk, &b});
        }
        have_topk = true;
      }
    }

    const Tensor q_cat = rows(ws.q_cat, m);
    {
      NamedOp op(sink, l, "attn.absorb_q", [&] { return costs::absorb_q(c, a.kv_b_proj, m); });
      ops::mla_absorb_q(ctx, q3, a.kv_b_proj, dn, dv, q_cat);
    }
    const Tensor lat = rows(ws.lat, m);
    {
      NamedOp op(
          sink, l, m == meta.n_seqs ? "attn.mla_decode" : "attn.mla",
          [&] { return costs::mla(c, shape, cache_elem_bytes(cache.data)); },
          [&] {
            return fmt::format("q f32[{},{},{}] kv {}[pages {} x {} x {}]", m, Hn, r + dr,
                               dtype_name(cache.data.dtype()), cache.data.size(0), cache.data.size(1),
                               cache.data.size(2));
          });
      // The selection comes from ops::dsa_indexer: ascending positions, -1 only at the tail (compact).
      const bool sparse = c.has_indexer && !dense_dsa;
      ops::mla_attention(ctx, q_cat, cache, meta, sparse ? topk : Tensor(), scales_.softmax_scale, lat,
                         ws.attn_scratch, /*topk_compact=*/sparse);
    }
    const Tensor o = rows(ws.o, m);
    {
      NamedOp op(sink, l, "attn.out_v", [&] { return costs::out_v(c, a.kv_b_proj, m); });
      ops::mla_out_v(ctx, lat, a.kv_b_proj, dn, dv, o);
    }
    const Tensor attn_out = rows(ws.attn_out, m);
    run_linear(ctx, sink, l, "attn.o_proj", o, a.o_proj, attn_out);
    if (sp.tp_size > 1) all_reduce(l, "attn.all_reduce", attn_out);  // each rank's heads' share of o_proj
    {
      // h += attn_out, fused with ffn_norm.
      NamedOp op(sink, l, "attn.residual", [&] { return costs::add_rms_norm(m, H); });
      ops::add_rms_norm(ctx, h, attn_out, L.post_attn_norm, eps, xn);
    }

    const Tensor ffn = rows(ws.ffn, m);
    if (L.is_moe) {
      const MoeWeights& mw = L.moe;
      const int E = c.n_routed_experts, K = c.num_experts_per_tok;
      const Tensor logits = rows(ws.router_logits, m);
      const Tensor ids = rows(ws.topk_ids, m), wts = rows(ws.topk_weights, m);
      const bool stats = routing.expert_stats != nullptr && in.n_decode > 0;
      const Tensor plain = stats && routing.oea.enabled ? rows(ws.plain_ids, m) : Tensor();
      run_linear(ctx, sink, l, "moe.router", xn, mw.router, logits);
      {
        NamedOp op(sink, l, "moe.route", [&] { return costs::route(c, m); });
        moe::route_step(ctx, router_, routing.oea, logits, mw.correction_bias, in.decode_mask, ids, wts,
                        plain, ws.route);
      }
      // Expert stats, router probes and the experts' cost read ids on the host: each copies back (a sync on a
      // device; profiled and probed steps only).
      const size_t n_ids = static_cast<size_t>(m) * K;
      const bool need_ids = stats || opt_.router_probe || sink || routing.expert_distribution;
      if (need_ids) ops::copy_to_host(ctx, ids, ws.host_ids.data(), n_ids * sizeof(int32_t));
      if (routing.expert_distribution) routing.expert_distribution->record(l, ws.host_ids.data(), m, K);
      if (stats) record_stats(ctx, l, in, ws, plain, routing);
      if (opt_.router_probe) opt_.router_probe(RouterProbe{l, &logits, ws.host_ids.data()});
      const std::vector<ops::ExpertWeights>* fused =
          fused_experts_.empty() || fused_experts_[static_cast<size_t>(l)].empty()
              ? nullptr
              : &fused_experts_[static_cast<size_t>(l)];
      {
        NamedOp op(sink, l, "moe.experts", [&] {
          const int distinct = moe::count_distinct_experts(ws.host_ids.data(), static_cast<int>(m), K, E);
          // Fused: the shared expert is one more expert every token takes.
          return fused ? costs::moe_experts(c, *fused, m, distinct + 1, K + 1)
                       : costs::moe_experts(c, mw.experts, m, distinct, K);
        });
        ops::fill_zero(ctx, ffn);
        if (fused) {
          const Tensor ids_x = rows(ws.topk_ids_ext, m), wts_x = rows(ws.topk_weights_ext, m);
          ops::append_expert_slot(ctx, ids, wts, E, 1.0f, ids_x, wts_x);
          ops::moe_experts(ctx, xn, ids_x, wts_x, *fused, ffn, ws.moe);
        } else if (sp.ep_size > 1) {
          // Routing is the same on every rank; each runs only its own experts (other ranks' slots -> -1).
          const Tensor local = rows(ws.local_ids, m);
          const ExpertRoute& route = expert_route_[static_cast<size_t>(l)];
          if (route.slot.defined())
            ops::remap_ids(ctx, ids, route.slot, local);
          else  // each assignment of a replicated expert runs on exactly one of its copies' ranks
            ops::remap_ids_replicated(ctx, ids, route.copies, route.slots, local);
          ops::moe_experts(ctx, xn, local, wts, mw.experts, ffn, ws.moe);
        } else {
          ops::moe_experts(ctx, xn, ids, wts, mw.experts, ffn, ws.moe);
        }
      }
      // The shared expert is replicated: under EP one rank adds it before the sum.
      if (mw.has_shared && !fused && (sp.ep_size == 1 || sp.ep_rank == 0)) {
        const Tensor sh = rows(ws.shared, m);
        run_mlp(ctx, sink, l, "moe.shared", xn, mw.shared, ws, sh);
        NamedOp op(sink, l, "moe.shared_add",
                   [&] { return costs::elementwise(static_cast<double>(m * H), 2, 1, 1); });
        ops::add_inplace(ctx, ffn, sh);
      }
      if (sp.ep_size > 1) all_reduce(l, "moe.all_reduce", ffn);  // tokens are replicated: combine = sum
    } else {
      run_mlp(ctx, sink, l, "mlp", xn, L.mlp, ws, ffn);
      if (sp.tp_size > 1) all_reduce(l, "mlp.all_reduce", ffn);  // each rank's rows of the intermediate
    }
    if (l + 1 < c.num_hidden_layers) {
      // h += ffn, fused with the next layer's attn_norm.
      NamedOp op(sink, l, "ffn.residual", [&] { return costs::add_rms_norm(m, H); });
      ops::add_rms_norm(ctx, h, ffn, w_.layers[static_cast<size_t>(l) + 1].input_norm, eps, xn);
    } else {
      NamedOp op(sink, l, "ffn.residual",
                 [&] { return costs::elementwise(static_cast<double>(m * H), 2, 1, 1); });
      ops::add_inplace(ctx, h, ffn);
    }
  }

  const int64_t n_out = in.n_logit_rows;
  const Tensor logits = rows(ws.logits, n_out);
  if (n_out == 0) return logits;
  const Tensor last = rows(ws.last, n_out);
  ops::gather_rows(ctx, h, in.logit_rows, last);
  {
    NamedOp op(sink, -1, "final_norm", [&] { return costs::rms_norm(n_out, H); });
    ops::rms_norm(ctx, last, w_.final_norm, eps, last);
  }
  run_linear(ctx, sink, -1, "lm_head", last, w_.lm_head, logits);
  return logits;
}

// The distinct experts of the step's decode tokens: the plain-routing baseline (a second routing when OEA is
// on) and, with OEA, what OEA picked. Reads ids on the host.
void Model::record_stats(const ops::Ctx& ctx, int layer, const StepInputs& in, Workspace& ws,
                         const Tensor& plain, const StepRouting& routing) const {
  const int K = router_.top_k;
  const int64_t m = in.m();
  ops::copy_to_host(ctx, in.decode_mask, ws.host_mask.data(), static_cast<size_t>(m));
  const int32_t* oea_ids = ws.host_ids.data();
  const int32_t* base_ids = oea_ids;
  if (plain.raw() != nullptr) {
    ops::copy_to_host(ctx, plain, ws.host_plain_ids.data(), static_cast<size_t>(m) * K * sizeof(int32_t));
    base_ids = ws.host_plain_ids.data();
  }
  std::vector<int32_t>& dec = ws.host_dec;
  auto decode_ids = [&](const int32_t* src) {
    dec.clear();
    for (int64_t i = 0; i < m; ++i)
      if (ws.host_mask[static_cast<size_t>(i)]) dec.insert(dec.end(), src + i * K, src + (i + 1) * K);
    return static_cast<int>(dec.size() / static_cast<size_t>(K));
  };
  int n = decode_ids(base_ids);
  routing.expert_stats->record_batch(layer, moe::RoutingKind::Baseline, dec.data(), n, K);
  if (!routing.oea.enabled) return;
  n = decode_ids(oea_ids);
  routing.expert_stats->record_batch(layer, moe::RoutingKind::Oea, dec.data(), n, K);
}

}  // namespace ms::model
