// `moeserve inspect DIR`: what a checkpoint is and what decoding it costs, from config.json (and
// hf_quant_config.json) alone or, when the directory holds safetensors, from its actual tensors too.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/command.h"
#include "core/error.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "model/weight_spec.h"

namespace ms::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kParamConvention =
    "total counts every parameter of the main model (MTP layers apart); active counts every parameter a "
    "token "
    "touches: all but the routed experts not chosen (top-k of them per MoE layer), with one row of the "
    "embedding table";
constexpr const char* kFloorConvention =
    "weights read by one decode token at batch 1: every non-routed-expert tensor as stored, top-k routed "
    "experts "
    "per MoE layer, lm_head, one embedding row; KV reads excluded (add kv_bytes_per_token x context)";

struct Options {
  std::string dir;
  bool as_json = false;
  double bandwidth_gbs = 4800.0;
  std::string kv_dtype = "auto";
};

bool has_safetensors(const fs::path& dir) {
  if (!fs::is_directory(dir)) return false;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      return true;
  return false;
}

// "0-2 dense, 3-77 moe"
std::string runs(const std::vector<std::string>& kinds) {
  std::string out;
  size_t i = 0;
  while (i < kinds.size()) {
    size_t j = i;
    while (j + 1 < kinds.size() && kinds[j + 1] == kinds[i]) ++j;
    if (!out.empty()) out += ", ";
    out += i == j ? fmt::format("{} {}", i, kinds[i]) : fmt::format("{}-{} {}", i, j, kinds[i]);
    i = j + 1;
  }
  return out;
}

std::string human(double v, const char* unit) {
  if (v >= 1e12) return fmt::format("{:.2f} T{}", v / 1e12, unit);
  if (v >= 1e9) return fmt::format("{:.2f} G{}", v / 1e9, unit);
  if (v >= 1e6) return fmt::format("{:.2f} M{}", v / 1e6, unit);
  if (v >= 1e3) return fmt::format("{:.2f} k{}", v / 1e3, unit);
  return fmt::format("{:.0f} {}", v, unit);
}

const char* format_name(io::WeightFormat f) {
  switch (f) {
    case io::WeightFormat::BF16:
      return "bf16";
    case io::WeightFormat::FP8Block:
      return "fp8_block";
    case io::WeightFormat::NVFP4:
      return "nvfp4";
  }
  return "?";
}

