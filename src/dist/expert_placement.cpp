#include "dist/expert_placement.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_file.h"

namespace ms::dist {

using nlohmann::json;

ExpertPlacement ExpertPlacement::contiguous(int n_experts, int ep_size) {
  MS_CHECK(ep_size >= 1, "ep_size {} must be at least 1", ep_size);
  MS_CHECK(n_experts >= 1 && n_experts % ep_size == 0,
           "n_routed_experts {} is not a positive multiple of ep_size {}", n_experts, ep_size);
  const int per = n_experts / ep_size;
  std::vector<std::vector<int>> ranks(ep_size);
  for (int e = 0; e < n_experts; ++e) ranks[e / per].push_back(e);
  return from_ranks(n_experts, std::move(ranks));
}

ExpertPlacement ExpertPlacement::with_redundancy(int n_experts, int ep_size, int num_redundant,
                                                 const std::vector<uint64_t>& counts) {
  ExpertPlacement base = contiguous(n_experts, ep_size);
  MS_CHECK(num_redundant >= 0 && num_redundant % ep_size == 0,
           "--ep-num-redundant-experts {} must be a non-negative multiple of ep_size {}", num_redundant,
           ep_size);
  MS_CHECK(num_redundant <= n_experts * (ep_size - 1),
           "--ep-num-redundant-experts {} exceeds one copy of every expert per rank", num_redundant);
  if (num_redundant == 0) return base;
  MS_CHECK(static_cast<int>(counts.size()) == n_experts, "routing counts have {} entries for {} experts",
           counts.size(), n_experts);
  std::vector<int> copies(n_experts, 1);
  std::vector<int> extra;  // experts receiving a replica, in order of choice
  for (int i = 0; i < num_redundant; ++i) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e) {
      if (copies[e] >= ep_size) continue;  // already on every rank
      if (best < 0 ||
          static_cast<double>(counts[e]) / copies[e] > static_cast<double>(counts[best]) / copies[best])
        best = e;
    }
    ++copies[best];
    extra.push_back(best);
  }
  // Pack all n + K copies afresh (as EPLB does): heaviest copy first onto the least loaded rank with a free
  // slot that lacks the expert. Keeping the contiguous base and adding replicas could not work: the hot
  // experts often share a rank, whose free slots their replicas may not use.
  auto share = [&](int e) { return static_cast<double>(counts[e]) / copies[e]; };
  std::vector<int> order;
  for (int e = 0; e < n_experts; ++e)
    for (int c = 0; c < copies[e]; ++c) order.push_back(e);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return share(a) > share(b); });
  const int cap = n_experts / ep_size + num_redundant / ep_size;
  std::vector<std::vector<int>> ranks(ep_size);
  std::vector<double> load(ep_size, 0.0);
  auto holds = [&](int r, int e) { return std::find(ranks[r].begin(), ranks[r].end(), e) != ranks[r].end(); };
  for (int e : order) {
    int best = -1;
    for (int r = 0; r < ep_size; ++r) {
      if (static_cast<int>(ranks[r].size()) >= cap || holds(r, e)) continue;
      if (best < 0 || load[r] < load[best]) best = r;
    }
    if (best < 0) {
      // Every rank with room already holds e: move some x from a full rank q lacking e to a rank r with
      // room that lacks x, then e takes x's slot on q. Copies of e number at most ep, so q exists.
      for (int r = 0; r < ep_size && best < 0; ++r) {
        if (static_cast<int>(ranks[r].size()) >= cap) continue;
        for (int q = 0; q < ep_size && best < 0; ++q) {
          if (holds(q, e)) continue;
          for (int& x : ranks[q])
            if (!holds(r, x)) {
              ranks[r].push_back(x);
              load[r] += share(x), load[q] -= share(x);
              x = e;
              load[q] += share(e);
              best = q;
              break;
            }
        }
      }
      MS_CHECK(best >= 0, "no rank can take a copy of expert {}", e);
      continue;
    }
    ranks[best].push_back(e);
    load[best] += share(e);
  }
  return from_ranks(n_experts, std::move(ranks));
}

