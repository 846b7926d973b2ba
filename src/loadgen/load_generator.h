// `moeserve bench`: a load generator for any OpenAI-compatible server. Sends streaming requests with random
// prompts of chosen lengths, either at a Poisson request rate or with a fixed number in flight, and measures
// what users compare servers by: time to first token (TTFT), inter-token latency (ITL), time per output
// token after the first (TPOT), end-to-end latency, and request / token throughput.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ms::loadgen {

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:30000";
  bool chat = false;  // /v1/chat/completions instead of /v1/completions
  std::string model;  // empty: the first of GET /v1/models
  std::string api_key;
  int num_prompts = 200;
  int input_len = 1024, output_len = 128;
  double range_ratio = 1.0;  // lengths uniform in [len * range_ratio, len]
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s, Poisson arrivals
  int max_concurrency = 0;                                        // 0: no limit
  uint64_t seed = 1;
  bool progress = true;
  double request_timeout_s = 600;
  double duration_s = 0;  // > 0: stop sending new requests after this long (a soak run of bounded time)
};

struct Percentiles {
  double mean = 0, median = 0, p99 = 0;  // milliseconds
};

struct RequestResult {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0, output_tokens = 0;
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;
};

struct BenchSummary {
  int max_concurrency = 0;  // 0: unlimited
  double request_rate = 0;  // as configured (inf: all at once)
  int completed = 0, failed = 0;
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;  // per second
  double per_user_output_tokens_per_s = 0;  // mean over requests of output tokens / (e2e - ttft)
  Percentiles ttft_ms, itl_ms, tpot_ms, e2e_ms;
  std::vector<std::string> errors;  // the first few
  // From the server's /metrics before and after the run, where it exports moeserve's engine counters
  // (engine_steps < 0: it does not): engine steps in the run and the share of the engine's busy loop in which
  // a synchronous device waited for the host, 1 - executor / (step + gap).
  int64_t engine_steps = -1;
  double engine_host_share = 0;
};

// The engine's busy-loop counters of a Prometheus text exposition (moeserve's /metrics); absent: ok = false.
struct EngineLoopCounters {
  bool ok = false;
  double steps = 0, step_s = 0, executor_s = 0, gap_s = 0;
};
EngineLoopCounters parse_engine_counters(const std::string& metrics_text);

// Values at fraction q in [0, 1] with linear interpolation between ranks; empty input gives 0.
double percentile(std::vector<double> values, double q);
Percentiles summarize_ms(const std::vector<double>& seconds);
BenchSummary summarize(const std::vector<RequestResult>& results, double duration_s, int max_concurrency,
                       double request_rate);

// Runs one setting. Throws ms::Error when the server cannot be reached at all.
BenchSummary run_bench(const BenchConfig& config);

std::string format_summary(const BenchSummary& s);
nlohmann::json summary_json(const BenchSummary& s);
std::string csv_header();
std::string csv_row(const BenchSummary& s);

}  // namespace ms::loadgen
