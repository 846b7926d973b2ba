// A model from a Hugging Face checkpoint directory (config.json, safetensors, optional hf_quant_config.json),
// or the built-in model when the directory is empty.
#pragma once

#include <filesystem>
#include <memory>

#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/tensor_source.h"

namespace ms::model {

struct LoadedModel {
  std::shared_ptr<Model> model;
  kv::KvCacheDType kv_auto = kv::KvCacheDType::BF16;  // what --kv-cache-dtype auto means for it
  std::string description;                            // "checkpoint DIR (glm_moe_dsa, nvfp4)"
  // Set when the weights are to be built on the device tensor by tensor (--load-format dummy on the GPU):
  // `model` then holds the config and no weights (layers without tensors), and the source's stored bytes.
  std::shared_ptr<const TensorSource> device_weights;
  double device_weight_bytes = 0;
};

LoadedModel load_model(const std::filesystem::path& dir);

}  // namespace ms::model
