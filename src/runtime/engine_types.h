// What goes into the Engine and what comes out of it: shared by the runtime, the server and the CLI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ms::runtime {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::optional<uint64_t> seed;  // per-request stream of random numbers
  int top_logprobs = -1;         // -1: no logprobs; 0: logprob of the chosen token only; n: and the top n
  // Added to the logits of these token ids before penalties and sampling (OpenAI logit_bias, in [-100, 100]).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

struct Request {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // besides the model's eos ids
  bool ignore_eos = false;
};

enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", ...

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct GeneratedToken {
  int32_t token = 0;
  float logprob = 0.0f;                    // when requested
  std::vector<TokenLogprob> top_logprobs;  // when requested, most likely first
};

// One request's news from one engine step: the tokens it produced (0 or 1 per step today) and whether it
// ended.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<GeneratedToken> tokens;
  FinishReason finish = FinishReason::None;
  std::string error;  // when finish == Error
  bool refused =
      false;  // Error before the request ran: its input was refused (a client error, not a failure)
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // served from the prefix cache
  int completion_tokens = 0;     // so far
};

struct EngineStats {
  int running = 0, waiting = 0;
  int kv_pages_total = 0, kv_pages_used = 0;
  int kv_pages_cached =
      0;  // of the used ones, held by the prefix cache (evictable once no request uses them)
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens
  int64_t preemptions = 0;  // running sequences sent back to wait for pages (recomputed later)
  int64_t max_context = 0;
  // The busy loop's time (steps that ran the model): the steps' wall time, the part spent waiting on the
  // executor (on a GPU: the device's work and the copies back), and the gaps between a step that left work
  // and the next step's start (the caller's own work: delivering tokens, detokenising). The rest of the loop
  // is host time in which a synchronous device waits: 1 - executor / (step + gap).
  int64_t model_steps_total = 0;
  double step_seconds_total = 0, executor_seconds_total = 0, gap_seconds_total = 0;
};

}  // namespace ms::runtime
