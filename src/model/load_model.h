// A model from a Hugging Face checkpoint directory (config.json, safetensors, optional hf_quant_config.json),
// or the built-in model when the directory is empty.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "dist/expert_placement.h"
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
  // Set when the model is split over ranks (--tp-size / --ep-size): every rank's model, each holding only its
  // shard; `model` is then rank 0's.
  std::vector<std::shared_ptr<Model>> shards;
};

LoadedModel load_model(const std::filesystem::path& dir);
// The checkpoint split over max(tp, ep) ranks (load_model_shards): each rank reads only its tensors. Experts
// as `placement` puts them (redundant copies included), or contiguous blocks without one.
LoadedModel load_model_sharded(const std::filesystem::path& dir, int tp_size, int ep_size,
                               const dist::LayerPlacements* placement = nullptr);

// Only rank `rank`'s shard of the checkpoint split over max(tp, ep) ranks (one process per rank): `model`
// holds that shard, `shards` stays empty.
LoadedModel load_model_shard(const std::filesystem::path& dir, int tp_size, int ep_size, int rank,
                             const dist::LayerPlacements* placement = nullptr);

// Rank r's ShardSpec in a group of max(tp, ep) ranks: tp rank r when tp > 1, ep rank r when ep > 1. Throws
// when both are > 1 and differ (one group serves both) or a size is below 1.
dist::ShardSpec shard_for_rank(int tp_size, int ep_size, int rank);
// Every rank's model, each loading only its shard from `src` (model/weight_loader: WeightShard).
// placement: the EP expert placement per MoE layer (null: contiguous blocks).
std::vector<std::shared_ptr<Model>> load_model_shards(const io::ModelConfig& cfg, const TensorSource& src,
                                                      int tp_size, int ep_size,
                                                      const dist::LayerPlacements* placement = nullptr,
                                                      const ModelOptions& opt = {});

}  // namespace ms::model
