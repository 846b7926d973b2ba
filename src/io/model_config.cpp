#include "io/model_config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace ms::io {

using nlohmann::json;

namespace {

const char* json_type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a float";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Typed access to the fields of one JSON object; every error names the field and the file.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const { return j_.at(key); }
  std::string name(const char* key) const { return prefix_ + key; }
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    MS_THROW("{}: field '{}' {}", source_, name(key), what);
  }

  int64_t to_int(const char* key, const json& v) const {
    if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
    // Some hubs write integral values as floats (e.g. "factor": 40.0 where an int is meant).
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    fail(key, fmt::format("must be an integer, got {}", json_type_name(v)));
  }

  int64_t req_int(const char* key, int64_t min = 0) const {
    if (!j_.contains(key)) fail(key, "is missing");
    int64_t v = to_int(key, j_.at(key));
    if (v < min) fail(key, fmt::format("must be >= {}, got {}", min, v));
    return v;
  }
  int64_t opt_int(const char* key, int64_t def, int64_t min = 0) const {
    if (!has(key)) return def;
    int64_t v = to_int(key, j_.at(key));
    if (v < min) fail(key, fmt::format("must be >= {}, got {}", min, v));
    return v;
  }
  int req_i32(const char* key, int64_t min = 0) const { return narrow(key, req_int(key, min)); }
  int opt_i32(const char* key, int64_t def, int64_t min = 0) const {
    return narrow(key, opt_int(key, def, min));
  }

  double opt_double(const char* key, double def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_number()) fail(key, fmt::format("must be a number, got {}", json_type_name(v)));
    return v.get<double>();
  }
  bool opt_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(key, fmt::format("must be true or false, got {}", json_type_name(v)));
    return v.get<bool>();
  }
  std::string req_string(const char* key) const {
    if (!j_.contains(key)) fail(key, "is missing");
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, fmt::format("must be a string, got {}", json_type_name(v)));
    return v.get<std::string>();
  }
  std::string opt_string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, fmt::format("must be a string, got {}", json_type_name(v)));
    return v.get<std::string>();
  }
  // A list of strings of length n (n < 0: any length).
  std::vector<std::string> string_list(const char* key, int64_t n) const {
    const json& v = j_.at(key);
    if (!v.is_array()) fail(key, fmt::format("must be a list of strings, got {}", json_type_name(v)));
    if (n >= 0 && static_cast<int64_t>(v.size()) != n)
      fail(key, fmt::format("must have one entry per layer ({}), has {}", n, v.size()));
    std::vector<std::string> out;
    for (const auto& e : v) {
      if (!e.is_string()) fail(key, fmt::format("must hold strings, holds {}", json_type_name(e)));
      out.push_back(e.get<std::string>());
    }
    return out;
  }

 private:
  int narrow(const char* key, int64_t v) const {
    if (v > std::numeric_limits<int>::max()) fail(key, fmt::format("is out of range: {}", v));
    return static_cast<int>(v);
  }
  const json& j_;
  std::string source_, prefix_;
};

// Defaults of the Hugging Face config classes, used when a field is absent.
struct ArchDefaults {
  int64_t q_lora_rank;
  int n_group, topk_group;
  double rms_norm_eps;
  int64_t max_position_embeddings;
  int index_n_heads, index_head_dim, index_topk;
  bool has_indexer;
};

ArchDefaults arch_defaults(ModelArch arch) {
  switch (arch) {
    case ModelArch::GlmMoeDsa:
      return {2048, 1, 1, 1e-5, 202752, 32, 128, 2048, true};
    case ModelArch::DeepseekV32:
      return {1536, 8, 4, 1e-6, 4096, 64, 128, 2048, true};
    case ModelArch::KimiK2:
    case ModelArch::DeepseekV3:
      break;
  }
  return {1536, 8, 4, 1e-6, 4096, 0, 0, 0, false};
}

