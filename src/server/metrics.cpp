#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace ms::server {
namespace {

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

void metric(std::string& out, const std::string& name, const char* type, const char* help, double value,
            const std::string& labels = "") {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name, labels,
                     number(value));
}

// Label values escape backslash, double quote and newline.
std::string label_value(const std::string& v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mu_);
  return count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  std::lock_guard lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const double le = i < bounds_.size() ? bounds_[i] : INFINITY;
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(le), cumulative);
  }
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(sum_), name, count_);
}

Metrics::Metrics()
    : ttft(
          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl({0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
           0.75, 1, 2.5}),
      e2e({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960}) {}

std::string Metrics::render(const runtime::EngineStats& e, size_t active, const std::string& model) const {
  std::string out;
  metric(out, "moeserve_num_requests_running", "gauge", "Requests in the running batch.", e.running);
  metric(out, "moeserve_num_requests_waiting", "gauge", "Requests waiting for admission.", e.waiting);
  metric(out, "moeserve_num_requests_active", "gauge", "Requests the HTTP server is serving.",
         static_cast<double>(active));
  metric(out, "moeserve_kv_pages_total", "gauge", "KV cache pages in the pool.", e.kv_pages_total);
  metric(out, "moeserve_kv_pages_used", "gauge", "KV cache pages in use, prefix cache included.",
         e.kv_pages_used);
  metric(out, "moeserve_kv_pages_free", "gauge", "KV cache pages free.", e.kv_pages_total - e.kv_pages_used);
  metric(out, "moeserve_kv_pages_cached", "gauge", "KV cache pages held by the prefix cache.",
         e.kv_pages_cached);
  metric(out, "moeserve_kv_cache_usage_ratio", "gauge", "Fraction of KV pages in use.",
         e.kv_pages_total ? static_cast<double>(e.kv_pages_used) / e.kv_pages_total : 0.0);
  metric(out, "moeserve_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", static_cast<double>(e.prefix_cache_queries));
  metric(out, "moeserve_prefix_cache_hits_total", "counter", "Prompt tokens served by the prefix cache.",
         static_cast<double>(e.prefix_cache_hits));
  metric(out, "moeserve_prefix_cache_hit_rate", "gauge", "Prefix cache hits over queries, in tokens.",
         e.prefix_cache_queries ? static_cast<double>(e.prefix_cache_hits) / e.prefix_cache_queries : 0.0);
  metric(out, "moeserve_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         static_cast<double>(prompt_tokens.load()));
  metric(out, "moeserve_generation_tokens_total", "counter", "Generated tokens sent to clients.",
         static_cast<double>(generation_tokens.load()));
  out += "# HELP moeserve_requests_total Requests by outcome.\n# TYPE moeserve_requests_total counter\n";
  out += fmt::format("moeserve_requests_total{{outcome=\"ok\"}} {}\n", requests_ok.load());
  out += fmt::format("moeserve_requests_total{{outcome=\"failed\"}} {}\n", requests_failed.load());
  out += fmt::format("moeserve_requests_total{{outcome=\"cancelled\"}} {}\n", requests_cancelled.load());
  metric(out, "moeserve_http_client_errors_total", "counter", "Requests answered with a 4xx status.",
         static_cast<double>(http_client_errors.load()));
  // The engine's busy loop (runtime::EngineStats): 1 - executor / (step + gap) is the share of it in which a
  // synchronous device waits for the host.
  metric(out, "moeserve_engine_steps_total", "counter", "Engine steps that ran the model.",
         static_cast<double>(e.model_steps_total));
  metric(out, "moeserve_engine_step_seconds_total", "counter", "Wall time of those steps.",
         e.step_seconds_total);
  metric(out, "moeserve_engine_executor_seconds_total", "counter",
         "Of that, time waiting on the executor (the device's work and the copies back).",
         e.executor_seconds_total);
  metric(out, "moeserve_engine_gap_seconds_total", "counter",
         "Time between a step that left work and the next step (the serving loop's own work).",
         e.gap_seconds_total);
  const std::pair<const Histogram*, const char*> hs[] = {
      {&ttft, "moeserve_time_to_first_token_seconds"},
      {&itl, "moeserve_inter_token_latency_seconds"},
      {&e2e, "moeserve_e2e_request_latency_seconds"},
  };
  const char* helps[] = {"Time from request arrival to its first token.",
                         "Time between two tokens of a request.",
                         "Time from request arrival to its last token."};
  for (size_t i = 0; i < 3; ++i) {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", hs[i].second, helps[i], hs[i].second);
    hs[i].first->render(out, hs[i].second);
  }
  metric(out, "moeserve_model_info", "gauge", "The served model.", 1,
         fmt::format("{{model=\"{}\"}}", label_value(model)));
  return out;
}

void Metrics::render_distinct_experts(std::string& out, const moe::DistinctExpertsHistogram& baseline,
                                      const moe::DistinctExpertsHistogram& oea) {
  const std::pair<const moe::DistinctExpertsHistogram*, const char*> kinds[] = {{&baseline, "baseline"},
                                                                                {&oea, "oea"}};
  bool header = false;
  for (const auto& [h, kind] : kinds) {
    if (h->bounds.empty() || (h->count == 0 && h != &baseline)) continue;
    if (!header) {
      out +=
          "# HELP moeserve_moe_distinct_experts Distinct experts one MoE layer reads in one decode step "
          "(baseline: plain top-k routing; oea: with Opportunistic Expert Activation).\n"
          "# TYPE moeserve_moe_distinct_experts histogram\n";
      header = true;
    }
    const auto cum = h->cumulative();
    for (size_t i = 0; i < h->bounds.size(); ++i)
      out += fmt::format("moeserve_moe_distinct_experts_bucket{{kind=\"{}\",le=\"{}\"}} {}\n", kind,
                         number(h->bounds[i]), cum[i]);
    out +=
        fmt::format("moeserve_moe_distinct_experts_bucket{{kind=\"{}\",le=\"+Inf\"}} {}\n", kind, h->count);
    out += fmt::format("moeserve_moe_distinct_experts_sum{{kind=\"{}\"}} {}\n", kind, number(h->sum));
    out += fmt::format("moeserve_moe_distinct_experts_count{{kind=\"{}\"}} {}\n", kind, h->count);
  }
}

}  // namespace ms::server
