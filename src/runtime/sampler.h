// Turns one row of logits into one token for one request: penalties, temperature, top-k, top-p, min-p, a
// seeded draw, and logprobs.
//
// Order of processing, as OpenAI / vLLM / SGLang users expect:
//   0. logit_bias: each listed token's bias is added to its logit (-100 all but bans it, 100 all but forces);
//   1. repetition_penalty r over tokens seen in the prompt or the output: x > 0 -> x / r, else x * r;
//   2. frequency_penalty f and presence_penalty p over output tokens only: x -= f * count + p * (count > 0);
//   3. temperature T: T < 1e-5 means greedy (argmax of the penalised logits, ties to the lowest id);
//      otherwise probabilities softmax(x / T);
//   4. top_k (0 or -1: off): the k most likely tokens (ties to the lowest id);
//   5. top_p: the smallest most-likely-first prefix of the renormalised top-k distribution whose mass
//      reaches top_p; at least one token;
//   6. min_p: drop tokens whose probability is below min_p times the largest probability;
//   7. draw from what is left, renormalised.
//
// Logprobs follow vLLM's default ("raw_logprobs"): the log-softmax of the model's logits as they come, before
// penalties, temperature and truncation. So the logprob of a chosen token does not depend on the sampling
// settings and matches what the model assigns to it; top_logprobs lists the n most likely tokens of that same
// distribution, most likely first (ties to the lowest id).
//
// Reproducibility: each request draws from its own counter-based stream (splitmix64 of the hashed seed and
// the index of the token being generated), so a seed gives the same tokens whatever else is in the batch, in
// whatever order, and a state rebuilt from the tokens generated so far (after preemption) continues the
// stream.
//
// Cost: the row is read a few times; a copy is made only when penalties apply; top-k keeps a candidate buffer
// of about 2k entries; top-p without top-k finds its cut-off with a histogram of probabilities and sorts only
// the tokens above it. Buffers live in per-thread workspaces owned by the Sampler and are reused across
// calls.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/logits_topc.h"
#include "runtime/engine_types.h"

namespace ms::runtime {

class Sampler;

struct TokenProbability {
  int32_t token = 0;
  float probability = 0.0f;
};

// What one request remembers between steps: its random stream and, when it uses penalties, the tokens it has
// seen. Made by Sampler::new_state; Sampler::sample advances it.
class SamplerState {
 public:
  uint64_t seed() const { return seed_; }
  // Tokens sampled so far, which is also the index of the next random draw.
  int64_t step() const { return step_; }
  // Whether the state tracks tokens (it does when the request's params use a penalty).
  bool tracks_tokens() const { return track_; }
  // Times `token` was generated (0 when untracked).
  int32_t output_count(int32_t token) const;
  // Whether `token` is in the prompt or the output (false when untracked).
  bool seen(int32_t token) const { return slot_of_.count(token) != 0; }

 private:
  friend class Sampler;

  struct TokenProbability {
    int32_t token = 0;
    float probability = 0.0f;
  };
  void record(int32_t token, bool output);

  uint64_t seed_ = 0;
  uint64_t key_ = 0;  // the seed, hashed, that keys the stream
  int64_t step_ = 0;
  bool track_ = false;
  std::unordered_map<int32_t, int32_t> slot_of_;  // token -> index into seen_tokens_
  std::vector<int32_t> seen_tokens_;              // [distinct] tokens of the prompt or the output
  std::vector<int32_t> output_counts_;            // [distinct] times each was generated
};

struct SamplerOptions {
  int max_top_logprobs = 20;  // the most top_logprobs a request may ask for (OpenAI's and vLLM's default)
  // Seeds the streams of requests that bring no seed; absent: from std::random_device.
  std::optional<uint64_t> global_seed;
};

// One per engine. sample() and sample_batch() reuse internal workspaces: call them from one thread at a time
// (sample_batch spreads its rows over OpenMP threads itself). new_state() may be called from any thread.
class Sampler {
 public:
  explicit Sampler(int vocab_size, SamplerOptions options = {});
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  int vocab_size() const { return vocab_size_; }