ExpertPlacement ExpertPlacement::from_ranks(int n_experts, std::vector<std::vector<int>> rank_experts) {
  ExpertPlacement p;
  p.n_experts_ = n_experts;
  p.rank_experts_ = std::move(rank_experts);
  p.build_index();
  return p;
}

void ExpertPlacement::build_index() {
  MS_CHECK(n_experts_ >= 1, "n_experts: {} must be positive", n_experts_);
  MS_CHECK(!rank_experts_.empty(), "rank_experts: no ranks");
  replicas_.assign(n_experts_, {});
  for (size_t r = 0; r < rank_experts_.size(); ++r) {
    for (size_t s = 0; s < rank_experts_[r].size(); ++s) {
      int e = rank_experts_[r][s];
      if (e < 0 || e >= n_experts_)
        MS_THROW("rank_experts[{}][{}]: expert {} out of range [0, {})", r, s, e, n_experts_);
      for (const ExpertSlot& c : replicas_[e])
        if (c.rank == static_cast<int>(r))
          MS_THROW("rank_experts[{}][{}]: expert {} is already in slot {} of rank {}", r, s, e, c.slot, r);
      replicas_[e].push_back({static_cast<int>(r), static_cast<int>(s)});
    }
  }
  for (int e = 0; e < n_experts_; ++e)
    if (replicas_[e].empty()) MS_THROW("rank_experts: expert {} is placed on no rank", e);
}

int ExpertPlacement::slots_per_rank() const {
  size_t n = 0;
  for (const auto& r : rank_experts_) n = std::max(n, r.size());
  return static_cast<int>(n);
}

double ExpertPlacement::imbalance(const std::vector<uint64_t>& counts) const {
  MS_CHECK(static_cast<int>(counts.size()) == n_experts_, "counts have {} entries for {} experts",
           counts.size(), n_experts_);
  double total = 0, worst = 0;
  for (const auto& r : rank_experts_) {
    double load = 0;
    for (int e : r) load += static_cast<double>(counts[e]) / static_cast<double>(replicas_[e].size());
    worst = std::max(worst, load);
    total += load;
  }
  return total > 0 ? worst / (total / static_cast<double>(rank_experts_.size())) : 1.0;
}

json ExpertPlacement::to_json() const {
  return json{{"n_experts", n_experts_}, {"ep_size", ep_size()}, {"rank_experts", rank_experts_}};
}

ExpertPlacement ExpertPlacement::from_json(const json& j) {
  MS_CHECK(j.is_object(), "expert placement: not a JSON object");
  for (const char* k : {"n_experts", "ep_size", "rank_experts"})
    if (!j.contains(k)) MS_THROW("expert placement: missing field '{}'", k);
  if (!j["n_experts"].is_number_integer()) MS_THROW("n_experts: not an integer");
  if (!j["ep_size"].is_number_integer()) MS_THROW("ep_size: not an integer");
  const json& re = j["rank_experts"];
  if (!re.is_array()) MS_THROW("rank_experts: not an array");
  const int ep = j["ep_size"].get<int>();
  if (static_cast<int>(re.size()) != ep)
    MS_THROW("rank_experts: {} ranks listed, ep_size is {}", re.size(), ep);
  std::vector<std::vector<int>> ranks(re.size());
  for (size_t r = 0; r < re.size(); ++r) {
    if (!re[r].is_array()) MS_THROW("rank_experts[{}]: not an array", r);
    for (size_t s = 0; s < re[r].size(); ++s) {
      if (!re[r][s].is_number_integer()) MS_THROW("rank_experts[{}][{}]: not an integer", r, s);
      ranks[r].push_back(re[r][s].get<int>());
    }
  }
  return from_ranks(j["n_experts"].get<int>(), std::move(ranks));
}

void ExpertPlacement::save(const std::filesystem::path& path) const {
  write_json_file(path, to_json(), 1, "expert placement");
}

ExpertPlacement ExpertPlacement::load(const std::filesystem::path& path) {
  return from_json(read_json_file(path, "expert placement"));
}

