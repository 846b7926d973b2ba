// Random weights from a config alone, deterministic in (seed, tensor name): what `moeserve gen-model` writes
// and what `--load-format dummy` loads, from the same code so a dummy model behaves like a gen-model one.
// Values: norm weights ~N(1, 0.02), biases ~N(0, 0.01), the router's correction bias ~N(0, 0.05), every
// other weight ~N(0, 0.02), quantised as the checkpoint format asks (NVFP4 with gate/up sharing
// weight_scale_2 as ModelOpt exports fused layers, FP8 128x128 blocks).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "model/load_model.h"
#include "model/tensor_source.h"
#include "model/weight_spec.h"

namespace ms::model {

// n values of N(mean, std), a function of (seed, name) alone (OpenMP over chunks of 4096, each with its own
// stream, so the thread count does not change the result).
std::vector<float> normal_values(const std::string& name, int64_t n, double mean, double std, uint64_t seed);

// The unit of generation: a plain tensor, or all tensors of the linears of one MLP (gate, up, down) or of one
// attention projection. The key names it; consecutive specs with one key form one group.
std::string weight_group_key(const WeightSpec& s);

// Every tensor of one group (weights, their scales, biases), appended to `out` as (name, host tensor).
void generate_weight_group(const std::vector<const WeightSpec*>& group, const io::QuantConfig& quant,
                           uint64_t seed, std::vector<std::pair<std::string, Tensor>>& out);

// The quantisation config `--quantization` / `gen-model --weights` names (nvfp4 | fp8 | bf16) for `cfg`:
// NVFP4 keeps attention, dense MLPs and lm_head in BF16 as the published ModelOpt checkpoints do. Throws
// naming `flag` for another value.
io::QuantConfig quant_config_for(const io::ModelConfig& cfg, const std::string& quantization,
                                 const std::string& flag);
// The exclude list of an NVFP4 checkpoint of `cfg` (lm_head, attention, dense-layer MLPs).
std::vector<std::string> nvfp4_exclude_modules(const io::ModelConfig& cfg);

// A TensorSource that generates each tensor when asked (MTP layers excluded). The group of the last tensor
// asked for is kept, so a loader walking the checkpoint order generates each group once and holds one group.
class RandomSource : public TensorSource {
 public:
  RandomSource(const io::ModelConfig& cfg, io::QuantConfig quant, uint64_t seed);
  bool contains(const std::string& name) const override { return where_.count(name) > 0; }
  Tensor tensor(const std::string& name) const override;
  std::string describe() const override { return desc_; }
  const std::vector<WeightSpec>& specs() const { return specs_; }
  const io::QuantConfig& quant() const { return quant_; }

 private:
  io::QuantConfig quant_;
  uint64_t seed_;
  std::string desc_;
  std::vector<WeightSpec> specs_;
  std::vector<std::vector<const WeightSpec*>> groups_;
  std::map<std::string, size_t> where_;  // tensor name -> group
  mutable std::mutex mu_;
  mutable size_t cached_ = SIZE_MAX;
  mutable std::map<std::string, Tensor> cache_;
};

// "dummy weights (glm_moe_dsa nvfp4, seed 0): 78 layers, 753.90 G params (40.10 G active per token),
// 431.20 GB" for `source` over `cfg` (MTP layers excluded).
std::string describe_dummy(const io::ModelConfig& cfg, const RandomSource& source);

// `--load-format dummy`: the model of `cfg_path` (a directory with config.json, or the config.json file) with
// random weights in `quantization` (nvfp4 | fp8 | bf16); the checkpoint's own quantisation config and weights
// are ignored. Built in host memory through RandomSource and load_weights; with host_weights false, the model
// holds no weights and LoadedModel::device_weights is the RandomSource, for an executor that builds them on
// its device tensor by tensor.
LoadedModel load_dummy(const std::filesystem::path& cfg_path, const std::string& quantization, uint64_t seed,
                       bool host_weights = true);

}  // namespace ms::model
