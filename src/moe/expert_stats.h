// Distinct experts per MoE layer per step, with and without OEA: running means and fixed-bucket histograms
// that a Prometheus exporter can print as they are (bounds never change after construction).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace ms::moe {

enum class RoutingKind { Baseline, Oea };

// Counts per bucket, not cumulative: counts[i] = observations with bounds[i-1] < v <= bounds[i]; the last
// bound is n_experts, so there is no +Inf overflow (Prometheus' +Inf bucket equals `count`).
struct DistinctExpertsHistogram {
  std::vector<double> bounds;    // upper bounds ("le"), ascending
  std::vector<uint64_t> counts;  // [bounds.size()]
  double sum = 0;
  uint64_t count = 0;
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
  std::vector<uint64_t> cumulative() const;  // Prometheus order: counts of v <= bounds[i]
};

// Thread-safe: the engine records from its step thread while a server thread reads.
class ExpertStats {
 public:
  ExpertStats(int n_layers, int n_experts);

  // Fixed bounds for n_experts: 1, 2, 4, 8, then steps of 8 up to 64, steps of 32 up to 256, then doubling;
  // the last bound is n_experts.
  static std::vector<double> bucket_bounds(int n_experts);

  void record(int layer, RoutingKind kind, int distinct_experts);
  // Counts the distinct experts of a routed batch (topk_ids [n_tokens, top_k], -1 = empty) and records it.
  int record_batch(int layer, RoutingKind kind, const int32_t* topk_ids, int n_tokens, int top_k);

  DistinctExpertsHistogram histogram(int layer, RoutingKind kind) const;
  DistinctExpertsHistogram histogram(RoutingKind kind) const;  // all layers together
  double mean(int layer, RoutingKind kind) const { return histogram(layer, kind).mean(); }
  double mean(RoutingKind kind) const { return histogram(kind).mean(); }

  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  void reset();

 private:
  size_t slot(int layer, RoutingKind kind) const;
  int n_layers_, n_experts_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<DistinctExpertsHistogram> per_layer_;  // [n_layers * 2]: (layer, kind)
};

}  // namespace ms::moe
