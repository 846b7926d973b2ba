// `moeserve gen-model`: a random-weight checkpoint laid out exactly as the published ones (config.json,
// sharded safetensors with model.safetensors.index.json, hf_quant_config.json for NVFP4), for tests and
// benchmarks without downloading a model. Values are deterministic in (seed, tensor name).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/progress.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "model/random_weights.h"
#include "model/weight_spec.h"

namespace ms::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Options {
  std::string arch = "glm5", preset = "tiny", weights = "bf16", out;
  int layers = 0;  // 0: the preset's
  uint64_t seed = 0;
  double shard_mb = 512;  // MiB; fractions allowed (tests split tiny models)
};

// ---- config
// ------------------------------------------------------------------------------------------------

// The preset's config.json. Dimensions per preset:
//   tiny:       hidden 64, 4 layers (1 dense + 3 MoE), 8 experts top 2 + 1 shared, vocab 512, 1 MTP layer
//   small:      hidden 1024, 8 layers (1 dense + 7 MoE), 64 experts top 6 + 1 shared, vocab 32000
//   glm5-slice: the full widths of the architecture (GLM-5 or DeepSeek-V3), 4 layers (1 dense + 3 MoE)
json preset_config(const Options& o) {
  const bool glm = o.arch == "glm5";
  json j;
  j["model_type"] = glm ? "glm_moe_dsa" : "deepseek_v3";
  j["architectures"] = {glm ? "GlmMoeDsaForCausalLM" : "DeepseekV3ForCausalLM"};
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "bfloat16";
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  j["norm_topk_prob"] = true;
  j["routed_scaling_factor"] = 2.5;
  j["n_shared_experts"] = 1;
  j["rope_interleave"] = true;
  j["moe_layer_freq"] = 1;
  j["first_k_dense_replace"] = 1;
  j["num_nextn_predict_layers"] = 0;
  j["initializer_range"] = 0.02;
  if (glm) {
    j["rms_norm_eps"] = 1e-5;
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
    j["n_group"] = 1;
    j["topk_group"] = 1;
    j["eos_token_id"] = {1, 2};
    j["bos_token_id"] = nullptr;
    j["indexer_rope_interleave"] = true;
  } else {
    j["rms_norm_eps"] = 1e-6;
    j["rope_theta"] = 10000.0;
    // YaRN; its factor is set below from max_position_embeddings / original_max_position_embeddings, the
    // relation transformers checks.
    j["rope_scaling"] = {{"type", "yarn"},
                         {"rope_type", "yarn"},
                         {"beta_fast", 32.0},
                         {"beta_slow", 1.0},
                         {"mscale", 1.0},
                         {"mscale_all_dim", 1.0},
                         {"original_max_position_embeddings", o.preset == "tiny" ? 1024 : 4096}};
    j["eos_token_id"] = 1;
    j["bos_token_id"] = 0;
  }
  int layers = 4;
  if (o.preset == "tiny") {
    j.update({{"vocab_size", 512},
              {"hidden_size", 64},
              {"intermediate_size", 128},
              {"moe_intermediate_size", 32},
              {"num_attention_heads", 4},
              {"q_lora_rank", 48},
              {"kv_lora_rank", 32},
              {"qk_nope_head_dim", 16},
              {"qk_rope_head_dim", 8},
              {"v_head_dim", 16},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"max_position_embeddings", 4096},
              {"num_nextn_predict_layers", 1}});
    if (glm) j.update({{"index_n_heads", 2}, {"index_head_dim", 16}, {"index_topk", 8}});
    if (!glm) j.update({{"n_group", 2}, {"topk_group", 1}});
  } else if (o.preset == "small") {
    layers = 8;
    j.update({{"vocab_size", 32000},
              {"hidden_size", 1024},
              {"intermediate_size", 2816},
              {"moe_intermediate_size", 128},
              {"num_attention_heads", 8},
              {"q_lora_rank", 384},
              {"kv_lora_rank", 256},
              {"qk_nope_head_dim", glm ? 96 : 64},
              {"qk_rope_head_dim", 32},
              {"v_head_dim", glm ? 128 : 64},
              {"n_routed_experts", 64},
              {"num_experts_per_tok", 6},
              {"max_position_embeddings", 32768}});
    if (glm) j.update({{"index_n_heads", 8}, {"index_head_dim", 64}, {"index_topk", 256}});
    if (!glm) j.update({{"n_group", 8}, {"topk_group", 4}});
  } else if (o.preset == "glm5-slice") {
    if (glm)
      j.update({{"vocab_size", 154880},
                {"hidden_size", 6144},
                {"intermediate_size", 12288},
                {"moe_intermediate_size", 2048},
                {"num_attention_heads", 64},
                {"q_lora_rank", 2048},
                {"kv_lora_rank", 512},
                {"qk_nope_head_dim", 192},
                {"qk_rope_head_dim", 64},
                {"v_head_dim", 256},
                {"n_routed_experts", 256},
                {"num_experts_per_tok", 8},
                {"max_position_embeddings", 202752},
                {"index_n_heads", 32},
                {"index_head_dim", 128},
                {"index_topk", 2048},
                {"eos_token_id", {154820, 154827, 154829}}});
    else
      j.update({{"vocab_size", 129280},
                {"hidden_size", 7168},
                {"intermediate_size", 18432},
                {"moe_intermediate_size", 2048},
                {"num_attention_heads", 128},
                {"q_lora_rank", 1536},
                {"kv_lora_rank", 512},
                {"qk_nope_head_dim", 128},
                {"qk_rope_head_dim", 64},
                {"v_head_dim", 128},
                {"n_routed_experts", 256},
                {"num_experts_per_tok", 8},
                {"n_group", 8},
                {"topk_group", 4},
                {"max_position_embeddings", 163840}});
  } else {
    MS_THROW("--preset '{}' is not one of tiny, small, glm5-slice", o.preset);
  }
  if (o.layers > 0) layers = o.layers;
  j["num_hidden_layers"] = layers;
  // MLA has one KV head per query head; without the field transformers defaults it to 128 and sizes kv_b_proj
  // for 128 heads, and llama.cpp's converter refuses the checkpoint.
  j["num_key_value_heads"] = j["num_attention_heads"];
  if (j.contains("rope_scaling")) {
    auto& rs = j["rope_scaling"];
    rs["factor"] =
        j["max_position_embeddings"].get<double>() / rs["original_max_position_embeddings"].get<double>();
  }
  json types = json::array();
  for (int i = 0; i < layers; ++i) types.push_back(i == 0 ? "dense" : "sparse");
  j["mlp_layer_types"] = types;
  if (glm) {
    // tiny alternates full / shared indexer layers so both kinds are exercised; the others run it everywhere.
    json it = json::array();
    for (int i = 0; i < layers; ++i) it.push_back(o.preset == "tiny" && i % 2 == 1 ? "shared" : "full");
    j["indexer_types"] = it;
  }
  return j;
}

