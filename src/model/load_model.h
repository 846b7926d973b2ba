// A model from a Hugging Face checkpoint directory (config.json, safetensors, optional hf_quant_config.json),
// or the built-in model when the directory is empty.
#pragma once

#include <filesystem>
#include <memory>

#include "kv/kv_pool.h"
#include "model/model.h"

namespace ms::model {

struct LoadedModel {
  std::shared_ptr<Model> model;
  kv::KvCacheDType kv_auto = kv::KvCacheDType::BF16;  // what --kv-cache-dtype auto means for it
  std::string description;                            // "checkpoint DIR (glm_moe_dsa, nvfp4)"
};

LoadedModel load_model(const std::filesystem::path& dir);

}  // namespace ms::model
