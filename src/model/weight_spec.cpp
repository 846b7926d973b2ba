#include "model/weight_spec.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ms::model {

using io::ModelConfig;
using io::QuantConfig;
using io::WeightFormat;

const char* weight_role_name(WeightRole r) {
  switch (r) {
    case WeightRole::Embedding:
      return "embedding";
    case WeightRole::Attention:
      return "attention";
    case WeightRole::Indexer:
      return "indexer";
    case WeightRole::Router:
      return "router";
    case WeightRole::Expert:
      return "expert";
    case WeightRole::SharedExpert:
      return "shared_expert";
    case WeightRole::DenseMlp:
      return "dense_mlp";
    case WeightRole::Norm:
      return "norm";
    case WeightRole::LmHead:
      return "lm_head";
    case WeightRole::MtpProj:
      return "mtp_proj";
  }
  return "?";
}

DType unquantized_dtype(const ModelConfig& cfg) {
  if (cfg.torch_dtype == "float16") return DType::F16;
  if (cfg.torch_dtype == "float32") return DType::F32;
  return DType::BF16;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

class SpecBuilder {
 public:
  SpecBuilder(const ModelConfig& cfg, const QuantConfig& quant)
      : cfg_(cfg), quant_(quant), wdtype_(unquantized_dtype(cfg)) {}

  std::vector<WeightSpec> specs;
  int layer = -1;
  bool mtp = false;

  void plain(const std::string& name, Shape shape, DType dtype, WeightRole role, int expert = -1) {
    WeightSpec s;
    s.name = name;
    s.params = shape_numel(shape);
    s.shape = std::move(shape);
    s.dtype = dtype;
    s.role = role;
    s.layer = layer;
    s.expert = expert;
    s.mtp = mtp;
    specs.push_back(std::move(s));
  }
  void norm(const std::string& module, int64_t n, WeightRole role = WeightRole::Norm) {
    plain(module + ".weight", {n}, wdtype_, role);
  }

  // A linear layer y = x W^T, W [out, in], stored as the quantization config says. `quantizable` is false for
  // modules no checkpoint quantizes whatever the config (none today besides the router, which is not a
  // linear module in these models).
  void linear(const std::string& module, int64_t out, int64_t in, WeightRole role, bool bias = false,
              int expert = -1) {
    bool q = quant_.is_quantized(module);
    auto add = [&](const std::string& suffix, Shape shape, DType dtype, int64_t params) {
      WeightSpec s;
      s.name = module + suffix;
      s.module = module;
      s.shape = std::move(shape);
      s.dtype = dtype;
      s.role = role;
      s.layer = layer;
      s.expert = expert;
      s.mtp = mtp;
      s.quantized = q && suffix != ".bias";
      s.params = params;
      specs.push_back(std::move(s));
    };
    if (!q) {
      add(".weight", {out, in}, wdtype_, out * in);
    } else if (quant_.format == WeightFormat::NVFP4) {
      int64_t g = quant_.group_size;
      if (in % g != 0)
        MS_THROW("{}: input width {} is not a multiple of the NVFP4 block {}; exclude it from quantization",
                 module, in, g);
      add(".weight", {out, in / 2}, DType::U8, out * in);
      add(".weight_scale", {out, in / g}, DType::F8_E4M3, 0);
      add(".weight_scale_2", {}, DType::F32, 0);
      add(".input_scale", {}, DType::F32, 0);
    } else {
      add(".weight", {out, in}, DType::F8_E4M3, out * in);
      add(".weight_scale_inv",
          {ceil_div(out, quant_.weight_block_rows), ceil_div(in, quant_.weight_block_cols)}, DType::F32, 0);
    }
    if (bias) add(".bias", {out}, wdtype_, out);
  }

  void decoder_layer(int i, bool moe) {
    layer = i;
    const ModelConfig& c = cfg_;
    const int64_t H = c.hidden_size, nh = c.num_attention_heads;
    const std::string p = fmt::format("model.layers.{}.", i);
    norm(p + "input_layernorm", H);
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank) {
      linear(a + "q_a_proj", *c.q_lora_rank, H, WeightRole::Attention, c.attention_bias);
      norm(a + "q_a_layernorm", *c.q_lora_rank, WeightRole::Attention);
      linear(a + "q_b_proj", nh * c.qk_head_dim(), *c.q_lora_rank, WeightRole::Attention);
    } else {
      linear(a + "q_proj", nh * c.qk_head_dim(), H, WeightRole::Attention);
    }
    linear(a + "kv_a_proj_with_mqa", c.kv_cache_width(), H, WeightRole::Attention, c.attention_bias);
    norm(a + "kv_a_layernorm", c.kv_lora_rank, WeightRole::Attention);
    linear(a + "kv_b_proj", nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, WeightRole::Attention);
    linear(a + "o_proj", H, nh * c.v_head_dim, WeightRole::Attention, c.attention_bias);
    if (c.has_indexer) {
      // Every layer holds indexer weights (the module exists on "shared" layers too, it just is not run).
      const std::string x = a + "indexer.";
      linear(x + "wq_b", int64_t{c.index_n_heads} * c.index_head_dim, *c.q_lora_rank, WeightRole::Indexer);
      linear(x + "wk", c.index_head_dim, H, WeightRole::Indexer);
      plain(x + "k_norm.weight", {c.index_head_dim}, wdtype_, WeightRole::Indexer);  // LayerNorm
      plain(x + "k_norm.bias", {c.index_head_dim}, wdtype_, WeightRole::Indexer);
      linear(x + "weights_proj", c.index_n_heads, H, WeightRole::Indexer);
    }
    norm(p + "post_attention_layernorm", H);
    const std::string m = p + "mlp.";
    if (!moe) {
      mlp(m, c.intermediate_size, WeightRole::DenseMlp);
      return;
    }
    // The router is a plain parameter, never quantized; the correction bias is kept in f32.
    plain(m + "gate.weight", {c.n_routed_experts, H}, wdtype_, WeightRole::Router);
    if (c.topk_method == "noaux_tc")
      plain(m + "gate.e_score_correction_bias", {c.n_routed_experts}, DType::F32, WeightRole::Router);
    for (int e = 0; e < c.n_routed_experts; ++e)
      mlp(fmt::format("{}experts.{}.", m, e), c.moe_intermediate_size, WeightRole::Expert, e);
    if (c.n_shared_experts > 0)
      mlp(m + "shared_experts.", c.moe_intermediate_size * c.n_shared_experts, WeightRole::SharedExpert);
  }

  void mlp(const std::string& prefix, int64_t inter, WeightRole role, int expert = -1) {
    const int64_t H = cfg_.hidden_size;
    linear(prefix + "gate_proj", inter, H, role, false, expert);
    linear(prefix + "up_proj", inter, H, role, false, expert);
    linear(prefix + "down_proj", H, inter, role, false, expert);
  }

 private:
  const ModelConfig& cfg_;
  const QuantConfig& quant_;
  DType wdtype_;
};

