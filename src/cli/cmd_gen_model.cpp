// `moeserve gen-model`: a random-weight checkpoint laid out exactly as the published ones (config.json,
// sharded safetensors with model.safetensors.index.json, hf_quant_config.json for NVFP4), for tests and
// benchmarks without downloading a model. Values are deterministic in (seed, tensor name).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>

#include "cli/command.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "model/weight_spec.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

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

// Routed and shared experts in NVFP4; attention (with the indexer), dense MLPs and lm_head stay BF16, as the
// published ModelOpt checkpoints of these models do.
json nvfp4_excludes(const io::ModelConfig& c) {
  json ex = {"lm_head", "*self_attn*"};
  for (int i = 0; i < c.num_hidden_layers; ++i)
    if (!c.layer_is_moe[i]) ex.push_back(fmt::format("model.layers.{}.mlp*", i));
  return ex;
}

// ---- values
// ------------------------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a, then mixed
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return splitmix64(h);
}

// n values of N(mean, std), a function of (seed, name) alone: chunks of 4096 draw from their own stream, so
// the threads that fill them do not change the result.
std::vector<float> normal_values(const std::string& name, int64_t n, double mean, double std, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t base = name_hash(name, seed);
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t s = base ^ (static_cast<uint64_t>(c) * 0xd1342543de82ef95ull);
    int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; i += 2) {
      // Box-Muller on two 53-bit uniforms in (0, 1].
      double u1 = (static_cast<double>(splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;
      double u2 = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;
      double r = std::sqrt(-2.0 * std::log(u1));
      v[static_cast<size_t>(i)] = static_cast<float>(mean + std * r * std::cos(2.0 * std::numbers::pi * u2));
      if (i + 1 < end)
        v[static_cast<size_t>(i + 1)] =
            static_cast<float>(mean + std * r * std::sin(2.0 * std::numbers::pi * u2));
    }
  }
  return v;
}

// Initial values by tensor kind: norm weights ~1, biases small, the router's correction bias spread enough to
// change which experts win, everything else N(0, 0.02).
std::vector<float> init_values(const model::WeightSpec& s, int64_t n, uint64_t seed) {
  auto ends_with = [&](const char* suffix) {
    std::string_view v(s.name), x(suffix);
    return v.size() >= x.size() && v.substr(v.size() - x.size()) == x;
  };
  if (ends_with("e_score_correction_bias")) return normal_values(s.name, n, 0.0, 0.05, seed);
  if (ends_with(".bias")) return normal_values(s.name, n, 0.0, 0.01, seed);
  if (s.module.empty() && (ends_with("norm.weight") || ends_with("layernorm.weight")))
    return normal_values(s.name, n, 1.0, 0.02, seed);
  return normal_values(s.name, n, 0.0, 0.02, seed);
}

Tensor to_tensor(const std::vector<float>& v, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  MS_CHECK(t.numel() == static_cast<int64_t>(v.size()), "value count {} for {}", v.size(), t.desc());
  if (dtype == DType::F32) {
    std::copy(v.begin(), v.end(), t.data<float>());
  } else if (dtype == DType::BF16) {
    auto* p = t.data<uint16_t>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = quant::f32_to_bf16(v[i]);
  } else if (dtype == DType::F16) {
    auto* p = t.data<uint16_t>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = quant::f32_to_f16(v[i]);
  } else {
    MS_THROW("gen-model: cannot store plain values as {}", dtype_name(dtype));
  }
  return t;
}

Tensor bytes_tensor(const std::vector<uint8_t>& bytes, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  MS_CHECK(t.nbytes() == bytes.size(), "byte count {} for {}", bytes.size(), t.desc());
  std::copy(bytes.begin(), bytes.end(), t.data<uint8_t>());
  return t;
}

Tensor scalar_f32(float v) {
  Tensor t = Tensor::empty({}, DType::F32);
  *t.data<float>() = v;
  return t;
}

// One unit of generation: a plain tensor, or the linears of one MLP / one attention projection with all
// their tensors (weights, scales, bias). gate_proj and up_proj of one MLP share weight_scale_2 and
// input_scale in NVFP4, as ModelOpt exports fused layers.
struct Group {
  std::vector<const model::WeightSpec*> specs;
  uint64_t bytes = 0;
};

