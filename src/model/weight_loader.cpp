#include "model/weight_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "quant/float_formats.h"
#include "quant/nvfp4.h"

namespace ms::model {

namespace {

Tensor require(const TensorSource& src, const std::string& name) {
  if (!src.contains(name)) MS_THROW("{}: tensor '{}' is missing", src.describe(), name);
  return src.tensor(name);
}

void check_shape(const TensorSource& src, const std::string& name, const Tensor& t, const Shape& want) {
  if (t.shape() != want)
    MS_THROW("{}: tensor '{}' has shape {}, expected {}", src.describe(), name, shape_str(t.shape()),
             shape_str(want));
}

void check_dtype(const TensorSource& src, const std::string& name, const Tensor& t, DType want) {
  if (t.dtype() != want)
    MS_THROW("{}: tensor '{}' has dtype {}, expected {}", src.describe(), name, dtype_name(t.dtype()),
             dtype_name(want));
}

// A small vector (norm weight, bias) as an owned f32 copy.
Tensor load_vector(const TensorSource& src, const std::string& name, int64_t n) {
  Tensor t = require(src, name);
  check_shape(src, name, t, {n});
  Tensor out = Tensor::empty({n}, DType::F32);
  float* o = out.data<float>();
  switch (t.dtype()) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) o[i] = t.data<float>()[i];
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) o[i] = quant::bf16_to_f32(t.data<uint16_t>()[i]);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) o[i] = quant::f16_to_f32(t.data<uint16_t>()[i]);
      break;
    default:
      MS_THROW("{}: tensor '{}' has dtype {}, expected f32, bf16 or f16", src.describe(), name,
               dtype_name(t.dtype()));
  }
  return out;
}

float load_scalar(const TensorSource& src, const std::string& name) {
  Tensor t = require(src, name);
  check_dtype(src, name, t, DType::F32);
  if (t.numel() != 1)
    MS_THROW("{}: tensor '{}' has shape {}, expected a scalar", src.describe(), name, shape_str(t.shape()));
  return t.data<float>()[0];
}

// The FP8 KV cache scale of layer `l`, by the names ModelOpt and vLLM use, k_scale first; nullopt when the
// layer has none. Refuses a scale that is not one positive finite f32.
std::optional<float> load_kv_scale(const TensorSource& src, int l) {
  const std::string ap = fmt::format("model.layers.{}.self_attn", l);
  for (const std::string& name :
       {ap + ".k_proj.k_scale", ap + ".attn.k_scale", ap + ".v_proj.v_scale", ap + ".attn.v_scale"}) {
    if (!src.contains(name)) continue;
    const float s = load_scalar(src, name);
    if (!std::isfinite(s) || s <= 0)
      MS_THROW("{}: tensor '{}' is {}, a KV cache scale must be positive and finite", src.describe(), name,
               s);
    return s;
  }
  return std::nullopt;
}

MlpWeights load_mlp(const TensorSource& src, const std::string& prefix, int64_t hidden, int64_t inter) {
  MlpWeights m;
  m.gate = load_linear(src, prefix + ".gate_proj", inter, hidden);
  m.up = load_linear(src, prefix + ".up_proj", inter, hidden);
  m.down = load_linear(src, prefix + ".down_proj", hidden, inter);
  return m;
}

// Part `part` of `parts` of a dense MLP: rows of gate / up, the same columns of down.
MlpWeights shard_mlp(MlpWeights m, int part, int parts) {
  if (parts == 1) return m;
  const int64_t n = m.gate.out / parts, r0 = n * part;
  m.gate = slice_rows(m.gate, r0, r0 + n);
  m.up = slice_rows(m.up, r0, r0 + n);
  m.down = slice_cols(m.down, r0, r0 + n);
  return m;
}

// The quantization block a cut must fall on, along rows (dim 0) or columns (dim 1).
int64_t cut_block(const ops::LinearWeight& w, int dim) {
  switch (w.format) {
    case ops::WeightFormat::FP8Block:
      return w.block;
    case ops::WeightFormat::NVFP4:
      return dim == 0 ? 1 : quant::kNvfp4Block;
    default:
      return 1;
  }
}

void check_cut(const ops::LinearWeight& w, int dim, int64_t a, int64_t b) {
  const int64_t n = dim == 0 ? w.out : w.in, blk = cut_block(w, dim);
  MS_CHECK(0 <= a && a < b && b <= n, "{}: slice [{}, {}) of {} {}", w.name, a, b, n,
           dim == 0 ? "rows" : "columns");
  MS_CHECK(a % blk == 0 && (b % blk == 0 || b == n),
           "{}: a {} weight cannot be split at {} [{}, {}): cuts must fall on its {}-wide blocks", w.name,
           ops::weight_format_name(w.format), dim == 0 ? "rows" : "columns", a, b, blk);
}

}  // namespace