int run_inspect(const Options& o) {
  fs::path dir(o.dir);
  io::ModelConfig cfg = io::load_model_config(dir);
  io::QuantConfig quant = io::load_quant_config(dir);
  auto specs = model::model_weight_specs(cfg, quant);

  DType kv_dtype = quant.kv_cache_fp8 ? DType::F8_E4M3 : DType::BF16;
  if (o.kv_dtype == "bf16")
    kv_dtype = DType::BF16;
  else if (o.kv_dtype == "fp8_e4m3" || o.kv_dtype == "fp8")
    kv_dtype = DType::F8_E4M3;
  else if (o.kv_dtype == "f32")
    kv_dtype = DType::F32;
  else if (o.kv_dtype != "auto")
    MS_THROW("--kv-cache-dtype '{}' is not one of auto, f32, bf16, fp8_e4m3", o.kv_dtype);
  MS_CHECK(o.bandwidth_gbs > 0, "--bandwidth-gbs must be positive");

  json r;
  r["model_dir"] = o.dir;
  r["model_type"] = cfg.model_type;
  r["num_layers"] = cfg.num_hidden_layers;
  r["moe_layers"] = cfg.num_moe_layers();
  r["dense_layers"] = cfg.num_hidden_layers - cfg.num_moe_layers();
  r["mtp_layers"] = cfg.num_nextn_predict_layers;
  std::vector<std::string> plan;
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    std::string k = cfg.layer_is_moe[i] ? "moe" : "dense";
    if (cfg.has_indexer) k += cfg.indexer_types[i] == io::IndexerKind::Full ? "+dsa_full" : "+dsa_shared";
    plan.push_back(k);
  }
  r["layer_plan"] = plan;
  r["indexer_full_layers"] = cfg.num_full_indexer_layers();
  r["indexer_shared_layers"] = cfg.has_indexer ? cfg.num_hidden_layers - cfg.num_full_indexer_layers() : 0;

  int64_t total = model::params_total(specs), active = model::params_active_per_token(cfg, specs);
  r["params_total"] = total;
  r["params_active"] = active;
  r["params_mtp"] = model::mtp_params(specs);
  r["params_by_role"] = model::params_by_role(specs);
  r["params_convention"] = kParamConvention;

  r["weight_format"] = format_name(quant.format);
  r["exclude_modules"] = quant.exclude_modules;
  // Linear modules per role: how many are stored quantized.
  std::map<std::string, std::pair<int64_t, int64_t>> qmods;  // role -> (quantized, total)
  for (const auto& s : specs) {
    if (s.mtp || s.module.empty() || s.name != s.module + ".weight") continue;
    auto& [q, n] = qmods[model::weight_role_name(s.role)];
    q += s.quantized;
    ++n;
  }
  json jq = json::object();
  for (auto& [role, qn] : qmods) jq[role] = {{"quantized", qn.first}, {"linear_modules", qn.second}};
  r["quantized_modules"] = jq;

  r["tensors_expected"] = specs.size();
  std::map<std::string, uint64_t> bytes = model::bytes_by_dtype(specs, true);
  r["bytes_source"] = "config";
  if (has_safetensors(dir)) {
    io::Checkpoint ck = io::Checkpoint::open(dir);
    std::map<std::string, const model::WeightSpec*> by_name;
    for (const auto& s : specs) by_name[s.name] = &s;
    std::vector<std::string> missing, unexpected, mismatched, kv_scales;
    bytes.clear();
    auto names = ck.names();
    std::set<std::string> present(names.begin(), names.end());
    for (const auto& n : names) {
      const io::TensorInfo& t = ck.info(n);
      bytes[std::string(dtype_name(t.dtype))] += t.end - t.begin;
      auto it = by_name.find(n);
      auto ends_with = [&](std::string_view x) {
        return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
      };
      if (it == by_name.end() && (ends_with(".k_scale") || ends_with(".v_scale")))
        kv_scales.push_back(n);  // FP8 KV cache scales (self_attn.k_proj.k_scale, ...), not weights
      else if (it == by_name.end())
        unexpected.push_back(n);
      else if (it->second->shape != t.shape ||
               dtype_safetensors_name(it->second->dtype) != dtype_safetensors_name(t.dtype))
        mismatched.push_back(fmt::format(
            "{}: {} {} in the checkpoint, {} {} expected", n, dtype_safetensors_name(t.dtype),
            shape_str(t.shape), dtype_safetensors_name(it->second->dtype), shape_str(it->second->shape)));
    }
    for (const auto& s : specs)
      if (!present.count(s.name)) missing.push_back(s.name);
    r["bytes_source"] = "checkpoint";
    r["checkpoint"] = {{"tensors", names.size()},
                       {"missing", missing},
                       {"unexpected", unexpected},
                       {"mismatched", mismatched},
                       {"kv_scales", kv_scales.size()}};
  }
  r["bytes_by_dtype"] = bytes;
  uint64_t bytes_total = 0;
  for (auto& [k, v] : bytes) bytes_total += v;
  r["bytes_total"] = bytes_total;

  uint64_t kv = model::kv_bytes_per_token(cfg, kv_dtype);
  uint64_t floor = model::decode_floor_bytes(cfg, specs);
  double floor_ms = static_cast<double>(floor) / (o.bandwidth_gbs * 1e9) * 1e3;
  r["kv_cache_dtype"] = std::string(dtype_name(kv_dtype));
  r["kv_bytes_per_token"] = kv;
  r["decode_floor_bytes"] = floor;
  r["decode_floor_ms"] = floor_ms;
  r["bandwidth_gbs"] = o.bandwidth_gbs;
  r["decode_floor_convention"] = kFloorConvention;
  r["softmax_scale"] = cfg.softmax_scale();

  if (o.as_json) {
    std::printf("%s\n", r.dump(2).c_str());
    return 0;
  }

  auto line = [](const std::string& k, const std::string& v) {
    std::printf("%-16s %s\n", k.c_str(), v.c_str());
  };
  line("model", o.dir);
  line("architecture",
       fmt::format("{}: hidden {}, {} heads (MLA q_lora {}, kv_lora {}, qk {}+{}, v {}), vocab {}",
                   cfg.model_type, cfg.hidden_size, cfg.num_attention_heads,
                   cfg.q_lora_rank ? std::to_string(*cfg.q_lora_rank) : "none", cfg.kv_lora_rank,
                   cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.vocab_size));
  line("moe",
       fmt::format("{} routed experts (top {}, {} groups / top {}) + {} shared, expert width {}, dense "
                   "width {}, {} {}",
                   cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group,
                   cfg.n_shared_experts, cfg.moe_intermediate_size, cfg.intermediate_size, cfg.scoring_func,
                   cfg.topk_method));
  line("rope",
       fmt::format("{} theta {:g}{}{}, softmax scale {:.6g}",
                   cfg.rope.type == io::RopeType::Yarn ? "yarn" : "default", cfg.rope.theta,
                   cfg.rope.type == io::RopeType::Yarn ? fmt::format(" factor {:g}", cfg.rope.factor) : "",
                   cfg.rope.interleaved ? ", interleaved" : ", half-split", cfg.softmax_scale()));
  std::vector<std::string> mlp_kinds, idx_kinds;
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    mlp_kinds.push_back(cfg.layer_is_moe[i] ? "moe" : "dense");
    if (cfg.has_indexer)
      idx_kinds.push_back(cfg.indexer_types[i] == io::IndexerKind::Full ? "full" : "shared");
  }
  line("layers", fmt::format("{} ({} dense + {} MoE): {}; {} MTP layer(s), not counted below",
                             cfg.num_hidden_layers, cfg.num_hidden_layers - cfg.num_moe_layers(),
                             cfg.num_moe_layers(), runs(mlp_kinds), cfg.num_nextn_predict_layers));
  if (cfg.has_indexer)
    line("dsa indexer", fmt::format("{} heads x {}, top {}; {}", cfg.index_n_heads, cfg.index_head_dim,
                                    cfg.index_topk, runs(idx_kinds)));
  line("params",
       fmt::format("total {} ({}), active per token {} ({}); MTP {}", human(double(total), ""), total,
                   human(double(active), ""), active, human(double(model::mtp_params(specs)), "")));
  line("", kParamConvention);
  std::string roles;
  for (auto& [role, n] : model::params_by_role(specs))
    roles += fmt::format("{}{} {}", roles.empty() ? "" : ", ", role, human(double(n), ""));
  line("params by role", roles);
  std::string wq = format_name(quant.format);
  if (quant.format == io::WeightFormat::NVFP4) wq += fmt::format(" (group {})", quant.group_size);
  line("weights", wq + (quant.exclude_modules.empty()
                            ? ""
                            : fmt::format("; excluded: {}", fmt::join(quant.exclude_modules, " "))));
  std::string qm;
  for (auto& [role, qn] : qmods)
    qm += fmt::format("{}{} {}/{}", qm.empty() ? "" : ", ", role, qn.first, qn.second);
  line("quantized", qm + " linear modules");
  std::string by;
  for (auto& [k, v] : bytes) by += fmt::format("{}{} {}", by.empty() ? "" : ", ", k, human(double(v), "B"));
  line("bytes by dtype",
       fmt::format(
           "{} (total {}, MTP included; from the {})", by, human(double(bytes_total), "B"),
           r["bytes_source"].get<std::string>() == "checkpoint" ? "checkpoint's tensors" : "config alone"));
  if (r.contains("checkpoint")) {
    const json& c = r["checkpoint"];
    line("checkpoint", fmt::format("{} tensors; {} missing, {} unexpected, {} with another shape or dtype",
                                   c["tensors"].get<size_t>(), c["missing"].size(), c["unexpected"].size(),
                                   c["mismatched"].size()));
    int shown = 0;
    for (const char* k : {"missing", "unexpected", "mismatched"})
      for (const auto& n : c[k])
        if (shown++ < 8) line("", fmt::format("{}: {}", k, n.get<std::string>()));
  }
  line("kv cache",
       fmt::format("{} B per token ({}: {} x {} layers{})", kv, dtype_name(kv_dtype), cfg.kv_cache_width(),
                   cfg.num_hidden_layers,
                   cfg.has_indexer ? fmt::format(" + indexer keys {} x {} layers", cfg.index_head_dim,
                                                 cfg.num_full_indexer_layers())
                                   : ""));
  line("decode floor", fmt::format("{} per token at batch 1 = {:.4g} ms at {:g} GB/s",
                                   human(double(floor), "B"), floor_ms, o.bandwidth_gbs));
  line("", kFloorConvention);
  return 0;
}

const Registration reg(
    "inspect", "Describe a checkpoint: architecture, layer plan, parameters, bytes, decode floor",
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<Options>();
      sub.add_option("dir", o->dir, "Model directory (config.json, optional safetensors)")->required();
      sub.add_flag("--json", o->as_json, "Print one JSON object");
      sub.add_option("--bandwidth-gbs", o->bandwidth_gbs,
                     "Memory bandwidth in GB/s for the decode floor in ms")
          ->capture_default_str();
      sub.add_option("--kv-cache-dtype", o->kv_dtype,
                     "KV cache dtype for bytes per token: auto (fp8_e4m3 when the checkpoint's "
                     "quantization config says FP8, else bf16), f32, bf16, fp8_e4m3")
          ->capture_default_str();
      return [o] { return run_inspect(*o); };
    });

}  // namespace
}  // namespace ms::cli