  // Throws ms::Error naming the first field out of range.
  void validate(const SamplingParams& params) const;

  // A state for a request with these params and prompt; `output_ids` are tokens it already generated (a
  // request resumed after preemption), counted for penalties and advancing the random stream.
  SamplerState new_state(const SamplingParams& params, std::span<const int32_t> prompt_ids,
                         std::span<const int32_t> output_ids = {});

  // logits: f32 [vocab]. Picks a token, records it in `state` and advances its stream.
  GeneratedToken sample(std::span<const float> logits, const SamplingParams& params, SamplerState& state);

  // logits: f32 [rows, vocab], row-major; params, states, out: [rows], states distinct. Rows run in parallel.
  // A failing row throws ms::Error naming the row (states of other rows may have advanced).
  void sample_batch(std::span<const float> logits, std::span<const SamplingParams* const> params,
                    std::span<SamplerState* const> states, std::span<GeneratedToken> out);

  // Candidate summaries (kernels/cpu/logits_topc.h): a row reduced to its top C tokens and its sums.
  // Whether a summary can ever decide a row sampled with `params`: no logit_bias, no penalties,
  // top_logprobs <= C, and greedy, or top_k in 1..C, or top_p < 1, or min_p > 0 (plain temperature sampling
  // over the whole vocabulary needs every weight in id order).
  bool summary_may_decide(const SamplingParams& params) const;
  // Samples a row from its summary: true when the candidates decide it (the token, logprob and top_logprobs
  // sample() gives on the full row; `state` advances), false when the full row is needed (`state` and `out`
  // untouched). Decides: greedy; top_k <= C (then top-p and min-p within it); top-p whose nucleus ends
  // within the candidates; min-p whose bar cuts within them. Throws as sample() does on NaN or a row
  // without a finite maximum. Thread-safe for distinct states.
  bool sample_summary(const kernels::cpu::LogitsTopC& summary, const SamplingParams& params,
                      SamplerState& state, GeneratedToken& out) const;
  // How far (relative) the running mass must be from top_p x sum_exp_t before a summary decides a top-p
  // cut: the device's sum differs from the host's by ~2 ulp of f32 per term (expf) at most.
  static constexpr double kSummaryTopPMargin = 1e-5;

  // Applies step 0 above to `logits` [vocab] in place (ids validated by validate()).
  void apply_bias(std::span<float> logits, const SamplingParams& params) const;
  // Applies steps 1-2 above to `logits` [vocab] in place.
  void apply_penalties(std::span<float> logits, const SamplingParams& params,
                       const SamplerState& state) const;

  // The distribution step 7 draws from, after penalties and truncation: (token, probability), most likely
  // first; probabilities sum to 1. Greedy gives the argmax with probability 1. Does not advance the state.
  // Allocates its result (up to the whole vocabulary): for tests and debugging, not the decode loop.
  std::vector<TokenProbability> kept_distribution(std::span<const float> logits, const SamplingParams& params,
                                                  const SamplerState& state);

  struct Workspace;  // per-thread buffers, defined in sampler.cpp

 private:
  // logits: f32 [vocab]. Writes `out`, reusing its top_logprobs storage.
  void sample_row(const float* logits, const SamplingParams& params, SamplerState& state, Workspace& ws,
                  GeneratedToken& out) const;

  int vocab_size_;
  SamplerOptions options_;
  uint64_t global_seed_;
  std::atomic<uint64_t> unseeded_count_{0};
  std::vector<std::unique_ptr<Workspace>> workspaces_;  // [OpenMP threads]
  std::vector<const SamplerState*> batch_states_;       // [rows] scratch for the distinctness check
};

}  // namespace ms::runtime
