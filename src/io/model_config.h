// config.json of a Hugging Face checkpoint -> ModelConfig, for the DeepSeek-V3 family:
// deepseek_v3, deepseek_v32, glm_moe_dsa (GLM-5) and kimi_k2 (DeepSeek-V3 layout).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ms::io {

enum class ModelArch { DeepseekV3, DeepseekV32, GlmMoeDsa, KimiK2 };
enum class RopeType { Default, Yarn };
enum class IndexerKind {
  Full,
  Shared
};  // DSA: "full" runs the indexer, "shared" reuses the last full layer's

struct RopeConfig {
  RopeType type = RopeType::Default;
  double theta = 10000.0;
  bool interleaved = true;  // rope_interleave: pairs (2i, 2i+1) rotate together (else halves i, i+d/2)
  // YaRN
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

struct ModelConfig {
  std::string model_type;  // as written in config.json
  ModelArch arch = ModelArch::DeepseekV3;

  int64_t vocab_size = 0, hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each routed / shared expert
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  bool attention_bias = false;  // q_a_proj / kv_a_proj_with_mqa / o_proj carry a bias
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;

  // MLA
  std::optional<int64_t> q_lora_rank;  // nullopt: q_proj instead of q_a_proj / q_b_proj
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  RopeConfig rope;

  // MoE
  int n_routed_experts = 0, num_experts_per_tok = 0, n_shared_experts = 0;
  int n_group = 1, topk_group = 1;
  std::string scoring_func = "sigmoid";  // sigmoid | softmax
  std::string topk_method = "noaux_tc";  // noaux_tc | greedy | group_limited_greedy
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::vector<bool> layer_is_moe;  // [num_hidden_layers]

  // DSA (deepseek_v32, glm_moe_dsa)
  bool has_indexer = false;
  int index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  std::vector<IndexerKind> indexer_types;  // [num_hidden_layers] when has_indexer
  bool indexer_rope_interleaved = false;   // indexer_rope_interleave: the indexer's own RoPE layout

  int num_nextn_predict_layers = 0;  // MTP layers in the checkpoint (not run)
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::string torch_dtype = "bfloat16";

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kv_cache_width() const { return kv_lora_rank + qk_rope_head_dim; }  // 576 for GLM-5 / DeepSeek-V3
  int num_moe_layers() const;
  int num_full_indexer_layers() const;  // layers that run (and cache keys for) the DSA indexer
  // 1/sqrt(qk_head_dim), times mscale^2 for YaRN with mscale_all_dim.
  double softmax_scale() const;
};

// Parses a config.json object; `source` names the file in error messages.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source = "config.json");
ModelConfig load_model_config(const std::filesystem::path& model_dir);
// A config.json object describing `c` in the Hugging Face spelling of its model_type (rope_theta +
// rope_scaling for the DeepSeek types, rope_parameters for glm_moe_dsa; mlp_layer_types and indexer_types
// written out); parse_model_config(model_config_to_json(c)) gives back c.
nlohmann::json model_config_to_json(const ModelConfig& c);
const char* model_arch_name(ModelArch arch);
// The model types parse_model_config accepts.
const std::vector<std::string>& supported_model_types();

}  // namespace ms::io
