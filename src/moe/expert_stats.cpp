#include "moe/expert_stats.h"

#include <algorithm>

#include "core/error.h"
#include "moe/router.h"

namespace ms::moe {

std::vector<uint64_t> DistinctExpertsHistogram::cumulative() const {
  std::vector<uint64_t> out(counts.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < counts.size(); ++i) out[i] = acc += counts[i];
  return out;
}

std::vector<double> ExpertStats::bucket_bounds(int n_experts) {
  MS_CHECK(n_experts > 0, "expert stats: n_experts is {}", n_experts);
  std::vector<double> b;
  auto add = [&](int v) {
    if (v < n_experts) b.push_back(v);
  };
  for (int v : {1, 2, 4}) add(v);
  for (int v = 8; v <= 64; v += 8) add(v);
  for (int v = 96; v <= 256; v += 32) add(v);
  for (int v = 512; v < n_experts; v *= 2) add(v);
  b.push_back(n_experts);
  return b;
}

ExpertStats::ExpertStats(int n_layers, int n_experts)
    : n_layers_(n_layers), n_experts_(n_experts), bounds_(bucket_bounds(n_experts)) {
  MS_CHECK(n_layers > 0, "expert stats: n_layers is {}", n_layers);
  per_layer_.resize(static_cast<size_t>(n_layers) * 2);
  reset();
}

size_t ExpertStats::slot(int layer, RoutingKind kind) const {
  MS_CHECK(layer >= 0 && layer < n_layers_, "expert stats: layer {} is outside [0, {})", layer, n_layers_);
  return static_cast<size_t>(layer) * 2 + (kind == RoutingKind::Oea ? 1 : 0);
}

void ExpertStats::reset() {
  std::lock_guard lock(mu_);
  for (auto& h : per_layer_) {
    h.bounds = bounds_;
    h.counts.assign(bounds_.size(), 0);
    h.sum = 0;
    h.count = 0;
  }
}

void ExpertStats::record(int layer, RoutingKind kind, int distinct_experts) {
  MS_CHECK(distinct_experts >= 0 && distinct_experts <= n_experts_,
           "expert stats: distinct experts {} is outside [0, {}]", distinct_experts, n_experts_);
  const size_t s = slot(layer, kind);
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), static_cast<double>(distinct_experts)) -
      bounds_.begin();
  std::lock_guard lock(mu_);
  auto& h = per_layer_[s];
  h.counts[bucket] += 1;
  h.sum += distinct_experts;
  h.count += 1;
}

int ExpertStats::record_batch(int layer, RoutingKind kind, const int32_t* topk_ids, int n_tokens, int top_k) {
  const int distinct = count_distinct_experts(topk_ids, n_tokens, top_k, n_experts_);
  record(layer, kind, distinct);
  return distinct;
}

DistinctExpertsHistogram ExpertStats::histogram(int layer, RoutingKind kind) const {
  const size_t s = slot(layer, kind);
  std::lock_guard lock(mu_);
  return per_layer_[s];
}

DistinctExpertsHistogram ExpertStats::histogram(RoutingKind kind) const {
  DistinctExpertsHistogram out;
  out.bounds = bounds_;
  out.counts.assign(bounds_.size(), 0);
  std::lock_guard lock(mu_);
  for (int l = 0; l < n_layers_; ++l) {
    const auto& h = per_layer_[static_cast<size_t>(l) * 2 + (kind == RoutingKind::Oea ? 1 : 0)];
    for (size_t i = 0; i < h.counts.size(); ++i) out.counts[i] += h.counts[i];
    out.sum += h.sum;
    out.count += h.count;
  }
  return out;
}

}  // namespace ms::moe
