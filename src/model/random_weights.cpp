#include "model/random_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string_view>

#include "core/error.h"
#include "model/weight_loader.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

namespace ms::model {

namespace {

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

// Initial values by tensor kind: norm weights ~1, biases small, the router's correction bias spread enough to
// change which experts win, everything else N(0, 0.02).
std::vector<float> init_values(const WeightSpec& s, int64_t n, uint64_t seed) {
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
  const auto n = static_cast<int64_t>(v.size());
  if (dtype == DType::F32) {
    std::copy(v.begin(), v.end(), t.data<float>());
  } else if (dtype == DType::BF16) {
    auto* p = t.data<uint16_t>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = quant::f32_to_bf16(v[static_cast<size_t>(i)]);
  } else if (dtype == DType::F16) {
    auto* p = t.data<uint16_t>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = quant::f32_to_f16(v[static_cast<size_t>(i)]);
  } else {
    MS_THROW("random weights: cannot store plain values as {}", dtype_name(dtype));
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

// Activation amax the generated input_scale stands for (ModelOpt: input_scale = amax / (6 * 448)).
constexpr float kInputAmax = 8.0f;

}  // namespace

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

std::string weight_group_key(const WeightSpec& s) {
  if (s.module.empty()) return s.name;
  auto dot = s.module.rfind('.');
  std::string last = s.module.substr(dot + 1);
  if (last == "gate_proj" || last == "up_proj" || last == "down_proj") return s.module.substr(0, dot);
  return s.module;
}

void generate_weight_group(const std::vector<const WeightSpec*>& group, const io::QuantConfig& quant,
                           uint64_t seed, std::vector<std::pair<std::string, Tensor>>& out) {
  // Float weights of each linear module in the group, [out, in] row-major.
  std::map<std::string, std::vector<float>> weights;
  std::map<std::string, const WeightSpec*> weight_spec;
  for (const auto* s : group) {
    if (s->module.empty()) {
      out.emplace_back(s->name, to_tensor(init_values(*s, s->numel(), seed), s->shape, s->dtype));
    } else if (s->name == s->module + ".weight") {
      weights[s->module] = normal_values(s->name, s->params, 0.0, 0.02, seed);
      weight_spec[s->module] = s;
    }
  }
  // gate_proj and up_proj of one MLP share weight_scale_2 and input_scale in NVFP4.
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
  for (const auto* s : group) {
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
  for (const auto* s : group)
    if (!s->module.empty() && s->name == s->module + ".bias")
      out.emplace_back(s->name, to_tensor(init_values(*s, s->numel(), seed), s->shape, s->dtype));
}

std::vector<std::string> nvfp4_exclude_modules(const io::ModelConfig& c) {
  std::vector<std::string> ex = {"lm_head", "*self_attn*"};
  for (int i = 0; i < c.num_hidden_layers; ++i)
    if (!c.layer_is_moe[static_cast<size_t>(i)]) ex.push_back(fmt::format("model.layers.{}.mlp*", i));
  return ex;
}

io::QuantConfig quant_config_for(const io::ModelConfig& cfg, const std::string& quantization,
                                 const std::string& flag) {
  nlohmann::json j = nlohmann::json::object();
  if (quantization == "fp8") {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {128, 128}}};
  } else if (quantization == "nvfp4") {
    j["quantization_config"] = {{"quant_method", "modelopt"},
                                {"quant_algo", "NVFP4"},
                                {"group_size", 16},
                                {"kv_cache_quant_algo", nullptr},
                                {"ignore", nvfp4_exclude_modules(cfg)}};
  } else if (quantization != "bf16") {
    MS_THROW("{} '{}' is not one of nvfp4, fp8, bf16", flag, quantization);
  }
  return io::parse_quant_config(j, nullptr, flag + " " + quantization);
}

RandomSource::RandomSource(const io::ModelConfig& cfg, io::QuantConfig quant, uint64_t seed)
    : quant_(std::move(quant)), seed_(seed) {
  specs_ = model_weight_specs(cfg, quant_);
  std::string last_key;
  for (const auto& s : specs_) {
    if (s.mtp) continue;
    std::string key = weight_group_key(s);
    if (groups_.empty() || key != last_key) groups_.emplace_back();
    groups_.back().push_back(&s);
    last_key = key;
  }
  // Scales and input_scale are tensors of the checkpoint the specs list too; map every name to its group.
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const auto* s : groups_[g]) where_[s->name] = g;
  const char* fmt = quant_.format == io::WeightFormat::NVFP4      ? "nvfp4"
                    : quant_.format == io::WeightFormat::FP8Block ? "fp8"
                                                                  : "bf16";
  desc_ = fmt::format("dummy weights ({} {}, seed {})", cfg.model_type, fmt, seed_);
}

Tensor RandomSource::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) MS_THROW("{}: tensor '{}' is missing", desc_, name);
  std::lock_guard<std::mutex> lock(mu_);
  if (cached_ != it->second) {
    cache_.clear();
    cached_ = SIZE_MAX;
    std::vector<std::pair<std::string, Tensor>> out;
    generate_weight_group(groups_[it->second], quant_, seed_, out);
    for (auto& [n, t] : out) cache_[n] = std::move(t);
    cached_ = it->second;
  }
  auto t = cache_.find(name);
  MS_CHECK(t != cache_.end(), "{}: tensor '{}' was not generated with its group", desc_, name);
  return t->second;
}

namespace {

std::string human(double v, const char* unit) {
  if (v >= 1e9) return fmt::format("{:.2f} G{}", v / 1e9, unit);
  if (v >= 1e6) return fmt::format("{:.2f} M{}", v / 1e6, unit);
  return fmt::format("{:.2f} K{}", v / 1e3, unit);
}

}  // namespace

std::string describe_dummy(const io::ModelConfig& cfg, const RandomSource& source) {
  const auto& specs = source.specs();
  uint64_t bytes = 0;
  for (const auto& [dt, b] : bytes_by_dtype(specs, false)) bytes += b;
  return fmt::format("{}: {} layers, {} params ({} active per token), {}", source.describe(),
                     cfg.num_hidden_layers, human(static_cast<double>(params_total(specs)), ""),
                     human(static_cast<double>(params_active_per_token(cfg, specs)), ""),
                     human(static_cast<double>(bytes), "B"));
}

LoadedModel load_dummy(const std::filesystem::path& cfg_path, const std::string& quantization, uint64_t seed,
                       bool host_weights) {
  io::ModelConfig cfg;
  if (std::filesystem::is_directory(cfg_path)) {
    cfg = io::load_model_config(cfg_path);
  } else {
    std::ifstream f(cfg_path);
    MS_CHECK(f.good(), "--load-format dummy: cannot read {}", cfg_path.string());
    cfg = io::parse_model_config(nlohmann::json::parse(f), cfg_path.string());
  }
  io::QuantConfig q = quant_config_for(cfg, quantization, "--quantization");
  auto src = std::make_shared<RandomSource>(cfg, q, seed);
  LoadedModel out;
  out.description = describe_dummy(cfg, *src);
  out.kv_auto = kv::KvCacheDType::BF16;
  ModelWeights w;
  if (host_weights) {
    w = load_weights(cfg, *src);
  } else {
    w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
    for (const auto& [dt, b] : bytes_by_dtype(src->specs(), false))
      out.device_weight_bytes += static_cast<double>(b);
    out.device_weights = src;
  }
  out.model = std::make_shared<Model>(std::move(cfg), std::move(w));
  return out;
}

}  // namespace ms::model