LayerPlacements LayerPlacements::with_redundancy(int n_experts, int ep_size, int num_redundant,
                                                 const std::map<int, std::vector<uint64_t>>& counts) {
  MS_CHECK(!counts.empty(), "expert placement: no layer has routing counts");
  LayerPlacements p;
  p.n_experts_ = n_experts;
  p.ep_size_ = ep_size;
  for (const auto& [l, c] : counts)
    p.layers_.emplace(l, ExpertPlacement::with_redundancy(n_experts, ep_size, num_redundant, c));
  p.check_slots();
  return p;
}

const ExpertPlacement* LayerPlacements::layer(int layer) const {
  auto it = layers_.find(layer);
  return it == layers_.end() ? nullptr : &it->second;
}

int LayerPlacements::slots_per_rank() const {
  return layers_.empty() ? 0 : layers_.begin()->second.slots_per_rank();
}

void LayerPlacements::check_slots() const {
  const int slots = slots_per_rank();
  for (const auto& [l, p] : layers_)
    for (int r = 0; r < p.ep_size(); ++r)
      if (static_cast<int>(p.local_experts(r).size()) != slots)
        MS_THROW("layers.{}.rank_experts[{}]: {} experts, other ranks and layers hold {}", l, r,
                 p.local_experts(r).size(), slots);
}

json LayerPlacements::to_json() const {
  json layers = json::object();
  for (const auto& [l, p] : layers_) layers[std::to_string(l)] = p.to_json()["rank_experts"];
  return json{{"n_experts", n_experts_}, {"ep_size", ep_size_}, {"layers", layers}};
}

LayerPlacements LayerPlacements::from_json(const json& j) {
  MS_CHECK(j.is_object(), "expert placement: not a JSON object");
  for (const char* k : {"n_experts", "ep_size", "layers"})
    if (!j.contains(k)) MS_THROW("expert placement: missing field '{}'", k);
  if (!j["n_experts"].is_number_integer()) MS_THROW("n_experts: not an integer");
  if (!j["ep_size"].is_number_integer() || j["ep_size"].get<int64_t>() < 1)
    MS_THROW("ep_size: not a positive integer");
  if (!j["layers"].is_object() || j["layers"].empty()) MS_THROW("layers: not a non-empty object");
  LayerPlacements p;
  p.n_experts_ = j["n_experts"].get<int>();
  p.ep_size_ = j["ep_size"].get<int>();
  for (const auto& [key, v] : j["layers"].items()) {
    size_t used = 0;
    int layer = -1;
    try {
      layer = std::stoi(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || layer < 0) MS_THROW("layers.{}: the key is not a layer index", key);
    try {
      p.layers_.emplace(layer,
                        ExpertPlacement::from_json(
                            json{{"n_experts", p.n_experts_}, {"ep_size", p.ep_size_}, {"rank_experts", v}}));
    } catch (const Error& e) {
      MS_THROW("layers.{}.{}", key, e.message());
    }
  }
  p.check_slots();
  return p;
}

void LayerPlacements::save(const std::filesystem::path& path) const {
  write_json_file(path, to_json(), -1, "expert placement");
}

LayerPlacements LayerPlacements::load(const std::filesystem::path& path) {
  try {
    return from_json(read_json_file(path, "expert placement"));
  } catch (const Error& e) {
    MS_THROW("{}: {}", path.string(), e.message());
  }
}

void LayerPlacements::check(int n_experts, int ep_size, const std::vector<int>& moe_layers) const {
  MS_CHECK(n_experts_ == n_experts, "n_experts: the expert placement is for {} experts, the model has {}",
           n_experts_, n_experts);
  MS_CHECK(ep_size_ == ep_size, "ep_size: the expert placement is for {} ranks, --ep-size is {}", ep_size_,
           ep_size);
  for (int l : moe_layers)
    MS_CHECK(layers_.count(l), "layers: the expert placement has no entry for MoE layer {}", l);
  for (const auto& [l, p] : layers_) {
    bool moe = false;
    for (int m : moe_layers) moe = moe || m == l;
    MS_CHECK(moe, "layers.{}: layer {} is not a MoE layer of the model", l, l);
  }
}

}  // namespace ms::dist