RopeType parse_rope_type(const Fields& f, const char* key, const std::string& t) {
  if (t == "default") return RopeType::Default;
  if (t == "yarn" || t == "deepseek_yarn") return RopeType::Yarn;
  f.fail(key, fmt::format("is '{}'; supported RoPE types: default, yarn", t));
}

// rope_parameters {rope_type, rope_theta, factor, ...} or rope_theta + rope_scaling {type|rope_type, ...}.
RopeConfig parse_rope(const json& j, const std::string& source) {
  Fields top(j, source);
  RopeConfig r;
  r.interleaved = top.opt_bool("rope_interleave", true);
  const json* params = nullptr;
  std::string prefix;
  if (top.has("rope_parameters")) {
    params = &j.at("rope_parameters");
    prefix = "rope_parameters.";
  } else if (top.has("rope_scaling")) {
    params = &j.at("rope_scaling");
    prefix = "rope_scaling.";
  }
  r.theta = top.opt_double("rope_theta", 10000.0);
  if (!params) return r;
  const char* pkey = prefix == "rope_parameters." ? "rope_parameters" : "rope_scaling";
  if (!params->is_object()) top.fail(pkey, fmt::format("must be an object, got {}", json_type_name(*params)));
  Fields p(*params, source, prefix);
  if (p.has("rope_theta")) r.theta = p.opt_double("rope_theta", r.theta);
  std::string type =
      p.has("rope_type") ? p.opt_string("rope_type", "default") : p.opt_string("type", "default");
  r.type = parse_rope_type(p, p.has("rope_type") ? "rope_type" : "type", type);
  if (r.type == RopeType::Yarn) {
    if (!p.has("factor")) p.fail("factor", "is missing (required for yarn)");
    r.factor = p.opt_double("factor", 1.0);
    r.original_max_position_embeddings =
        p.opt_int("original_max_position_embeddings", r.original_max_position_embeddings, 1);
    r.beta_fast = p.opt_double("beta_fast", r.beta_fast);
    r.beta_slow = p.opt_double("beta_slow", r.beta_slow);
    r.mscale = p.opt_double("mscale", r.mscale);
    r.mscale_all_dim = p.opt_double("mscale_all_dim", r.mscale_all_dim);
  }
  if (!(r.theta > 0)) p.fail("rope_theta", fmt::format("must be positive, got {}", r.theta));
  return r;
}

// mlp_layer_types ["dense"|"sparse"] or first_k_dense_replace + moe_layer_freq (DeepSeek's rule).
std::vector<bool> parse_layer_plan(const Fields& f, int layers, int n_routed_experts) {
  std::vector<bool> moe(layers, false);
  if (f.has("mlp_layer_types")) {
    auto types = f.string_list("mlp_layer_types", layers);
    for (int i = 0; i < layers; ++i) {
      if (types[i] == "sparse" || types[i] == "moe")
        moe[i] = true;
      else if (types[i] != "dense")
        f.fail("mlp_layer_types", fmt::format("entry {} is '{}'; expected 'dense' or 'sparse'", i, types[i]));
    }
    return moe;
  }
  int k = f.opt_i32("first_k_dense_replace", 3);
  int freq = f.opt_i32("moe_layer_freq", 1, 1);
  for (int i = 0; i < layers; ++i) moe[i] = n_routed_experts > 0 && i >= k && i % freq == 0;
  return moe;
}

