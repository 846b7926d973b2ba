// Tokens routed to each expert per MoE layer over a run (--expert-distribution-out), the input of
// EPLB-style redundant expert placement (--expert-distribution, dist::LayerPlacements). Saved as JSON:
//   {"n_experts": E, "layers": {"<layer index>": [count of expert 0, ..., count of expert E-1], ...}}
// with one entry per MoE layer (layer indices as in the model, dense layers absent); a count is the number of
// (token, top-k slot) assignments of that expert: every token of every step, prefill and decode, as the
// experts ran it (plain routing, or OEA's choice for decode tokens under --oea-k0).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ms::moe {

class ExpertDistribution {
 public:
  // moe_layers: the MoE layers' indices.
  ExpertDistribution(int n_experts, const std::vector<int>& moe_layers);
  // Moves the counts (not while another thread records into `o`).
  ExpertDistribution(ExpertDistribution&& o) noexcept
      : n_experts_(o.n_experts_), counts_(std::move(o.counts_)) {}

  // Adds a routed batch of `layer`: topk_ids [n_tokens, top_k] (-1 = empty slot, skipped). Thread-safe.
  void record(int layer, const int32_t* topk_ids, int64_t n_tokens, int top_k);

  int n_experts() const { return n_experts_; }
  // layer -> [n_experts] counts, a copy (thread-safe).
  std::map<int, std::vector<uint64_t>> counts() const;

  nlohmann::json to_json() const;
  // Throws ms::Error naming the bad field ("layers.3[7]: not a non-negative integer").
  static ExpertDistribution from_json(const nlohmann::json& j);
  void save(const std::filesystem::path& path) const;
  static ExpertDistribution load(const std::filesystem::path& path);

  // Throws unless the file's experts and layers are the model's (n_routed_experts, its MoE layers), naming
  // what differs.
  void check_model(int n_experts, const std::vector<int>& moe_layers) const;

 private:
  ExpertDistribution() = default;
  int n_experts_ = 0;
  mutable std::mutex mu_;
  std::map<int, std::vector<uint64_t>> counts_;  // layer -> [n_experts]
};

}  // namespace ms::moe
