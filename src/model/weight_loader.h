// Builds ModelWeights from a TensorSource, checking every tensor the config implies for presence, shape and
// dtype; errors name the tensor. Multi-token-prediction layers (index >= num_hidden_layers) are not loaded.
#pragma once

#include <vector>

#include "dist/communicator.h"
#include "dist/expert_placement.h"
#include "io/model_config.h"
#include "model/model_weights.h"
#include "model/tensor_source.h"

namespace ms::model {

// What one rank of a tensor / expert parallel group loads. Under TP (tp_size > 1) rank t keeps heads
// [t * Hn/tp, (t + 1) * Hn/tp): those rows of q_b_proj (or q_proj) and kv_b_proj and those columns of o_proj,
// and rows [t * I/tp, ...) of the dense MLPs' gate / up with those columns of down. Under EP (ep_size > 1) it
// keeps only the routed experts `placement` gives its rank in each MoE layer, replicas included (slot order;
// no placement: the contiguous block of ep_rank).
// Everything else is loaded whole on every rank: embedding, norms, q_a / kv_a, the DSA indexer, the router,
// the shared expert, lm_head. Only the kept bytes of the checkpoint are read (row slices borrow the
// mapping; column slices are copied out of it).
struct WeightShard {
  dist::ShardSpec spec;
  const dist::LayerPlacements* placement = nullptr;  // EP; must list every MoE layer; outlives load_weights
};

// Throws naming the field and the sizes when heads, the dense intermediate or the experts do not divide.
void check_shard(const io::ModelConfig& cfg, const dist::ShardSpec& s);
// The config as one rank computes it: num_attention_heads / tp and intermediate_size / tp.
io::ModelConfig shard_config(const io::ModelConfig& cfg, const dist::ShardSpec& s);

ModelWeights load_weights(const io::ModelConfig& cfg, const TensorSource& src, const WeightShard& shard = {});

// Per layer, whether load_weights reads DSA indexer weights for it: every layer of an indexer model but a
// `shared` one after a full one (which reuses that layer's selection and has none of its own).
std::vector<bool> layers_with_indexer_weights(const io::ModelConfig& cfg);

// Rows [r0, r1) (output features) / columns [c0, c1) (input features) of a loaded linear. Row slices borrow;
// column slices own a copy. Throws when a cut falls inside a quantization block (fp8-block 128, nvfp4 16
// columns).
ops::LinearWeight slice_rows(const ops::LinearWeight& w, int64_t r0, int64_t r1);
ops::LinearWeight slice_cols(const ops::LinearWeight& w, int64_t c0, int64_t c1);

// One linear layer `prefix` ("model.layers.0.self_attn.o_proj") of [out, in]: bf16 / f32 `weight`, fp8 e4m3
// `weight` + `weight_scale_inv`, or nvfp4 u8 `weight` + `weight_scale` + `weight_scale_2`.
ops::LinearWeight load_linear(const TensorSource& src, const std::string& prefix, int64_t out, int64_t in);

}  // namespace ms::model