std::string group_key(const model::WeightSpec& s) {
  if (s.module.empty()) return s.name;
  auto dot = s.module.rfind('.');
  std::string last = s.module.substr(dot + 1);
  if (last == "gate_proj" || last == "up_proj" || last == "down_proj") return s.module.substr(0, dot);
  return s.module;
}

// Activation amax the generated input_scale stands for (ModelOpt: input_scale = amax / (6 * 448)).
constexpr float kInputAmax = 8.0f;

void generate_group(const Group& g, const io::QuantConfig& quant, uint64_t seed,
                    std::vector<std::pair<std::string, Tensor>>& out) {
  // Float weights of each linear module in the group, [out, in] row-major.
  std::map<std::string, std::vector<float>> weights;
  std::map<std::string, const model::WeightSpec*> weight_spec;
  for (const auto* s : g.specs) {
    if (s->module.empty()) {
      out.emplace_back(s->name, to_tensor(init_values(*s, s->numel(), seed), s->shape, s->dtype));
    } else if (s->name == s->module + ".weight") {
      weights[s->module] = normal_values(s->name, s->params, 0.0, 0.02, seed);
      weight_spec[s->module] = s;
    }
  }
  float shared_scale2 = 0.0f;
  if (quant.format == io::WeightFormat::NVFP4) {
    float amax = 0.0f;
    for (auto& [m, w] : weights) {
      std::string last = m.substr(m.rfind('.') + 1);
      if ((last == "gate_proj" || last == "up_proj") && weight_spec[m]->quantized)
        for (float x : w) amax = std::max(amax, std::fabs(x));
    }
    shared_scale2 = amax / (6.0f * quant::kFp8E4M3Max);
  }
  for (const auto* s : g.specs) {
    if (s->module.empty() || s->name != s->module + ".weight") continue;
    const std::vector<float>& w = weights[s->module];
    const int64_t rows = s->shape[0], cols = s->params / rows;
    if (!s->quantized) {
      out.emplace_back(s->name, to_tensor(w, s->shape, s->dtype));
    } else if (quant.format == io::WeightFormat::NVFP4) {
      std::string last = s->module.substr(s->module.rfind('.') + 1);
      bool fused = (last == "gate_proj" || last == "up_proj") && shared_scale2 > 0.0f;
      quant::Nvfp4Weight q = fused ? quant::nvfp4_quantize_with_scale2(w.data(), rows, cols, shared_scale2)
                                   : quant::nvfp4_quantize(w.data(), rows, cols);
      out.emplace_back(s->name, bytes_tensor(q.packed, {rows, cols / 2}, DType::U8));
      out.emplace_back(s->module + ".weight_scale",
                       bytes_tensor(q.scales, {rows, cols / 16}, DType::F8_E4M3));
      out.emplace_back(s->module + ".weight_scale_2", scalar_f32(q.scale2));
      out.emplace_back(s->module + ".input_scale", scalar_f32(kInputAmax / (6.0f * quant::kFp8E4M3Max)));
    } else {
      quant::Fp8BlockWeight q = quant::fp8_block_quantize(w.data(), rows, cols);
      out.emplace_back(s->name, bytes_tensor(q.data, {rows, cols}, DType::F8_E4M3));
      Tensor si = Tensor::empty({(rows + 127) / 128, q.scale_cols()}, DType::F32);
      std::copy(q.scale_inv.begin(), q.scale_inv.end(), si.data<float>());
      out.emplace_back(s->module + ".weight_scale_inv", si);
    }
  }
  for (const auto* s : g.specs)
    if (!s->module.empty() && s->name == s->module + ".bias")
      out.emplace_back(s->name, to_tensor(init_values(*s, s->numel(), seed), s->shape, s->dtype));
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream f(path);
  MS_CHECK(f.good(), "cannot write {}", path.string());
  f << j.dump(2) << "\n";
  MS_CHECK(f.good(), "cannot write {}", path.string());
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
    json ex = nvfp4_excludes(cfg);
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
    std::string key = group_key(s);
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
      generate_group(*g, quant, o.seed, tensors);
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