// indexer_types ["full"|"shared"], else index_topk_pattern ("FSSF..." or a list), else the schedule
// full <=> max(i - offset + 1, 0) % freq == 0 with index_topk_freq (default 1) and index_skip_topk_offset
// (default 2), as GlmMoeDsaConfig derives it.
std::vector<IndexerKind> parse_indexer_types(const json& j, const Fields& f, int layers) {
  std::vector<IndexerKind> out;
  auto from_names = [&](const char* key, const std::vector<std::string>& names) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "full")
        out.push_back(IndexerKind::Full);
      else if (names[i] == "shared")
        out.push_back(IndexerKind::Shared);
      else
        f.fail(key, fmt::format("entry {} is '{}'; expected 'full' or 'shared'", i, names[i]));
    }
  };
  if (f.has("indexer_types")) {
    from_names("indexer_types", f.string_list("indexer_types", layers));
  } else if (f.has("index_topk_pattern")) {
    const json& p = j.at("index_topk_pattern");
    if (p.is_string()) {
      std::string s = p.get<std::string>();
      if (static_cast<int>(s.size()) != layers)
        f.fail("index_topk_pattern",
               fmt::format("must have one letter per layer ({}), has {}", layers, s.size()));
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == 'F')
          out.push_back(IndexerKind::Full);
        else if (s[i] == 'S')
          out.push_back(IndexerKind::Shared);
        else
          f.fail("index_topk_pattern", fmt::format("letter {} is '{}'; expected 'F' or 'S'", i, s[i]));
      }
    } else {
      from_names("index_topk_pattern", f.string_list("index_topk_pattern", layers));
    }
  } else {
    int64_t freq = std::max<int64_t>(f.opt_int("index_topk_freq", 1, std::numeric_limits<int64_t>::min()), 1);
    int64_t offset = f.opt_int("index_skip_topk_offset", 2, std::numeric_limits<int64_t>::min());
    for (int i = 0; i < layers; ++i)
      out.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? IndexerKind::Full
                                                                     : IndexerKind::Shared);
  }
  if (!out.empty() && out[0] == IndexerKind::Shared)
    MS_THROW("{}: layer 0 is a 'shared' indexer layer but no earlier layer computes the top-k it would reuse",
             f.source());
  return out;
}

std::vector<int64_t> parse_token_ids(const Fields& f, const json& j, const char* key) {
  std::vector<int64_t> ids;
  if (!f.has(key)) return ids;
  const json& v = j.at(key);
  if (v.is_array()) {
    for (const auto& e : v) ids.push_back(f.to_int(key, e));
  } else {
    ids.push_back(f.to_int(key, v));
  }
  return ids;
}

}  // namespace

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = {"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "kimi_k2"};
  return types;
}

const char* model_arch_name(ModelArch arch) {
  switch (arch) {
    case ModelArch::DeepseekV3:
      return "deepseek_v3";
    case ModelArch::DeepseekV32:
      return "deepseek_v32";
    case ModelArch::GlmMoeDsa:
      return "glm_moe_dsa";
    case ModelArch::KimiK2:
      return "kimi_k2";
  }
  return "?";
}

int ModelConfig::num_moe_layers() const {
  int n = 0;
  for (bool m : layer_is_moe) n += m;
  return n;
}

