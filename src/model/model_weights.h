// The weights of one DeepSeek-V3-family model (deepseek_v3, deepseek_v32, kimi_k2, glm_moe_dsa). Shapes use
// H = hidden_size, Hn = attention heads, dn / dr / dv = qk_nope / qk_rope / v head dims, r = kv_lora_rank,
// qr = q_lora_rank, Hi x Di = indexer heads x head dim, E = routed experts, I = moe_intermediate_size.
// Linear weights stay in their stored format (bf16, fp8-block, nvfp4); norm vectors are f32 copies.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "ops/linear_weight.h"
#include "ops/moe_experts.h"

namespace ms::model {

struct IndexerWeights {
  ops::LinearWeight wq_b;          // [Hi * Di, qr]
  ops::LinearWeight wk;            // [Di, H]
  Tensor k_norm_weight;            // f32 [Di] (LayerNorm)
  Tensor k_norm_bias;              // f32 [Di]
  ops::LinearWeight weights_proj;  // [Hi, H]
};

struct AttentionWeights {
  ops::LinearWeight q_a_proj;   // [qr, H] (q_lora_rank set)
  Tensor q_a_norm;              // f32 [qr]
  ops::LinearWeight q_b_proj;   // [Hn * (dn + dr), qr]
  ops::LinearWeight q_proj;     // [Hn * (dn + dr), H] (q_lora_rank null)
  ops::LinearWeight kv_a_proj;  // [r + dr, H] kv_a_proj_with_mqa
  Tensor kv_a_norm;             // f32 [r]
  ops::LinearWeight kv_b_proj;  // [Hn * (dn + dv), r]: per head dn rows (W_UK) then dv rows (W_UV)
  ops::LinearWeight o_proj;     // [H, Hn * dv]
  bool has_indexer = false;
  IndexerWeights indexer;
  // Set only where the weights were placed so (the GPU upload, runtime/cuda/weight_upload.h): q_a_proj,
  // kv_a_proj and, with qkv_a_wk, the indexer's wk as consecutive row ranges of one BF16 [qr + r + dr (+ Di),
  // H] weight, whose row slices those three hold. The forward then runs one product for the three.
  ops::LinearWeight qkv_a;
  int64_t qkv_a_q = 0;    // rows of q_a_proj in it
  bool qkv_a_wk = false;  // the indexer's wk is its last rows
};

struct MlpWeights {
  ops::LinearWeight gate, up;  // [intermediate, H]
  ops::LinearWeight down;      // [H, intermediate]
};

struct MoeWeights {
  ops::LinearWeight router;                 // [E, H] mlp.gate (run in fp32)
  Tensor correction_bias;                   // f32 [E] e_score_correction_bias, or undefined
  std::vector<ops::ExpertWeights> experts;  // [E] (EP: [local slots]): gate/up [I, H], down [H, I]
  // EP only (empty otherwise): the logical expert of each local slot, and for each logical expert the EP rank
  // of every copy in the placement's order (one copy each without redundant experts): the routing sends each
  // (token, k) assignment to exactly one copy (Model: remap_ids_replicated).
  std::vector<int> expert_ids;                      // [local slots]
  std::vector<std::vector<int>> expert_copy_ranks;  // [E][copies]
  bool has_shared = false;
  MlpWeights shared;  // [I * n_shared_experts, H]
};

struct LayerWeights {
  Tensor input_norm;      // f32 [H]
  Tensor post_attn_norm;  // f32 [H]
  AttentionWeights attn;
  bool is_moe = false;
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // MoE layers
};

struct ModelWeights {
  ops::LinearWeight embed;  // [vocab, H] (rows gathered)
  std::vector<LayerWeights> layers;
  Tensor final_norm;          // f32 [H]
  ops::LinearWeight lm_head;  // [vocab, H] (the embedding when tied)
  // [layers] the checkpoint's FP8 KV cache scale per layer (value = e4m3 * scale), used when the pool is
  // fp8_e4m3; empty when the checkpoint has none (scale 1). MLA caches one K-like row per token (normalised
  // latent, then rotated k_pe), so a layer's k_scale applies to all of it; v_scale only when k_scale is
  // absent.
  std::vector<float> kv_scales;
  // How these weights are split (model/weight_loader: WeightShard). Under TP, attention holds Hn/tp heads and
  // dense MLPs I/tp; under EP, MoeWeights::experts holds the layer's expert_ids (slot -> logical expert).
  dist::ShardSpec shard;
};

}  // namespace ms::model
