// Every tensor a published Hugging Face checkpoint of a DeepSeek-V3-family config holds: name, stored shape
// and dtype (after quantization), role and layer; and the figures derived from them (parameters total and
// active per token, KV cache bytes per token, bytes one decode token must read at batch 1).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/memory_plan.h"
#include "io/model_config.h"
#include "io/quant_config.h"

namespace ms::model {

enum class WeightRole {
  Embedding,     // model.embed_tokens
  Attention,     // MLA projections and their q_a / kv_a norms
  Indexer,       // DSA indexer: wq_b, wk, k_norm, weights_proj
  Router,        // mlp.gate.weight, mlp.gate.e_score_correction_bias
  Expert,        // routed experts
  SharedExpert,  // mlp.shared_experts
  DenseMlp,      // dense-layer mlp
  Norm,          // input / post-attention / final RMSNorms (and MTP's enorm, hnorm, shared_head.norm)
  LmHead,        // lm_head (and MTP's shared_head.head)
  MtpProj,       // MTP's eh_proj
};
const char* weight_role_name(WeightRole r);

struct WeightSpec {
  std::string name;    // "model.layers.3.mlp.experts.7.down_proj.weight"
  std::string module;  // the linear it belongs to ("model.layers.3.mlp.experts.7.down_proj"); "" otherwise
  Shape shape;         // as stored: NVFP4 weight [out, in/2] U8
  DType dtype = DType::BF16;
  WeightRole role = WeightRole::Norm;
  int layer = -1;          // -1: embedding, final norm, lm_head
  int expert = -1;         // routed expert index
  bool mtp = false;        // belongs to an MTP layer (index >= num_hidden_layers): loaders skip it
  bool quantized = false;  // part of a quantized linear (weight or one of its scales)
  int64_t params = 0;      // model parameters it stores (logical elements; 0 for quantization scales)

  int64_t numel() const { return shape_numel(shape); }
  uint64_t nbytes() const { return dtype_bytes(dtype, static_cast<size_t>(numel())); }
};

// The tensors of a checkpoint of `cfg` quantized as `quant`, in checkpoint order (embedding, layers, final
// norm, lm_head, then MTP layers). Throws naming the module when a quantized linear's input width is not a
// multiple of the quantization block.
std::vector<WeightSpec> model_weight_specs(const io::ModelConfig& cfg, const io::QuantConfig& quant);

// Conventions (also printed by `moeserve inspect`):
//  - MTP layers are not counted (reported apart by mtp_params).
//  - total: every parameter of the main model, the embedding table and lm_head each once (tied: once).
//  - active per token: every non-routed-expert parameter, except that the embedding table counts one row
//    (hidden_size) unless it is tied to lm_head; plus num_experts_per_tok routed experts per MoE layer.
int64_t params_total(const std::vector<WeightSpec>& specs);
int64_t params_active_per_token(const io::ModelConfig& cfg, const std::vector<WeightSpec>& specs);
int64_t mtp_params(const std::vector<WeightSpec>& specs);

// KV cache bytes one token adds over all (non-MTP) layers: kv_cache_width values per layer in `kv_dtype`,
// plus for DSA models the indexer key (index_head_dim values, same dtype) on each layer that runs the indexer
// ("full"; "shared" layers reuse the previous top-k and cache no keys). Per-token scales are not counted.
uint64_t kv_bytes_per_token(const io::ModelConfig& cfg, DType kv_dtype);

// Bytes one decode token reads at batch 1 from the weights (KV reads excluded; add kv_bytes_per_token times
// the context): every non-routed-expert tensor of the main model as stored, num_experts_per_tok routed
// experts per MoE layer, lm_head, and one row of the embedding table.
uint64_t decode_floor_bytes(const io::ModelConfig& cfg, const std::vector<WeightSpec>& specs);

// Stored bytes per dtype name ("bf16", "fp8_e4m3", "u8", "f32"), MTP included when include_mtp.
std::map<std::string, uint64_t> bytes_by_dtype(const std::vector<WeightSpec>& specs, bool include_mtp);
// Parameters per role name, main model only.
std::map<std::string, int64_t> params_by_role(const std::vector<WeightSpec>& specs);

// The main model's stored bytes split the way tensor / expert parallelism splits them (dist::plan_memory):
// attention projections over heads (q_b / q_proj, kv_b, o_proj) apart from the attention tensors every rank
// keeps (the DSA indexer included: its top-k needs every head's score, so every rank holds it whole); KV
// bytes per token at kv_dtype. MTP layers are left out.
dist::WeightBytes parallel_weight_bytes(const io::ModelConfig& cfg, const io::QuantConfig& quant,
                                        DType kv_dtype);

// The dtype config.json's torch_dtype names for unquantized weights (bfloat16 -> BF16, ...).
DType unquantized_dtype(const io::ModelConfig& cfg);

}  // namespace ms::model
