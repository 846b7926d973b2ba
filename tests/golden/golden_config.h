// Test-local reading of the fixtures' config.json into io::ModelConfig (the fields these fixtures use), so
// the parity tests do not depend on the config parser under construction in io/.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_config.h"

namespace ms::test {

inline io::ModelConfig golden_config(const std::string& path) {
  std::ifstream f(path);
  nlohmann::json j = nlohmann::json::parse(f);
  io::ModelConfig c;
  c.model_type = j["model_type"];
  c.arch = c.model_type == "glm_moe_dsa" ? io::ModelArch::GlmMoeDsa : io::ModelArch::DeepseekV3;
  c.vocab_size = j["vocab_size"];
  c.hidden_size = j["hidden_size"];
  c.intermediate_size = j["intermediate_size"];
  c.moe_intermediate_size = j["moe_intermediate_size"];
  c.num_hidden_layers = j["num_hidden_layers"];
  c.num_attention_heads = j["num_attention_heads"];
  c.rms_norm_eps = j["rms_norm_eps"];
  c.max_position_embeddings = j["max_position_embeddings"];
  if (!j["q_lora_rank"].is_null()) c.q_lora_rank = j["q_lora_rank"].get<int64_t>();
  c.kv_lora_rank = j["kv_lora_rank"];
  c.qk_nope_head_dim = j["qk_nope_head_dim"];
  c.qk_rope_head_dim = j["qk_rope_head_dim"];
  c.v_head_dim = j["v_head_dim"];
  const auto& rp = j["rope_parameters"];
  c.rope.theta = rp["rope_theta"];
  c.rope.interleaved = j.value("rope_interleave", true);  // both configs default to true
  if (rp.value("rope_type", "default") == "yarn") {
    c.rope.type = io::RopeType::Yarn;
    c.rope.factor = rp["factor"];
    c.rope.original_max_position_embeddings = rp["original_max_position_embeddings"];
    c.rope.beta_fast = rp.value("beta_fast", 32.0);
    c.rope.beta_slow = rp.value("beta_slow", 1.0);
    c.rope.mscale = rp.value("mscale", 1.0);
    c.rope.mscale_all_dim = rp.value("mscale_all_dim", 0.0);
  }
  c.n_routed_experts = j["n_routed_experts"];
  c.num_experts_per_tok = j["num_experts_per_tok"];
  c.n_shared_experts = j["n_shared_experts"];
  c.n_group = j["n_group"];
  c.topk_group = j["topk_group"];
  c.norm_topk_prob = j["norm_topk_prob"];
  c.routed_scaling_factor = j["routed_scaling_factor"];
  for (int l = 0; l < c.num_hidden_layers; ++l)
    c.layer_is_moe.push_back(j.contains("mlp_layer_types") && !j["mlp_layer_types"].is_null()
                                 ? j["mlp_layer_types"][l] == "sparse"
                                 : l >= j.value("first_k_dense_replace", 0));
  if (j.contains("index_topk") && !j["index_topk"].is_null()) {
    c.has_indexer = true;
    c.index_n_heads = j["index_n_heads"];
    c.index_head_dim = j["index_head_dim"];
    c.index_topk = j["index_topk"];
    for (const auto& t : j["indexer_types"])
      c.indexer_types.push_back(t == "shared" ? io::IndexerKind::Shared : io::IndexerKind::Full);
  }
  for (const auto& e : j["eos_token_id"]) c.eos_token_ids.push_back(e);
  return c;
}

}  // namespace ms::test
