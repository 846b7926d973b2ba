// Builds ModelWeights from a TensorSource, checking every tensor the config implies for presence, shape and
// dtype; errors name the tensor. Multi-token-prediction layers (index >= num_hidden_layers) are not loaded.
#pragma once

#include "io/model_config.h"
#include "model/model_weights.h"
#include "model/tensor_source.h"

namespace ms::model {

ModelWeights load_weights(const io::ModelConfig& cfg, const TensorSource& src);

// One linear layer `prefix` ("model.layers.0.self_attn.o_proj") of [out, in]: bf16 / f32 `weight`, fp8 e4m3
// `weight` + `weight_scale_inv`, or nvfp4 u8 `weight` + `weight_scale` + `weight_scale_2`.
ops::LinearWeight load_linear(const TensorSource& src, const std::string& prefix, int64_t out, int64_t in);

}  // namespace ms::model
