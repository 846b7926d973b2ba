#include "model/load_model.h"

#include <algorithm>

#include "core/error.h"
#include "io/quant_config.h"
#include "model/builtin_model.h"
#include "model/checkpoint_source.h"
#include "model/weight_loader.h"

namespace ms::model {

LoadedModel load_model(const std::filesystem::path& dir) {
  LoadedModel out;
  if (dir.empty()) {
    out.model = make_builtin_model();
    out.description = "built-in model (tiny glm_moe_dsa, deterministic weights)";
    return out;
  }
  io::ModelConfig cfg = io::load_model_config(dir);
  io::QuantConfig q = io::load_quant_config(dir);
  CheckpointSource src(dir);
  ModelWeights w = load_weights(cfg, src);
  const char* fmt = q.format == io::WeightFormat::NVFP4      ? "nvfp4"
                    : q.format == io::WeightFormat::FP8Block ? "fp8-block"
                                                             : "bf16";
  out.description = "checkpoint " + dir.string() + " (" + cfg.model_type + ", " + fmt + ")";
  out.kv_auto = q.kv_cache_fp8 ? kv::KvCacheDType::FP8E4M3 : kv::KvCacheDType::BF16;
  out.model = std::make_shared<Model>(std::move(cfg), std::move(w));
  return out;
}

LoadedModel load_model_sharded(const std::filesystem::path& dir, int tp_size, int ep_size,
                               const dist::LayerPlacements* placement) {
  MS_CHECK(!dir.empty(), "a model split over ranks needs a checkpoint directory");
  LoadedModel out;
  io::ModelConfig cfg = io::load_model_config(dir);
  io::QuantConfig q = io::load_quant_config(dir);
  CheckpointSource src(dir);
  out.shards = load_model_shards(cfg, src, tp_size, ep_size, placement);
  const char* fmt = q.format == io::WeightFormat::NVFP4      ? "nvfp4"
                    : q.format == io::WeightFormat::FP8Block ? "fp8-block"
                                                             : "bf16";
  out.description = "checkpoint " + dir.string() + " (" + cfg.model_type + ", " + fmt + ") over " +
                    std::to_string(out.shards.size()) + " ranks (tp " + std::to_string(tp_size) + ", ep " +
                    std::to_string(ep_size) + ")";
  out.kv_auto = q.kv_cache_fp8 ? kv::KvCacheDType::FP8E4M3 : kv::KvCacheDType::BF16;
  out.model = out.shards.front();
  return out;
}

LoadedModel load_model_shard(const std::filesystem::path& dir, int tp_size, int ep_size, int rank,
                             const dist::LayerPlacements* placement) {
  MS_CHECK(!dir.empty(), "a model split over ranks needs a checkpoint directory");
  WeightShard ws;
  ws.spec = shard_for_rank(tp_size, ep_size, rank);
  ws.placement = placement;
  LoadedModel out;
  io::ModelConfig cfg = io::load_model_config(dir);
  io::QuantConfig q = io::load_quant_config(dir);
  CheckpointSource src(dir);
  const char* fmt = q.format == io::WeightFormat::NVFP4      ? "nvfp4"
                    : q.format == io::WeightFormat::FP8Block ? "fp8-block"
                                                             : "bf16";
  out.description = "checkpoint " + dir.string() + " (" + cfg.model_type + ", " + fmt + "), rank " +
                    std::to_string(rank) + "'s shard of " + std::to_string(std::max(tp_size, ep_size)) +
                    " (tp " + std::to_string(tp_size) + ", ep " + std::to_string(ep_size) + ")";
  out.kv_auto = q.kv_cache_fp8 ? kv::KvCacheDType::FP8E4M3 : kv::KvCacheDType::BF16;
  ModelWeights w = load_weights(cfg, src, ws);
  out.model = std::make_shared<Model>(std::move(cfg), std::move(w));
  return out;
}

dist::ShardSpec shard_for_rank(int tp_size, int ep_size, int rank) {
  MS_CHECK(tp_size >= 1 && ep_size >= 1, "--tp-size {} and --ep-size {} must be at least 1", tp_size,
           ep_size);
  MS_CHECK(
      tp_size == 1 || ep_size == 1 || tp_size == ep_size,
      "--tp-size {} and --ep-size {}: with both above 1 they must be equal (one group of ranks serves both)",
      tp_size, ep_size);
  const int world = std::max(tp_size, ep_size);
  MS_CHECK(rank >= 0 && rank < world, "rank {} outside a group of {}", rank, world);
  dist::ShardSpec s;
  s.tp_size = tp_size;
  s.ep_size = ep_size;
  s.tp_rank = tp_size > 1 ? rank : 0;
  s.ep_rank = ep_size > 1 ? rank : 0;
  return s;
}

std::vector<std::shared_ptr<Model>> load_model_shards(const io::ModelConfig& cfg, const TensorSource& src,
                                                      int tp_size, int ep_size,
                                                      const dist::LayerPlacements* placement,
                                                      const ModelOptions& opt) {
  const int world = std::max(tp_size, ep_size);
  std::vector<std::shared_ptr<Model>> out;
  for (int r = 0; r < world; ++r) {
    WeightShard ws;
    ws.spec = shard_for_rank(tp_size, ep_size, r);
    ws.placement = placement;
    out.push_back(std::make_shared<Model>(cfg, load_weights(cfg, src, ws), opt));
  }
  return out;
}

}  // namespace ms::model
