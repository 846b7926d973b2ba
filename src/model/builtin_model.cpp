#include "model/builtin_model.h"

#include <fmt/format.h>

#include <cmath>

#include "model/weight_loader.h"
#include "quant/float_formats.h"

namespace ms::model {

namespace {

// splitmix64: a small, portable, deterministic generator.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f; }

 private:
  uint64_t s_;
};

Tensor bf16_tensor(Shape shape, Rng& rng, float amp, float offset = 0.0f) {
  Tensor t = Tensor::empty(std::move(shape), DType::BF16);
  uint16_t* d = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = quant::f32_to_bf16(offset + amp * rng.uniform());
  return t;
}

// Uniform weights with variance 1/in, so activations keep their scale through the layers.
void put_linear(MemorySource& src, const std::string& prefix, int64_t out, int64_t in, Rng& rng) {
  src.put(prefix + ".weight", bf16_tensor({out, in}, rng, std::sqrt(3.0f / static_cast<float>(in))));
}

void put_norm(MemorySource& src, const std::string& name, int64_t n, Rng& rng) {
  src.put(name, bf16_tensor({n}, rng, 0.1f, 1.0f));
}

void put_mlp(MemorySource& src, const std::string& prefix, int64_t hidden, int64_t inter, Rng& rng) {
  put_linear(src, prefix + ".gate_proj", inter, hidden, rng);
  put_linear(src, prefix + ".up_proj", inter, hidden, rng);
  put_linear(src, prefix + ".down_proj", hidden, inter, rng);
}

}  // namespace

io::ModelConfig builtin_model_config() {
  io::ModelConfig c;
  c.model_type = "glm_moe_dsa";
  c.arch = io::ModelArch::GlmMoeDsa;
  c.vocab_size = kBuiltinVocab;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 4096;
  c.q_lora_rank = 64;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.rope.type = io::RopeType::Default;
  c.rope.theta = 10000.0;
  c.rope.interleaved = true;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_shared_experts = 1;
  c.n_group = 1;
  c.topk_group = 1;
  c.scoring_func = "sigmoid";
  c.topk_method = "noaux_tc";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.layer_is_moe = {false, true, true};
  c.has_indexer = true;
  c.index_n_heads = 4;
  c.index_head_dim = 32;
  c.index_topk = 16;
  c.indexer_types = {io::IndexerKind::Full, io::IndexerKind::Shared, io::IndexerKind::Full};
  c.torch_dtype = "bfloat16";
  return c;
}

std::unique_ptr<MemorySource> builtin_model_weights(const io::ModelConfig& c, uint64_t seed) {
  auto src = std::make_unique<MemorySource>("built-in model");
  Rng rng(seed);
  const int64_t H = c.hidden_size, Hn = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  src->put("model.embed_tokens.weight", bf16_tensor({c.vocab_size, H}, rng, 1.0f));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}", l), a = p + ".self_attn";
    put_norm(*src, p + ".input_layernorm.weight", H, rng);
    put_norm(*src, p + ".post_attention_layernorm.weight", H, rng);
    put_linear(*src, a + ".q_a_proj", *c.q_lora_rank, H, rng);
    put_norm(*src, a + ".q_a_layernorm.weight", *c.q_lora_rank, rng);
    put_linear(*src, a + ".q_b_proj", Hn * (dn + dr), *c.q_lora_rank, rng);
    put_linear(*src, a + ".kv_a_proj_with_mqa", r + dr, H, rng);
    put_norm(*src, a + ".kv_a_layernorm.weight", r, rng);
    put_linear(*src, a + ".kv_b_proj", Hn * (dn + dv), r, rng);
    put_linear(*src, a + ".o_proj", H, Hn * dv, rng);
    if (c.has_indexer) {
      const std::string ip = a + ".indexer";
      put_linear(*src, ip + ".wq_b", c.index_n_heads * c.index_head_dim, *c.q_lora_rank, rng);
      put_linear(*src, ip + ".wk", c.index_head_dim, H, rng);
      put_norm(*src, ip + ".k_norm.weight", c.index_head_dim, rng);
      src->put(ip + ".k_norm.bias", bf16_tensor({c.index_head_dim}, rng, 0.1f));
      put_linear(*src, ip + ".weights_proj", c.index_n_heads, H, rng);
    }
    if (c.layer_is_moe[static_cast<size_t>(l)]) {
      const std::string mp = p + ".mlp";
      put_linear(*src, mp + ".gate", c.n_routed_experts, H, rng);
      Tensor bias = Tensor::empty({c.n_routed_experts}, DType::F32);
      for (int e = 0; e < c.n_routed_experts; ++e) bias.data<float>()[e] = 0.05f * rng.uniform();
      src->put(mp + ".gate.e_score_correction_bias", bias);
      for (int e = 0; e < c.n_routed_experts; ++e)
        put_mlp(*src, fmt::format("{}.experts.{}", mp, e), H, c.moe_intermediate_size, rng);
      put_mlp(*src, mp + ".shared_experts", H, c.moe_intermediate_size * c.n_shared_experts, rng);
    } else {
      put_mlp(*src, p + ".mlp", H, c.intermediate_size, rng);
    }
  }
  put_norm(*src, "model.norm.weight", H, rng);
  put_linear(*src, "lm_head", c.vocab_size, H, rng);
  return src;
}

std::unique_ptr<Model> make_builtin_model() {
  io::ModelConfig cfg = builtin_model_config();
  auto src = builtin_model_weights(cfg);
  ModelWeights w = load_weights(cfg, *src);
  return std::make_unique<Model>(std::move(cfg), std::move(w));
}

}  // namespace ms::model