ops::LinearWeight slice_rows(const ops::LinearWeight& w, int64_t r0, int64_t r1) {
  check_cut(w, 0, r0, r1);
  ops::LinearWeight s = w;
  s.out = r1 - r0;
  s.weight = w.weight.slice(0, r0, r1);
  if (w.format == ops::WeightFormat::FP8Block)
    s.scale = w.scale.slice(0, r0 / w.block, (r1 + w.block - 1) / w.block);
  else if (w.format == ops::WeightFormat::NVFP4)
    s.scale = w.scale.slice(0, r0, r1);
  return s;
}

ops::LinearWeight slice_cols(const ops::LinearWeight& w, int64_t c0, int64_t c1) {
  check_cut(w, 1, c0, c1);
  ops::LinearWeight s = w;
  s.in = c1 - c0;
  switch (w.format) {
    case ops::WeightFormat::FP8Block:
      s.weight = w.weight.slice(1, c0, c1).clone();
      s.scale = w.scale.slice(1, c0 / w.block, (c1 + w.block - 1) / w.block).clone();
      break;
    case ops::WeightFormat::NVFP4:
      s.weight = w.weight.slice(1, c0 / 2, c1 / 2).clone();
      s.scale = w.scale.slice(1, c0 / quant::kNvfp4Block, c1 / quant::kNvfp4Block).clone();
      break;
    default:
      s.weight = w.weight.slice(1, c0, c1).clone();
  }
  return s;
}

void check_shard(const io::ModelConfig& c, const dist::ShardSpec& s) {
  MS_CHECK(s.tp_size >= 1 && s.tp_rank >= 0 && s.tp_rank < s.tp_size, "shard: tp rank {} of {}", s.tp_rank,
           s.tp_size);
  MS_CHECK(s.ep_size >= 1 && s.ep_rank >= 0 && s.ep_rank < s.ep_size, "shard: ep rank {} of {}", s.ep_rank,
           s.ep_size);
  if (s.tp_size > 1) {
    if (c.num_attention_heads % s.tp_size != 0)
      MS_THROW("--tp-size {} does not divide num_attention_heads {} (attention is split by heads)", s.tp_size,
               c.num_attention_heads);
    bool dense = false;
    for (bool moe : c.layer_is_moe) dense = dense || !moe;
    if (dense && c.intermediate_size % s.tp_size != 0)
      MS_THROW("--tp-size {} does not divide intermediate_size {} (dense MLPs are split by rows)", s.tp_size,
               c.intermediate_size);
  }
  if (s.ep_size > 1 && c.n_routed_experts % s.ep_size != 0)
    MS_THROW(
        "--ep-size {} does not divide n_routed_experts {} (use --ep-num-redundant-experts or another size)",
        s.ep_size, c.n_routed_experts);
}

io::ModelConfig shard_config(const io::ModelConfig& cfg, const dist::ShardSpec& s) {
  io::ModelConfig c = cfg;
  c.num_attention_heads = cfg.num_attention_heads / s.tp_size;
  c.intermediate_size = cfg.intermediate_size / s.tp_size;
  return c;
}

ops::LinearWeight load_linear(const TensorSource& src, const std::string& prefix, int64_t out, int64_t in) {
  ops::LinearWeight w;
  w.name = prefix;
  w.out = out;
  w.in = in;
  const std::string wname = prefix + ".weight";
  w.weight = require(src, wname);
  switch (w.weight.dtype()) {
    case DType::BF16:
    case DType::F32:
      w.format = w.weight.dtype() == DType::BF16 ? ops::WeightFormat::BF16 : ops::WeightFormat::F32;
      check_shape(src, wname, w.weight, {out, in});
      break;
    case DType::F8_E4M3: {
      w.format = ops::WeightFormat::FP8Block;
      check_shape(src, wname, w.weight, {out, in});
      const std::string sname = prefix + ".weight_scale_inv";
      w.scale = require(src, sname);
      check_dtype(src, sname, w.scale, DType::F32);
      check_shape(src, sname, w.scale, {(out + w.block - 1) / w.block, (in + w.block - 1) / w.block});
      break;
    }
    case DType::U8: {
      w.format = ops::WeightFormat::NVFP4;
      if (in % quant::kNvfp4Block != 0)
        MS_THROW("{}: tensor '{}' is nvfp4 but {} inputs are not a multiple of {}", src.describe(), wname, in,
                 quant::kNvfp4Block);
      check_shape(src, wname, w.weight, {out, in / 2});
      const std::string sname = prefix + ".weight_scale";
      w.scale = require(src, sname);
      check_dtype(src, sname, w.scale, DType::F8_E4M3);
      check_shape(src, sname, w.scale, {out, in / quant::kNvfp4Block});
      w.scale2 = load_scalar(src, prefix + ".weight_scale_2");
      break;
    }
    default:
      MS_THROW(
          "{}: tensor '{}' has dtype {}, expected bf16, f32, fp8_e4m3 (+ weight_scale_inv) or u8 nvfp4 "
          "(+ weight_scale, weight_scale_2)",
          src.describe(), wname, dtype_name(w.weight.dtype()));
  }
  MS_CHECK(w.weight.is_contiguous(), "{}: tensor '{}' is not contiguous", src.describe(), wname);
  return w;
}

