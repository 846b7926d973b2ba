// Server metrics and their Prometheus text exposition (format 0.0.4): counters, gauges from the engine's
// stats, and latency histograms (TTFT, inter-token, end to end) in seconds.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "moe/expert_stats.h"
#include "runtime/engine_types.h"

namespace ms::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implicit
  void observe(double v);
  // Appends `name_bucket{le=...}`, `name_sum`, `name_count` lines.
  void render(std::string& out, const std::string& name) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // [bounds + 1], not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  Histogram ttft, itl, e2e;  // seconds
  std::atomic<int64_t> requests_ok{0}, requests_failed{0}, requests_cancelled{0};
  std::atomic<int64_t> prompt_tokens{0}, generation_tokens{0};
  std::atomic<int64_t> http_client_errors{0};  // 4xx answers

  std::string render(const runtime::EngineStats& engine, size_t active_requests,
                     const std::string& model) const;
  // Appends moeserve_moe_distinct_experts (a histogram labelled kind="baseline" / "oea") when either has
  // bounds; a kind with no observations is left out.
  static void render_distinct_experts(std::string& out, const moe::DistinctExpertsHistogram& baseline,
                                      const moe::DistinctExpertsHistogram& oea);
};

}  // namespace ms::server