// One unit of generation (model::weight_group_key): a plain tensor, or the linears of one MLP / one attention
// projection with all their tensors.
struct Group {
  std::vector<const model::WeightSpec*> specs;
  uint64_t bytes = 0;
};

void write_json(const fs::path& path, const json& j) {
  write_json_file(path, j, 2, "the generated model's file");
}

int run_gen_model(const Options& o) {
  if (o.arch != "glm5" && o.arch != "deepseek_v3")
    MS_THROW("--arch '{}' is not one of glm5, deepseek_v3", o.arch);
  if (o.weights != "bf16" && o.weights != "fp8" && o.weights != "nvfp4")
    MS_THROW("--weights '{}' is not one of bf16, fp8, nvfp4", o.weights);
  MS_CHECK(o.shard_mb > 0, "--shard-mb must be positive");
  MS_CHECK(o.layers >= 0, "--layers must be positive");

  json cfg_json = preset_config(o);
  io::ModelConfig cfg = io::parse_model_config(cfg_json, "generated config.json");
  json hq;
  bool have_hq = false;
  if (o.weights == "fp8") {
    cfg_json["quantization_config"] = {{"quant_method", "fp8"},
                                       {"fmt", "e4m3"},
                                       {"activation_scheme", "dynamic"},
                                       {"weight_block_size", {128, 128}}};
  } else if (o.weights == "nvfp4") {
    json ex = model::nvfp4_exclude_modules(cfg);
    hq = {{"producer", {{"name", "moeserve gen-model"}}},
          {"quantization",
           {{"quant_algo", "NVFP4"},
            {"group_size", 16},
            {"kv_cache_quant_algo", nullptr},
            {"exclude_modules", ex}}}};
    have_hq = true;
    cfg_json["quantization_config"] = {{"quant_method", "modelopt"},
                                       {"quant_algo", "NVFP4"},
                                       {"group_size", 16},
                                       {"kv_cache_quant_algo", nullptr},
                                       {"ignore", ex}};
  }
  // The reader's view of what is written, so writer and loader agree by construction.
  io::QuantConfig quant = io::parse_quant_config(cfg_json, have_hq ? &hq : nullptr, "generated config");
  auto specs = model::model_weight_specs(cfg, quant);

  // Groups in checkpoint order, then shards of about --shard-mb (a group never straddles two shards).
  std::vector<Group> groups;
  std::string last_key;
  for (const auto& s : specs) {
    std::string key = model::weight_group_key(s);
    if (groups.empty() || key != last_key) groups.emplace_back();
    groups.back().specs.push_back(&s);
    groups.back().bytes += s.nbytes();
    last_key = key;
  }
  const auto shard_limit = static_cast<uint64_t>(o.shard_mb * 1048576.0);
  std::vector<std::vector<const Group*>> shards(1);
  uint64_t in_shard = 0, total_bytes = 0;
  for (const auto& g : groups) {
    if (in_shard > 0 && in_shard + g.bytes > shard_limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&g);
    in_shard += g.bytes;
    total_bytes += g.bytes;
  }

  fs::path out(o.out);
  fs::create_directories(out);
  write_json(out / "config.json", cfg_json);
  if (have_hq)
    write_json(out / "hf_quant_config.json", hq);
  else if (fs::exists(out / "hf_quant_config.json"))
    fs::remove(out / "hf_quant_config.json");

  json weight_map = json::object();
  ProgressBar bar(fmt::format("gen-model {} {} {}", o.arch, o.preset, o.weights),
                  static_cast<int64_t>(total_bytes), "B");
  const size_t n = shards.size();
  for (size_t k = 0; k < n; ++k) {
    std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const Group* g : shards[k]) {
      size_t first = tensors.size();
      model::generate_weight_group(g->specs, quant, o.seed, tensors);
      // Every tensor the spec lists, with its shape and dtype, and nothing else.
      MS_CHECK(tensors.size() - first == g->specs.size(), "{}: generated {} tensors for {} specs",
               g->specs.front()->name, tensors.size() - first, g->specs.size());
      for (size_t i = first; i < tensors.size(); ++i) {
        const auto& [name, t] = tensors[i];
        auto it = std::find_if(g->specs.begin(), g->specs.end(), [&](auto* s) { return s->name == name; });
        MS_CHECK(it != g->specs.end() && (*it)->shape == t.shape() && (*it)->dtype == t.dtype(),
                 "{}: generated {} does not match its spec", name, t.desc());
        weight_map[name] = file;
      }
      bar.advance(static_cast<int64_t>(g->bytes));
    }
    io::write_safetensors(out / file, tensors, {{"format", "pt"}});
  }
  bar.finish();
  write_json(out / "model.safetensors.index.json",
             {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}});
  std::printf("wrote %s: %s %s, %d layers, %zu tensors in %zu shard(s), %.3f GB\n", o.out.c_str(),
              cfg.model_type.c_str(), o.weights.c_str(), cfg.num_hidden_layers, specs.size(), n,
              static_cast<double>(total_bytes) / 1e9);
  return 0;
}

const Registration reg(
    "gen-model", "Write a random-weight Hugging Face checkpoint (config, sharded safetensors)",
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<Options>();
      sub.add_option("--arch", o->arch, "glm5 | deepseek_v3")->capture_default_str();
      sub.add_option("--preset", o->preset,
                     "tiny (hidden 64) | small (hidden 1024, 64 experts) | glm5-slice (full "
                     "widths, a few layers)")
          ->capture_default_str();
      sub.add_option("--layers", o->layers, "Layers (first dense, the rest MoE); default: preset's");
      sub.add_option("--weights", o->weights, "bf16 | fp8 (128x128 block) | nvfp4 (ModelOpt)")
          ->capture_default_str();
      sub.add_option("--out", o->out, "Output directory")->required();
      sub.add_option("--seed", o->seed, "Random seed")->capture_default_str();
      sub.add_option("--shard-mb", o->shard_mb, "Target shard size in MiB")->capture_default_str();
      return [o] { return run_gen_model(*o); };
    });

}  // namespace
}  // namespace ms::cli
