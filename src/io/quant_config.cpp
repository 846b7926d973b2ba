#include "io/quant_config.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"
#include "core/json_file.h"

namespace ms::io {

using nlohmann::json;

bool wildcard_match(const std::string& pattern, const std::string& text) {
  // Greedy match with one backtrack point: the last '*' seen and where in text it resumed.
  size_t p = 0, t = 0, star = std::string::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool QuantConfig::is_quantized(const std::string& module_name) const {
  if (format == WeightFormat::BF16) return false;
  for (const auto& pattern : exclude_modules) {
    if (wildcard_match(pattern, module_name)) return false;
    // A pattern naming a parent module ("model.layers.0.self_attn") excludes everything below it.
    for (size_t dot = module_name.find('.'); dot != std::string::npos; dot = module_name.find('.', dot + 1))
      if (wildcard_match(pattern, module_name.substr(0, dot))) return false;
  }
  return true;
}

namespace {

std::vector<std::string> string_list(const json& v, const std::string& source, const char* field) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (!v.is_array()) MS_THROW("{}: field '{}' must be a list of module patterns", source, field);
  for (const auto& e : v) {
    if (!e.is_string()) MS_THROW("{}: field '{}' must hold strings", source, field);
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::string upper(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

std::string get_string(const json& obj, const char* key, const std::string& source,
                       const std::string& prefix) {
  if (!obj.contains(key) || obj.at(key).is_null()) return "";
  if (!obj.at(key).is_string()) MS_THROW("{}: field '{}{}' must be a string", source, prefix, key);
  return obj.at(key).get<std::string>();
}

void set_kv_algo(QuantConfig& q, const std::string& algo, const std::string& source,
                 const std::string& field) {
  std::string a = upper(algo);
  if (a.empty() || a == "NONE" || a == "AUTO")
    q.kv_cache_fp8 = false;
  else if (a == "FP8")
    q.kv_cache_fp8 = true;
  else
    MS_THROW("{}: {} '{}' is not supported (supported: FP8 or none)", source, field, algo);
}

void set_group_size(QuantConfig& q, const json& v, const std::string& source, const std::string& field) {
  if (v.is_null()) return;
  if (!v.is_number_integer()) MS_THROW("{}: field '{}' must be an integer", source, field);
  int g = v.get<int>();
  if (g != 16) MS_THROW("{}: field '{}' is {}; NVFP4 checkpoints use blocks of 16", source, field, g);
  q.group_size = g;
}

void require_nvfp4(const std::string& algo, const std::string& source, const std::string& field) {
  if (algo.empty()) MS_THROW("{}: field '{}' is missing", source, field);
  if (upper(algo) != "NVFP4")
    MS_THROW("{}: {} '{}' is not supported; supported ModelOpt algorithm: NVFP4", source, field, algo);
}

// hf_quant_config.json: {"quantization": {"quant_algo", "group_size", "kv_cache_quant_algo",
// "exclude_modules"}}
QuantConfig parse_hf_quant_config(const json& hq, const std::string& source) {
  if (!hq.is_object() || !hq.contains("quantization") || !hq.at("quantization").is_object())
    MS_THROW("{}: field 'quantization' is missing or not an object", source);
  const json& s = hq.at("quantization");
  QuantConfig q;
  require_nvfp4(get_string(s, "quant_algo", source, "quantization."), source, "quantization.quant_algo");
  q.format = WeightFormat::NVFP4;
  if (s.contains("group_size")) set_group_size(q, s.at("group_size"), source, "quantization.group_size");
  set_kv_algo(q, get_string(s, "kv_cache_quant_algo", source, "quantization."), source,
              "quantization.kv_cache_quant_algo");
  if (s.contains("exclude_modules"))
    q.exclude_modules = string_list(s.at("exclude_modules"), source, "quantization.exclude_modules");
  return q;
}

// config.json "quantization_config" with quant_method "modelopt" (the compressed-tensors-like spelling):
// quant_algo, kv_cache_quant_algo or kv_cache_scheme, group_size or config_groups.*.weights.group_size,
// ignore.
QuantConfig parse_modelopt_section(const json& s, const std::string& source) {
  const std::string pre = "quantization_config.";
  QuantConfig q;
  require_nvfp4(get_string(s, "quant_algo", source, pre), source, pre + "quant_algo");
  q.format = WeightFormat::NVFP4;
  if (s.contains("group_size")) {
    set_group_size(q, s.at("group_size"), source, pre + "group_size");
  } else if (s.contains("config_groups") && s.at("config_groups").is_object()) {
    for (const auto& [name, group] : s.at("config_groups").items())
      if (group.is_object() && group.contains("weights") && group.at("weights").is_object() &&
          group.at("weights").contains("group_size"))
        set_group_size(q, group.at("weights").at("group_size"), source,
                       pre + "config_groups." + name + ".weights.group_size");
  }
  if (s.contains("kv_cache_quant_algo")) {
    set_kv_algo(q, get_string(s, "kv_cache_quant_algo", source, pre), source, pre + "kv_cache_quant_algo");
  } else if (s.contains("kv_cache_scheme") && s.at("kv_cache_scheme").is_object()) {
    const json& k = s.at("kv_cache_scheme");
    bool fp8 = k.value("type", std::string()) == "float" && k.value("num_bits", 0) == 8;
    if (!fp8) MS_THROW("{}: {}kv_cache_scheme is not supported (supported: 8-bit float)", source, pre);
    q.kv_cache_fp8 = true;
  }
  if (s.contains("ignore"))
    q.exclude_modules = string_list(s.at("ignore"), source, "quantization_config.ignore");
  if (s.contains("exclude_modules"))
    q.exclude_modules = string_list(s.at("exclude_modules"), source, "quantization_config.exclude_modules");
  return q;
}

// DeepSeek's native FP8: {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
// "activation_scheme": "dynamic"}.
QuantConfig parse_fp8_section(const json& s, const std::string& source) {
  const std::string pre = "quantization_config.";
  QuantConfig q;
  q.format = WeightFormat::FP8Block;
  std::string fmt_name = get_string(s, "fmt", source, pre);
  if (!fmt_name.empty() && fmt_name != "e4m3")
    MS_THROW("{}: {}fmt '{}' is not supported (supported: e4m3)", source, pre, fmt_name);
  if (!s.contains("weight_block_size") || s.at("weight_block_size").is_null())
    MS_THROW(
        "{}: field '{}weight_block_size' is missing; per-tensor FP8 checkpoints are not supported, only "
        "DeepSeek's block FP8",
        source, pre);
  const json& b = s.at("weight_block_size");
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer())
    MS_THROW("{}: field '{}weight_block_size' must be a list of two integers", source, pre);
  q.weight_block_rows = b[0].get<int>();
  q.weight_block_cols = b[1].get<int>();
  if (q.weight_block_rows != 128 || q.weight_block_cols != 128)
    MS_THROW("{}: {}weight_block_size [{}, {}] is not supported (supported: [128, 128])", source, pre,
             q.weight_block_rows, q.weight_block_cols);
  std::string act = get_string(s, "activation_scheme", source, pre);
  if (!act.empty() && act != "dynamic")
    MS_THROW("{}: {}activation_scheme '{}' is not supported (supported: dynamic)", source, pre, act);
  for (const char* key : {"modules_to_not_convert", "ignored_layers", "ignore"})
    if (s.contains(key))
      for (auto& m : string_list(s.at(key), source, key)) q.exclude_modules.push_back(m);
  // DeepSeek's FP8 checkpoints keep lm_head (and the MTP layer's copy of it) and the indexer's weights_proj
  // in BF16 without saying so.
  q.exclude_modules.push_back("lm_head");
  q.exclude_modules.push_back("*.shared_head.head");
  q.exclude_modules.push_back("*.indexer.weights_proj");
  return q;
}

}  // namespace

QuantConfig parse_quant_config(const json& config_json, const json* hf_quant_config,
                               const std::string& source) {
  if (hf_quant_config) return parse_hf_quant_config(*hf_quant_config, source);
  if (!config_json.is_object() || !config_json.contains("quantization_config") ||
      config_json.at("quantization_config").is_null())
    return QuantConfig{};
  const json& s = config_json.at("quantization_config");
  if (!s.is_object()) MS_THROW("{}: field 'quantization_config' must be an object", source);
  std::string method = get_string(s, "quant_method", source, "quantization_config.");
  if (method == "modelopt" || (method.empty() && s.contains("quant_algo")))
    return parse_modelopt_section(s, source);
  if (method == "fp8") return parse_fp8_section(s, source);
  if (method.empty()) MS_THROW("{}: field 'quantization_config.quant_method' is missing", source);
  MS_THROW(
      "{}: quantization_config.quant_method '{}' is not supported; supported: modelopt (NVFP4), fp8 "
      "(DeepSeek 128x128 block)",
      source, method);
}

QuantConfig load_quant_config(const std::filesystem::path& model_dir) {
  auto hf_path = model_dir / "hf_quant_config.json";
  auto cfg_path = model_dir / "config.json";
  json cfg =
      std::filesystem::exists(cfg_path) ? read_json_file(cfg_path, "the model config") : json::object();
  if (std::filesystem::exists(hf_path)) {
    json hq = read_json_file(hf_path, "the quantization config");
    return parse_quant_config(cfg, &hq, hf_path.string());
  }
  return parse_quant_config(cfg, nullptr, cfg_path.string());
}

}  // namespace ms::io
