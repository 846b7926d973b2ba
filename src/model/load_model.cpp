#include "model/load_model.h"

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

}  // namespace ms::model
