// Where each routed expert lives under expert parallelism: n_routed_experts over ep_size ranks in
// contiguous blocks, plus optional redundant replicas of the hottest experts (from recorded routing counts)
// so that the busiest rank's load comes down. Saved and loaded as JSON (--ep-num-redundant-experts K).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ms::dist {

struct ExpertSlot {
  int rank = 0;  // EP rank holding the copy
  int slot = 0;  // index into that rank's local expert weights
  bool operator==(const ExpertSlot&) const = default;
};

class ExpertPlacement {
 public:
  // Expert e on rank e / (n / ep), slot e % (n / ep). Needs n % ep == 0.
  static ExpertPlacement contiguous(int n_experts, int ep_size);
  // `num_redundant` extra slots (a multiple of ep_size, so every rank holds n/ep + num_redundant/ep slots);
  // 0 gives contiguous(). Replicas go, one at a time, to the expert with the largest load per copy
  // (counts[e] / copies, at most one copy per rank); then all copies are packed afresh, heaviest first, each
  // onto the least loaded rank with a free slot that does not hold that expert yet.
  // counts: [n_experts] tokens routed to each expert (any layer sum).
  static ExpertPlacement with_redundancy(int n_experts, int ep_size, int num_redundant,
                                         const std::vector<uint64_t>& counts);
  // From explicit rank -> local expert lists; validate()s.
  static ExpertPlacement from_ranks(int n_experts, std::vector<std::vector<int>> rank_experts);

  int n_experts() const { return n_experts_; }
  int ep_size() const { return static_cast<int>(rank_experts_.size()); }
  int slots_per_rank() const;  // the largest local slot count
  const std::vector<ExpertSlot>& replicas(int expert) const { return replicas_.at(expert); }
  const std::vector<int>& local_experts(int rank) const { return rank_experts_.at(rank); }  // slot -> expert
  // Largest per-rank share of `counts` (each expert's count split evenly over its copies) divided by the
  // mean share: 1.0 is perfect balance.
  double imbalance(const std::vector<uint64_t>& counts) const;

  // {"n_experts": N, "ep_size": R, "rank_experts": [[e, ...], ...]}
  nlohmann::json to_json() const;
  // Throws ms::Error naming the bad field ("rank_experts[2][5]: expert 300 out of range [0, 256)").
  static ExpertPlacement from_json(const nlohmann::json& j);
  void save(const std::filesystem::path& path) const;
  static ExpertPlacement load(const std::filesystem::path& path);

 private:
  void
  build_index();  // replicas_ from rank_experts_, checking every expert is placed and no repeats on a rank
  int n_experts_ = 0;
  std::vector<std::vector<int>> rank_experts_;     // [ep][slot] -> logical expert
  std::vector<std::vector<ExpertSlot>> replicas_;  // [expert] -> copies
};

// One placement per MoE layer (each layer's hot experts differ; every layer has the same slots per rank, so
// the per-layer expert tables keep one shape). Saved and loaded as JSON (--ep-placement-out /
// --ep-placement):
//   {"n_experts": N, "ep_size": R, "layers": {"<layer index>": [[e, ...] per rank], ...}}
// each layer's value being ExpertPlacement's rank_experts.
class LayerPlacements {
 public:
  // ExpertPlacement::with_redundancy for every layer of `counts` (layer -> [n_experts] routed tokens).
  static LayerPlacements with_redundancy(int n_experts, int ep_size, int num_redundant,
                                         const std::map<int, std::vector<uint64_t>>& counts);

  int n_experts() const { return n_experts_; }
  int ep_size() const { return ep_size_; }
  const std::map<int, ExpertPlacement>& layers() const { return layers_; }
  // The placement of `layer`, or null when it lists none.
  const ExpertPlacement* layer(int layer) const;
  // The slots per rank of every layer (they are equal: checked on construction).
  int slots_per_rank() const;

  nlohmann::json to_json() const;
  // Throws ms::Error naming the bad field ("layers.3.rank_experts[1][0]: expert 99 out of range [0, 16)").
  static LayerPlacements from_json(const nlohmann::json& j);
  void save(const std::filesystem::path& path) const;
  static LayerPlacements load(const std::filesystem::path& path);

  // Throws unless the placements fit the model and the run: `n_experts` routed experts, `ep_size` ranks,
  // exactly the MoE layers `moe_layers`; the message names the field and both values.
  void check(int n_experts, int ep_size, const std::vector<int>& moe_layers) const;

 private:
  void check_slots() const;  // every rank of every layer holds the same number of slots
  int n_experts_ = 0, ep_size_ = 0;
  std::map<int, ExpertPlacement> layers_;
};

}  // namespace ms::dist