bool is_expert(const WeightSpec& s) {
  return s.role == WeightRole::Expert;
}

}  // namespace

std::vector<WeightSpec> model_weight_specs(const ModelConfig& cfg, const QuantConfig& quant) {
  MS_CHECK(static_cast<int>(cfg.layer_is_moe.size()) == cfg.num_hidden_layers,
           "layer_is_moe has {} entries for {} layers", cfg.layer_is_moe.size(), cfg.num_hidden_layers);
  SpecBuilder b(cfg, quant);
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  b.plain("model.embed_tokens.weight", {V, H}, unquantized_dtype(cfg), WeightRole::Embedding);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) b.decoder_layer(i, cfg.layer_is_moe[i]);
  b.layer = -1;
  b.norm("model.norm", H);
  if (!cfg.tie_word_embeddings) b.linear("lm_head", V, H, WeightRole::LmHead);
  // MTP layers (DeepSeek-V3 layout): a full MoE decoder layer plus enorm / hnorm / eh_proj [H, 2H] and a
  // shared_head (norm + head) and its own copy of the embedding.
  b.mtp = true;
  for (int k = 0; k < cfg.num_nextn_predict_layers; ++k) {
    int i = cfg.num_hidden_layers + k;
    b.decoder_layer(i, cfg.n_routed_experts > 0);
    const std::string p = fmt::format("model.layers.{}.", i);
    b.plain(p + "embed_tokens.weight", {V, H}, unquantized_dtype(cfg), WeightRole::Embedding);
    b.norm(p + "enorm", H);
    b.norm(p + "hnorm", H);
    b.linear(p + "eh_proj", H, 2 * H, WeightRole::MtpProj);
    b.norm(p + "shared_head.norm", H);
    b.linear(p + "shared_head.head", V, H, WeightRole::LmHead);
  }
  return std::move(b.specs);
}

int64_t params_total(const std::vector<WeightSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs)
    if (!s.mtp) n += s.params;
  return n;
}

int64_t mtp_params(const std::vector<WeightSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs)
    if (s.mtp) n += s.params;
  return n;
}