std::vector<bool> layers_with_indexer_weights(const io::ModelConfig& c) {
  std::vector<bool> out(static_cast<size_t>(std::max(c.num_hidden_layers, 0)), false);
  bool seen_full = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    // A `shared` indexer layer reuses the last full layer's selection and has no indexer weights of its own
    // (unless no full layer precedes it).
    const bool shared = c.has_indexer && !c.indexer_types.empty() &&
                        c.indexer_types[static_cast<size_t>(l)] == io::IndexerKind::Shared && seen_full;
    if (c.has_indexer && !shared) {
      seen_full = true;
      out[static_cast<size_t>(l)] = true;
    }
  }
  return out;
}

ModelWeights load_weights(const io::ModelConfig& c, const TensorSource& src, const WeightShard& shard) {
  const dist::ShardSpec& sp = shard.spec;
  if (sp.sharded()) check_shard(c, sp);
  MS_CHECK(
      c.hidden_size > 0 && c.vocab_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0,
      "model config: hidden_size, vocab_size, num_hidden_layers and num_attention_heads must be positive");
  MS_CHECK(static_cast<int>(c.layer_is_moe.size()) == c.num_hidden_layers,
           "model config: layer_is_moe has {} entries for {} layers", c.layer_is_moe.size(),
           c.num_hidden_layers);
  const int64_t H = c.hidden_size, Hn = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  ModelWeights w;
  w.shard = sp;
  if (sp.ep_size > 1 && shard.placement) {
    std::vector<int> moe_layers;
    for (int l = 0; l < c.num_hidden_layers; ++l)
      if (c.layer_is_moe[static_cast<size_t>(l)]) moe_layers.push_back(l);
    shard.placement->check(c.n_routed_experts, sp.ep_size, moe_layers);
  }
  // Heads [h0, h0 + hl) of this rank.
  const int64_t hl = Hn / sp.tp_size, h0 = hl * sp.tp_rank;
  auto heads_rows = [&](ops::LinearWeight lw, int64_t per_head) {
    return sp.tp_size == 1 ? lw : slice_rows(lw, h0 * per_head, (h0 + hl) * per_head);
  };
  w.embed = load_linear(src, "model.embed_tokens", c.vocab_size, H);
  const std::vector<bool> indexer_weights = layers_with_indexer_weights(c);
  MS_CHECK(w.embed.format == ops::WeightFormat::BF16 || w.embed.format == ops::WeightFormat::F32,
           "{}: model.embed_tokens.weight must be bf16 or f32", src.describe());
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}", l);
    LayerWeights L;
    L.input_norm = load_vector(src, p + ".input_layernorm.weight", H);
    L.post_attn_norm = load_vector(src, p + ".post_attention_layernorm.weight", H);
    AttentionWeights& a = L.attn;
    const std::string ap = p + ".self_attn";
    if (c.q_lora_rank) {
      a.q_a_proj = load_linear(src, ap + ".q_a_proj", *c.q_lora_rank, H);
      a.q_a_norm = load_vector(src, ap + ".q_a_layernorm.weight", *c.q_lora_rank);
      a.q_b_proj = heads_rows(load_linear(src, ap + ".q_b_proj", Hn * (dn + dr), *c.q_lora_rank), dn + dr);
    } else {
      a.q_proj = heads_rows(load_linear(src, ap + ".q_proj", Hn * (dn + dr), H), dn + dr);
    }
    a.kv_a_proj = load_linear(src, ap + ".kv_a_proj_with_mqa", r + dr, H);
    a.kv_a_norm = load_vector(src, ap + ".kv_a_layernorm.weight", r);
    a.kv_b_proj = heads_rows(load_linear(src, ap + ".kv_b_proj", Hn * (dn + dv), r), dn + dv);
    a.o_proj = load_linear(src, ap + ".o_proj", H, Hn * dv);
    if (sp.tp_size > 1) a.o_proj = slice_cols(a.o_proj, h0 * dv, (h0 + hl) * dv);
    if (indexer_weights[static_cast<size_t>(l)]) {
      MS_CHECK(c.q_lora_rank.has_value(), "model config: the DSA indexer needs q_lora_rank");
      const std::string ip = ap + ".indexer";
      const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
      a.has_indexer = true;
      a.indexer.wq_b = load_linear(src, ip + ".wq_b", Hi * Di, *c.q_lora_rank);
      a.indexer.wk = load_linear(src, ip + ".wk", Di, H);
      a.indexer.k_norm_weight = load_vector(src, ip + ".k_norm.weight", Di);
      a.indexer.k_norm_bias = load_vector(src, ip + ".k_norm.bias", Di);
      a.indexer.weights_proj = load_linear(src, ip + ".weights_proj", Hi, H);
    }
    L.is_moe = c.layer_is_moe[static_cast<size_t>(l)];
    if (L.is_moe) {
      const std::string mp = p + ".mlp";
      MoeWeights& m = L.moe;
      m.router = load_linear(src, mp + ".gate", c.n_routed_experts, H);
      if (src.contains(mp + ".gate.e_score_correction_bias"))
        m.correction_bias = load_vector(src, mp + ".gate.e_score_correction_bias", c.n_routed_experts);
      else
        MS_CHECK(c.topk_method != "noaux_tc", "{}: tensor '{}' is missing (noaux_tc routing needs it)",
                 src.describe(), mp + ".gate.e_score_correction_bias");
      std::vector<int> all;
      if (sp.ep_size == 1) {
        for (int e = 0; e < c.n_routed_experts; ++e) all.push_back(e);
      } else {
        const dist::ExpertPlacement* lp = shard.placement ? shard.placement->layer(l) : nullptr;
        const dist::ExpertPlacement p =
            lp ? *lp : dist::ExpertPlacement::contiguous(c.n_routed_experts, sp.ep_size);
        m.expert_ids = p.local_experts(sp.ep_rank);
        m.expert_copy_ranks.resize(static_cast<size_t>(c.n_routed_experts));
        for (int e = 0; e < c.n_routed_experts; ++e)
          for (const dist::ExpertSlot& cp : p.replicas(e))
            m.expert_copy_ranks[static_cast<size_t>(e)].push_back(cp.rank);
      }
      const std::vector<int>& mine = sp.ep_size == 1 ? all : m.expert_ids;
      m.experts.reserve(mine.size());
      for (int e : mine) {
        MlpWeights x = load_mlp(src, fmt::format("{}.experts.{}", mp, e), H, c.moe_intermediate_size);
        m.experts.push_back({std::move(x.gate), std::move(x.up), std::move(x.down)});
      }
      if (c.n_shared_experts > 0) {
        m.has_shared = true;
        m.shared = load_mlp(src, mp + ".shared_experts", H, c.moe_intermediate_size * c.n_shared_experts);
      }
    } else {
      L.mlp = shard_mlp(load_mlp(src, p + ".mlp", H, c.intermediate_size), sp.tp_rank, sp.tp_size);
    }
    w.layers.push_back(std::move(L));
    if (const std::optional<float> ks = load_kv_scale(src, l)) {
      MS_CHECK(static_cast<int>(w.kv_scales.size()) == l,
               "{}: layer {} has a KV cache scale but layer {} has none "
               "(model.layers.{}.self_attn.k_proj.k_scale)",
               src.describe(), l, w.kv_scales.size(), w.kv_scales.size());
      w.kv_scales.push_back(*ks);
    } else {
      MS_CHECK(w.kv_scales.empty(),
               "{}: tensor 'model.layers.{}.self_attn.k_proj.k_scale' is missing (layers "
               "before it have KV cache scales)",
               src.describe(), l);
    }
  }
  w.final_norm = load_vector(src, "model.norm.weight", H);
  if (src.contains("lm_head.weight") || !c.tie_word_embeddings)
    w.lm_head = load_linear(src, "lm_head", c.vocab_size, H);
  else
    w.lm_head = w.embed;
  return w;
}

}  // namespace ms::model
