#include "io/quantize_checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

namespace ms::io {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> default_quantize_excludes() {
  return {"lm_head", "model.embed_tokens", "*self_attn*", "*.mlp.gate", "*.shared_head.head", "*.eh_proj"};
}

namespace {

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) MS_THROW("quantize: cannot open {}", p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    MS_THROW("quantize: {} is not valid JSON: {}", p.string(), e.what());
  }
}

void write_json_file(const fs::path& p, const json& j) {
  std::ofstream out(p);
  if (!out) MS_THROW("quantize: cannot write {}", p.string());
  out << j.dump(2) << "\n";
}

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> w(static_cast<size_t>(t.numel()));
  switch (t.dtype()) {
    case DType::BF16:
      for (size_t i = 0; i < w.size(); ++i) w[i] = quant::bf16_to_f32(t.data<uint16_t>()[i]);
      break;
    case DType::F16:
      for (size_t i = 0; i < w.size(); ++i) w[i] = quant::f16_to_f32(t.data<uint16_t>()[i]);
      break;
    case DType::F32:
      std::copy(t.data<float>(), t.data<float>() + t.numel(), w.begin());
      break;
    default:
      MS_THROW("quantize: cannot read {} as a float matrix", t.desc());
  }
  return w;
}

bool float_matrix(const Tensor& t) {
  return t.dim() == 2 && (t.dtype() == DType::BF16 || t.dtype() == DType::F16 || t.dtype() == DType::F32);
}

}  // namespace