namespace {
// Routed-expert totals per layer; each MoE layer holds n_routed_experts experts of equal size.
template <typename F>
uint64_t expert_share(const ModelConfig& cfg, const std::vector<WeightSpec>& specs, F value) {
  std::map<int, uint64_t> per_layer;
  for (const auto& s : specs)
    if (!s.mtp && is_expert(s)) per_layer[s.layer] += value(s);
  uint64_t total = 0;
  for (auto& [layer, v] : per_layer) {
    MS_CHECK(v % cfg.n_routed_experts == 0, "layer {}: expert sizes differ", layer);
    total += v / cfg.n_routed_experts * cfg.num_experts_per_tok;
  }
  return total;
}
}  // namespace

int64_t params_active_per_token(const ModelConfig& cfg, const std::vector<WeightSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs) {
    if (s.mtp || is_expert(s)) continue;
    if (s.role == WeightRole::Embedding && !cfg.tie_word_embeddings)
      n += cfg.hidden_size;  // one row is looked up
    else
      n += s.params;
  }
  return n + static_cast<int64_t>(expert_share(cfg, specs, [](const WeightSpec& s) { return s.params; }));
}

uint64_t kv_bytes_per_token(const ModelConfig& cfg, DType kv_dtype) {
  uint64_t latent = dtype_bytes(kv_dtype, static_cast<size_t>(cfg.kv_cache_width()));
  uint64_t total = latent * static_cast<uint64_t>(cfg.num_hidden_layers);
  if (cfg.has_indexer)
    total += dtype_bytes(kv_dtype, static_cast<size_t>(cfg.index_head_dim)) *
             static_cast<uint64_t>(cfg.num_full_indexer_layers());
  return total;
}

uint64_t decode_floor_bytes(const ModelConfig& cfg, const std::vector<WeightSpec>& specs) {
  uint64_t n = 0;
  for (const auto& s : specs) {
    if (s.mtp || is_expert(s)) continue;
    if (s.role == WeightRole::Embedding && !cfg.tie_word_embeddings)
      n += s.nbytes() / static_cast<uint64_t>(cfg.vocab_size);  // one row
    else
      n += s.nbytes();
  }
  return n + expert_share(cfg, specs, [](const WeightSpec& s) { return s.nbytes(); });
}

std::map<std::string, uint64_t> bytes_by_dtype(const std::vector<WeightSpec>& specs, bool include_mtp) {
  std::map<std::string, uint64_t> out;
  for (const auto& s : specs)
    if (include_mtp || !s.mtp) out[std::string(dtype_name(s.dtype))] += s.nbytes();
  return out;
}

std::map<std::string, int64_t> params_by_role(const std::vector<WeightSpec>& specs) {
  std::map<std::string, int64_t> out;
  for (const auto& s : specs)
    if (!s.mtp) out[weight_role_name(s.role)] += s.params;
  return out;
}

dist::WeightBytes parallel_weight_bytes(const ModelConfig& cfg, const QuantConfig& quant, DType kv_dtype) {
  dist::WeightBytes w;
  const char* fmt_name = quant.format == WeightFormat::NVFP4      ? "nvfp4"
                         : quant.format == WeightFormat::FP8Block ? "fp8_block"
                                                                  : "bf16";
  w.label = fmt::format("{} {}", cfg.model_type, fmt_name);
  w.n_routed_experts = cfg.n_routed_experts;
  w.num_attention_heads = cfg.num_attention_heads;
  w.hidden_size = cfg.hidden_size;
  w.vocab_size = cfg.vocab_size;
  w.kv_bytes_per_token = kv_bytes_per_token(cfg, kv_dtype);
  auto ends_with = [](const std::string& x, std::string_view tail) {
    return x.size() >= tail.size() && x.compare(x.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const auto& s : model_weight_specs(cfg, quant)) {
    if (s.mtp) continue;
    const uint64_t b = s.nbytes();
    switch (s.role) {
      case WeightRole::Embedding:
        w.embedding += b;
        break;
      case WeightRole::LmHead:
        w.lm_head += b;
        break;
      case WeightRole::Norm:
        w.norms += b;
        break;
      case WeightRole::Router:
        w.router += b;
        break;
      case WeightRole::Expert:
        w.routed_experts += b;
        break;
      case WeightRole::SharedExpert:
        w.shared_expert += b;
        break;
      case WeightRole::DenseMlp:
        w.dense_mlp += b;
        break;
      case WeightRole::Attention:
      case WeightRole::Indexer: {
        const std::string& m = s.module;
        const bool by_heads =
            !ends_with(s.name, ".bias") && (ends_with(m, ".q_b_proj") || ends_with(m, ".q_proj") ||
                                            ends_with(m, ".kv_b_proj") || ends_with(m, ".o_proj"));
        (by_heads ? w.attention_heads : w.attention_shared) += b;
        break;
      }
      case WeightRole::MtpProj:
        break;
    }
  }
  return w;
}

}  // namespace ms::model
