#include "moe/expert_distribution.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/json_file.h"

namespace ms::moe {

using nlohmann::json;

ExpertDistribution::ExpertDistribution(int n_experts, const std::vector<int>& moe_layers)
    : n_experts_(n_experts) {
  MS_CHECK(n_experts > 0, "expert distribution: n_experts is {}", n_experts);
  for (int l : moe_layers) counts_[l].assign(static_cast<size_t>(n_experts), 0);
}

void ExpertDistribution::record(int layer, const int32_t* topk_ids, int64_t n_tokens, int top_k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(layer);
  MS_CHECK(it != counts_.end(), "expert distribution: layer {} is not a MoE layer", layer);
  std::vector<uint64_t>& c = it->second;
  for (int64_t i = 0; i < n_tokens * top_k; ++i) {
    const int32_t e = topk_ids[i];
    if (e < 0) continue;
    MS_CHECK(e < n_experts_, "expert distribution: expert id {} outside [0, {})", e, n_experts_);
    ++c[static_cast<size_t>(e)];
  }
}

std::map<int, std::vector<uint64_t>> ExpertDistribution::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

json ExpertDistribution::to_json() const {
  json layers = json::object();
  for (const auto& [l, c] : counts()) layers[std::to_string(l)] = c;
  return json{{"n_experts", n_experts_}, {"layers", layers}};
}

ExpertDistribution ExpertDistribution::from_json(const json& j) {
  MS_CHECK(j.is_object(), "expert distribution: not a JSON object");
  for (const char* k : {"n_experts", "layers"})
    if (!j.contains(k)) MS_THROW("expert distribution: missing field '{}'", k);
  if (!j["n_experts"].is_number_integer() || j["n_experts"].get<int64_t>() <= 0)
    MS_THROW("n_experts: not a positive integer");
  if (!j["layers"].is_object() || j["layers"].empty()) MS_THROW("layers: not a non-empty object");
  ExpertDistribution d;
  d.n_experts_ = j["n_experts"].get<int>();
  for (const auto& [key, v] : j["layers"].items()) {
    size_t used = 0;
    int layer = -1;
    try {
      layer = std::stoi(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || layer < 0) MS_THROW("layers.{}: the key is not a layer index", key);
    if (!v.is_array()) MS_THROW("layers.{}: not an array", key);
    if (static_cast<int>(v.size()) != d.n_experts_)
      MS_THROW("layers.{}: {} counts for n_experts {}", key, v.size(), d.n_experts_);
    std::vector<uint64_t>& c = d.counts_[layer];
    for (size_t e = 0; e < v.size(); ++e) {
      if (!v[e].is_number_unsigned() && !(v[e].is_number_integer() && v[e].get<int64_t>() >= 0))
        MS_THROW("layers.{}[{}]: not a non-negative integer", key, e);
      c.push_back(v[e].get<uint64_t>());
    }
  }
  return d;
}

void ExpertDistribution::save(const std::filesystem::path& path) const {
  write_json_file(path, to_json(), -1, "the expert distribution");
}

ExpertDistribution ExpertDistribution::load(const std::filesystem::path& path) {
  const json j = read_json_file(path, "the expert distribution");
  try {
    return from_json(j);
  } catch (const Error& e) {
    MS_THROW("{}: {}", path.string(), e.message());
  }
}

void ExpertDistribution::check_model(int n_experts, const std::vector<int>& moe_layers) const {
  MS_CHECK(n_experts_ == n_experts, "n_experts: the expert distribution counts {} experts, the model has {}",
           n_experts_, n_experts);
  std::lock_guard<std::mutex> lock(mu_);
  for (int l : moe_layers)
    MS_CHECK(counts_.count(l), "layers: the expert distribution has no counts for MoE layer {}", l);
  for (const auto& [l, c] : counts_) {
    bool moe = false;
    for (int m : moe_layers) moe = moe || m == l;
    MS_CHECK(moe, "layers.{}: layer {} is not a MoE layer of the model", l, l);
  }
}

}  // namespace ms::moe