int ModelConfig::num_full_indexer_layers() const {
  if (!has_indexer) return 0;
  int n = 0;
  for (auto k : indexer_types) n += k == IndexerKind::Full;
  return n;
}

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  // DeepSeek-V3's attention multiplies by yarn_get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is
  // set.
  if (rope.type == RopeType::Yarn && rope.mscale_all_dim != 0.0 && rope.factor > 1.0) {
    double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

ModelConfig parse_model_config(const json& j, const std::string& source) {
  if (!j.is_object()) MS_THROW("{}: expected a JSON object, got {}", source, json_type_name(j));
  Fields f(j, source);
  ModelConfig c;
  c.model_type = f.req_string("model_type");
  if (c.model_type == "deepseek_v3")
    c.arch = ModelArch::DeepseekV3;
  else if (c.model_type == "deepseek_v32")
    c.arch = ModelArch::DeepseekV32;
  else if (c.model_type == "glm_moe_dsa")
    c.arch = ModelArch::GlmMoeDsa;
  else if (c.model_type == "kimi_k2")
    c.arch = ModelArch::KimiK2;
  else {
    std::string list;
    for (const auto& t : supported_model_types()) list += (list.empty() ? "" : ", ") + t;
    MS_THROW("{}: model_type '{}' is not supported; supported model types: {}", source, c.model_type, list);
  }
  ArchDefaults d = arch_defaults(c.arch);

  c.vocab_size = f.req_int("vocab_size", 1);
  c.hidden_size = f.req_int("hidden_size", 1);
  c.intermediate_size = f.req_int("intermediate_size", 1);
  c.num_hidden_layers = f.req_i32("num_hidden_layers", 1);
  c.num_attention_heads = f.req_i32("num_attention_heads", 1);
  c.attention_bias = f.opt_bool("attention_bias", false);
  c.rms_norm_eps = f.opt_double("rms_norm_eps", d.rms_norm_eps);
  c.max_position_embeddings = f.opt_int("max_position_embeddings", d.max_position_embeddings, 1);
  c.tie_word_embeddings = f.opt_bool("tie_word_embeddings", false);
  std::string act = f.opt_string("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act", fmt::format("is '{}'; only 'silu' is supported", act));

  // MLA
  if (!j.contains("q_lora_rank"))
    c.q_lora_rank = d.q_lora_rank;
  else if (!j.at("q_lora_rank").is_null())
    c.q_lora_rank = f.req_int("q_lora_rank", 1);
  c.kv_lora_rank = f.req_int("kv_lora_rank", 1);
  c.qk_nope_head_dim = f.req_int("qk_nope_head_dim", 0);
  c.qk_rope_head_dim = f.req_int("qk_rope_head_dim", 0);
  c.v_head_dim = f.req_int("v_head_dim", 1);
  if (c.qk_head_dim() <= 0) f.fail("qk_nope_head_dim", "plus qk_rope_head_dim must be positive");
  if (c.qk_rope_head_dim % 2 != 0)
    f.fail("qk_rope_head_dim", fmt::format("must be even (RoPE rotates pairs), got {}", c.qk_rope_head_dim));
  c.rope = parse_rope(j, source);

  // MoE
  c.n_routed_experts = f.req_i32("n_routed_experts", 1);
  c.num_experts_per_tok = f.req_i32("num_experts_per_tok", 1);
  c.moe_intermediate_size = f.req_int("moe_intermediate_size", 1);
  if (c.num_experts_per_tok > c.n_routed_experts)
    f.fail("num_experts_per_tok",
           fmt::format("({}) exceeds n_routed_experts ({})", c.num_experts_per_tok, c.n_routed_experts));
  c.n_shared_experts = f.opt_i32("n_shared_experts", 1);
  c.n_group = f.opt_i32("n_group", d.n_group, 1);
  c.topk_group = f.opt_i32("topk_group", d.topk_group, 1);
  if (c.n_routed_experts % c.n_group != 0)
    f.fail("n_group", fmt::format("({}) must divide n_routed_experts ({})", c.n_group, c.n_routed_experts));
  if (c.topk_group > c.n_group)
    f.fail("topk_group", fmt::format("({}) exceeds n_group ({})", c.topk_group, c.n_group));
  c.scoring_func = f.opt_string("scoring_func", "sigmoid");
  if (c.scoring_func != "sigmoid" && c.scoring_func != "softmax")
    f.fail("scoring_func", fmt::format("is '{}'; expected 'sigmoid' or 'softmax'", c.scoring_func));
  c.topk_method = f.opt_string("topk_method", "noaux_tc");
  if (c.topk_method != "noaux_tc" && c.topk_method != "greedy" && c.topk_method != "group_limited_greedy")
    f.fail("topk_method",
           fmt::format("is '{}'; expected 'noaux_tc', 'greedy' or 'group_limited_greedy'", c.topk_method));
  c.norm_topk_prob = f.opt_bool("norm_topk_prob", true);
  c.routed_scaling_factor = f.opt_double("routed_scaling_factor", 2.5);
  c.layer_is_moe = parse_layer_plan(f, c.num_hidden_layers, c.n_routed_experts);

  // DSA
  c.has_indexer = d.has_indexer;
  if (c.has_indexer) {
    c.index_n_heads = f.opt_i32("index_n_heads", d.index_n_heads, 1);
    c.index_head_dim = f.opt_i32("index_head_dim", d.index_head_dim, 1);
    c.index_topk = f.opt_i32("index_topk", d.index_topk, 1);
    if (c.index_head_dim < c.qk_rope_head_dim)
      f.fail("index_head_dim",
             fmt::format("({}) is smaller than qk_rope_head_dim ({})", c.index_head_dim, c.qk_rope_head_dim));
    if (!c.q_lora_rank)
      f.fail("q_lora_rank", "is null, but the DSA indexer projects from the q_lora_rank latent (wq_b)");
    c.indexer_types = parse_indexer_types(j, f, c.num_hidden_layers);
    c.indexer_rope_interleaved = f.opt_bool("indexer_rope_interleave", false);
  }

  c.num_nextn_predict_layers = f.opt_i32("num_nextn_predict_layers", 0);
  c.eos_token_ids = parse_token_ids(f, j, "eos_token_id");
  if (f.has("bos_token_id")) c.bos_token_id = f.to_int("bos_token_id", j.at("bos_token_id"));
  c.torch_dtype =
      f.has("torch_dtype") ? f.opt_string("torch_dtype", "bfloat16") : f.opt_string("dtype", "bfloat16");
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  auto path = model_dir / "config.json";
  std::ifstream in(path);
  if (!in) MS_THROW("cannot open {}", path.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    MS_THROW("{}: not valid JSON: {}", path.string(), e.what());
  }
  return parse_model_config(j, path.string());
}

json model_config_to_json(const ModelConfig& c) {
  json j;
  j["model_type"] = model_arch_name(c.arch);
  switch (c.arch) {
    case ModelArch::GlmMoeDsa:
      j["architectures"] = {"GlmMoeDsaForCausalLM"};
      break;
    case ModelArch::DeepseekV32:
      j["architectures"] = {"DeepseekV32ForCausalLM"};
      break;
    default:
      j["architectures"] = {"DeepseekV3ForCausalLM"};
  }
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;
  j["attention_bias"] = c.attention_bias;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rope_interleave"] = c.rope.interleaved;
  json rope;
  rope["rope_type"] = c.rope.type == RopeType::Yarn ? "yarn" : "default";
  if (c.rope.type == RopeType::Yarn) {
    rope["factor"] = c.rope.factor;
    rope["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
    rope["beta_fast"] = c.rope.beta_fast;
    rope["beta_slow"] = c.rope.beta_slow;
    rope["mscale"] = c.rope.mscale;
    rope["mscale_all_dim"] = c.rope.mscale_all_dim;
  }
  if (c.arch == ModelArch::GlmMoeDsa) {
    rope["rope_theta"] = c.rope.theta;
    j["rope_parameters"] = rope;
  } else {
    j["rope_theta"] = c.rope.theta;
    j["rope_scaling"] = c.rope.type == RopeType::Yarn ? rope : json(nullptr);
  }
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["scoring_func"] = c.scoring_func;
  j["topk_method"] = c.topk_method;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  int first_k = 0;
  while (first_k < c.num_hidden_layers && !c.layer_is_moe[first_k]) ++first_k;
  j["first_k_dense_replace"] = first_k;
  j["moe_layer_freq"] = 1;
  json types = json::array();
  for (bool m : c.layer_is_moe) types.push_back(m ? "sparse" : "dense");
  j["mlp_layer_types"] = types;
  if (c.has_indexer) {
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
    j["indexer_rope_interleave"] = c.indexer_rope_interleaved;
    json it = json::array();
    for (auto k : c.indexer_types) it.push_back(k == IndexerKind::Full ? "full" : "shared");
    j["indexer_types"] = it;
  }
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty())
    j["eos_token_id"] = c.eos_token_ids;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  j["torch_dtype"] = c.torch_dtype;
  return j;
}

}  // namespace ms::io
