// The built-in model: a tiny GLM-5-architecture (glm_moe_dsa) model with deterministic weights generated in
// code, so the engine runs with nothing downloaded. Its vocabulary (512) matches the built-in byte-level
// tokenizer. Every weight goes through the same loader as a checkpoint.
#pragma once

#include <cstdint>
#include <memory>

#include "io/model_config.h"
#include "model/model.h"
#include "model/tensor_source.h"

namespace ms::model {

constexpr int64_t kBuiltinVocab = 512;

io::ModelConfig builtin_model_config();
// bf16 weights named as a Hugging Face checkpoint names them; same seed, same weights.
std::unique_ptr<MemorySource> builtin_model_weights(const io::ModelConfig& cfg, uint64_t seed = 0x5eed);
std::unique_ptr<Model> make_builtin_model();

}  // namespace ms::model