QuantizeReport quantize_checkpoint(const fs::path& in_dir, const fs::path& out_dir,
                                   const QuantizeOptions& o) {
  MS_CHECK(o.to == WeightFormat::NVFP4 || o.to == WeightFormat::FP8Block,
           "quantize: the target must be nvfp4 or fp8");
  MS_CHECK(fs::exists(in_dir / "config.json"), "quantize: {} has no config.json", in_dir.string());
  MS_CHECK(fs::weakly_canonical(in_dir) != fs::weakly_canonical(out_dir),
           "quantize: --out must differ from --model");
  json cfg = read_json_file(in_dir / "config.json");
  if (cfg.contains("quantization_config") && !cfg.at("quantization_config").is_null())
    MS_THROW("quantize: {} is already quantized (config.json has quantization_config); start from BF16",
             in_dir.string());
  MS_CHECK(!fs::exists(in_dir / "hf_quant_config.json"),
           "quantize: {} is already quantized (hf_quant_config.json); start from BF16", in_dir.string());
  const std::vector<std::string> exclude = o.exclude.empty() ? default_quantize_excludes() : o.exclude;

  json hf_quant;
  if (o.to == WeightFormat::NVFP4) {
    cfg["quantization_config"] = {{"quant_method", "modelopt"},
                                  {"quant_algo", "NVFP4"},
                                  {"group_size", quant::kNvfp4Block},
                                  {"kv_cache_quant_algo", nullptr},
                                  {"exclude_modules", exclude}};
    hf_quant = {{"producer", {{"name", "moeserve quantize"}}},
                {"quantization",
                 {{"quant_algo", "NVFP4"},
                  {"group_size", quant::kNvfp4Block},
                  {"kv_cache_quant_algo", nullptr},
                  {"exclude_modules", exclude}}}};
  } else {
    cfg["quantization_config"] = {{"quant_method", "fp8"},
                                  {"fmt", "e4m3"},
                                  {"activation_scheme", "dynamic"},
                                  {"weight_block_size", {quant::kFp8Block, quant::kFp8Block}},
                                  {"modules_to_not_convert", exclude}};
  }
  // Decide with the loader's own reading of what is written, so both always agree.
  const QuantConfig qc = parse_quant_config(cfg, hf_quant.is_null() ? nullptr : &hf_quant, "quantize output");

  fs::create_directories(out_dir);
  Checkpoint ck = Checkpoint::open(in_dir);
  QuantizeReport rep;
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  int64_t shard_size = 0;
  auto add = [&](const std::string& name, Tensor t) {
    if (shard_size > 0 && shard_size + static_cast<int64_t>(t.nbytes()) > o.shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shard_size += static_cast<int64_t>(t.nbytes());
    rep.bytes_out += static_cast<int64_t>(t.nbytes());
    shards.back().emplace_back(name, std::move(t));
  };
  for (const std::string& name : ck.names()) {
    Tensor t = ck.tensor(name);
    rep.bytes_in += static_cast<int64_t>(t.nbytes());
    const bool is_weight = name.size() > 7 && name.ends_with(".weight");
    const std::string module = is_weight ? name.substr(0, name.size() - 7) : name;
    if (!is_weight || !float_matrix(t) || !qc.is_quantized(module)) {
      add(name, t);
      ++rep.tensors_copied;
      continue;
    }
    const int64_t rows = t.size(0), cols = t.size(1);
    if (o.to == WeightFormat::NVFP4 && cols % quant::kNvfp4Block != 0) {
      rep.skipped.push_back(name);
      add(name, t);
      ++rep.tensors_copied;
      continue;
    }
    const std::vector<float> w = to_f32(t.is_contiguous() ? t : t.clone());
    if (o.to == WeightFormat::NVFP4) {
      quant::Nvfp4Weight q = quant::nvfp4_quantize(w.data(), rows, cols);
      Tensor packed = Tensor::empty({rows, cols / 2}, DType::U8);
      std::copy(q.packed.begin(), q.packed.end(), packed.data<uint8_t>());
      Tensor scales = Tensor::empty({rows, cols / quant::kNvfp4Block}, DType::F8_E4M3);
      std::copy(q.scales.begin(), q.scales.end(), scales.data<uint8_t>());
      Tensor s2 = Tensor::empty({}, DType::F32);
      s2.data<float>()[0] = q.scale2;
      add(module + ".weight", packed);
      add(module + ".weight_scale", scales);
      add(module + ".weight_scale_2", s2);
    } else {
      quant::Fp8BlockWeight q = quant::fp8_block_quantize(w.data(), rows, cols);
      Tensor data = Tensor::empty({rows, cols}, DType::F8_E4M3);
      std::copy(q.data.begin(), q.data.end(), data.data<uint8_t>());
      const int64_t sr = (rows + quant::kFp8Block - 1) / quant::kFp8Block;
      Tensor sinv = Tensor::empty({sr, q.scale_cols()}, DType::F32);
      std::copy(q.scale_inv.begin(), q.scale_inv.end(), sinv.data<float>());
      add(module + ".weight", data);
      add(module + ".weight_scale_inv", sinv);
    }
    ++rep.tensors_quantized;
  }
  MS_CHECK(rep.tensors_quantized > 0,
           "quantize: no tensor of {} was quantized: every 2-D weight is excluded (exclusions: {})",
           in_dir.string(), fmt::join(exclude, ", "));

  // Output files: model.safetensors, or shards with an index; no stale weight file of an earlier run stays.
  for (const auto& e : fs::directory_iterator(out_dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      fs::remove(e.path());
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string fn = shards.size() == 1
                               ? std::string("model.safetensors")
                               : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    write_safetensors(out_dir / fn, shards[i], {{"format", "pt"}});
    for (const auto& [n, t] : shards[i]) weight_map[n] = fn;
  }
  if (shards.size() > 1)
    write_json_file(out_dir / "model.safetensors.index.json",
                    {{"metadata", {{"total_size", rep.bytes_out}}}, {"weight_map", weight_map}});
  write_json_file(out_dir / "config.json", cfg);
  if (!hf_quant.is_null()) write_json_file(out_dir / "hf_quant_config.json", hf_quant);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                        "generation_config.json", "special_tokens_map.json"})
    if (fs::exists(in_dir / f)) fs::copy_file(in_dir / f, out_dir / f, fs::copy_options::overwrite_existing);
  return rep;
}

}  // namespace ms::io
