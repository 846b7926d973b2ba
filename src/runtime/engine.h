// The Engine: requests in, tokens out. submit() validates and queues a request; step() asks the scheduler for
// one batch (decodes first, then prefill chunks within the prefill budget), runs the model once, samples the
// rows that end a sequence's known tokens and commits the tokens back; cancel() ends a request at the next
// step.
//
// Ownership: the Engine owns its Executor (which owns the device memory: weights, KV pages, workspace), the
// page allocator that hands out the executor's KV page ids, the prefix cache and the scheduler, which holds
// page references through the allocator and owns each sequence's token list and block table; the
// Engine keeps per request only what the scheduler does not (the request, its sampler state, what it has
// reported). A sequence the scheduler preempts goes back to waiting and is recomputed later over its prompt
// and generated tokens; to the caller it is still running and no token is reported twice.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "kv/kv_pool.h"
#include "kv/page_allocator.h"
#include "kv/radix_cache.h"
#include "model/model.h"
#include "profiler/op_record.h"
#include "profiler/step_hook.h"
#include "runtime/engine_types.h"
#include "runtime/executor.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "scheduler/scheduler.h"

namespace ms::runtime {

struct EngineConfig {
  // KV pages: used to build the executor of Engine(model, cfg); an Engine given an executor takes them from
  // its kv_capacity().
  int32_t page_size = 64;
  int64_t kv_cache_tokens = 32768;  // pool capacity, in tokens over all sequences
  kv::KvCacheDType kv_cache_dtype = kv::KvCacheDType::Auto;
  int max_running = 8;
  int32_t max_prefill_tokens = 2048;  // prompt tokens per step; longer prompts are prefilled in chunks
  bool enable_prefix_cache = true;    // share whole KV pages of common prompt prefixes between requests
  int64_t max_context = 0;            // 0: the model's max_position_embeddings
  SamplerOptions sampler;             // top_logprobs limit; the seed of requests that bring none
  // Opportunistic Expert Activation for decode tokens (--oea-k0, --oea-kmax); prefill always routes plainly.
  moe::OeaConfig oea;
  // Record distinct experts per MoE layer per step of decode tokens (with OEA on, the plain-routing baseline
  // costs a second routing call per layer).
  bool expert_stats = false;
  // Count the tokens routed to each expert per MoE layer over the run (--expert-distribution-out; every
  // step's ids come back to the host, so steps run without CUDA graphs).
  bool expert_distribution = false;
  // Steps with fewer sampling rows than this copy full rows. On an H200 (GLM-5 vocabulary 154880) a row cut
  // over several blocks by the summary kernel came back faster than the whole row even alone (batch-1 step
  // 1.303 ms against 1.524 ms), so every step with a summary-capable row takes summaries.
  int logits_summary_min_rows = 1;
  // Rows whose sampling params allow it come back from the executor as candidate summaries (top 128 tokens
  // and the row's sums) where the executor can make them (the CUDA executor: --gpu-sampling on), instead of
  // full rows; the Sampler decides from them exactly as from the full row, or asks for the full row.
  bool logits_summaries = true;
};

// Host-side time of one step that ran the model, seconds: waiting on the executor (the forward pass and
// the logits' copy back, fetches of undecided rows included), sampling, and the whole of step().
struct StepTimes {
  double executor_s = 0.0, sample_s = 0.0, total_s = 0.0;
  int32_t rows_full = 0;       // rows that came back in full
  int32_t rows_summary = 0;    // rows sampled from a summary
  int32_t rows_refetched = 0;  // rows whose summary could not decide (fetched in full)
  double other_s() const { return total_s - executor_s - sample_s; }
};

class Engine {
 public:
  // Runs steps on `executor`, whose KV pages the Engine's page allocator hands out.
  Engine(std::unique_ptr<Executor> executor, EngineConfig cfg);
  // On a CpuExecutor sized by cfg (make_cpu_executor).
  Engine(std::shared_ptr<model::Model> model, EngineConfig cfg);
  ~Engine();

  // Throws ms::Error naming the problem (empty prompt, id outside the vocabulary, too long for the context
  // or the pool, max_tokens < 1, a sampling parameter out of range: "temperature must be ...").
  uint64_t submit(Request r);
  std::vector<RequestOutput> step();
  bool cancel(uint64_t id);
  bool has_work() const { return !seqs_.empty(); }
  EngineStats stats() const;

  // Drops every prefix-cache entry no running request uses and returns the pages that became free.
  int32_t clear_prefix_cache();

  const model::Model& model() const { return exec_->model(); }
  const Executor& executor() const { return *exec_; }
  KvCapacity kv_capacity() const { return exec_->kv_capacity(); }
  const kv::PageAllocator& page_allocator() const { return alloc_; }
  // Null unless EngineConfig::expert_stats; thread-safe to read while another thread steps.
  const moe::ExpertStats* expert_stats() const { return expert_stats_.get(); }
  // Null unless EngineConfig::expert_distribution; thread-safe to read while another thread steps.
  const moe::ExpertDistribution* expert_distribution() const { return expert_distribution_.get(); }
  // Distinct experts per MoE layer per decode step, all MoE layers together (for /metrics); empty (no
  // bounds) when stats are off. Kind Oea holds observations only when OEA is on.
  moe::DistinctExpertsHistogram distinct_experts_histogram(moe::RoutingKind kind) const;
  const EngineConfig& config() const { return cfg_; }
  // The last step that ran the model.
  const StepTimes& last_step_times() const { return last_times_; }
  void set_op_sink(profiler::OpSink* sink) { sink_ = sink; }
  // Brackets every step that runs the model (e.g. a profiler::ProfileController); its sink, when it gives
  // one, replaces set_op_sink's for that step.
  void set_step_hook(profiler::StepHook* hook) { hook_ = hook; }

 private:
  void finish(uint64_t id, FinishReason why, std::vector<RequestOutput>& out, std::string error = {});
  RequestOutput output_of(const Sequence& s) const;
  // Samples step_rows_ from step_logits_ into step_tokens_ (fetching full rows a summary cannot decide);
  // throws ms::Error naming the row. Adds the time spent in the executor to `executor_s`.
  void sample_step(double& executor_s);

  std::unique_ptr<Executor> exec_;
  EngineConfig cfg_;
  // Declared in this order so that the scheduler drops its page references before the cache, and both
  // before the allocator goes.
  kv::PageAllocator alloc_;
  std::unique_ptr<kv::RadixCache> cache_;  // null when the prefix cache is off
  std::unique_ptr<scheduler::Scheduler> sched_;
  std::unique_ptr<Sampler> sampler_;
  std::map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  uint64_t next_id_ = 1;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0;
  profiler::OpSink* sink_ = nullptr;
  profiler::StepHook* hook_ = nullptr;
  std::unique_ptr<moe::ExpertStats> expert_stats_;
  std::unique_ptr<moe::ExpertDistribution> expert_distribution_;
  // Scratch of step(), [rows whose next token comes out of the step], reused across steps.
  std::vector<Sequence*> step_rows_;
  std::vector<const SamplingParams*> step_params_;
  std::vector<SamplerState*> step_states_;
  std::vector<GeneratedToken> step_tokens_;
  std::vector<uint8_t> step_summary_;    // [rows] LogitsRequest::summary
  std::vector<float> step_temperature_;  // [rows]
  StepLogits step_logits_;
  std::vector<int32_t> step_refetch_;  // rows whose summary could not decide
  std::vector<const SamplingParams*> full_params_;
  std::vector<SamplerState*> full_states_;
  std::vector<GeneratedToken> full_tokens_;
  StepTimes last_times_;
  // Busy-loop totals (EngineStats::step_seconds_total ...); last_step_end_ is set when a step leaves work.
  int64_t model_steps_total_ = 0;
  double step_seconds_total_ = 0, executor_seconds_total_ = 0, gap_seconds_total_ = 0;
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;
};

// A CpuExecutor for `model` sized by an engine config: its pages, and steps of up to max_running sequences
// and max_running + max_prefill_tokens tokens.
std::unique_ptr<Executor> make_cpu_executor(std::shared_ptr<const model::Model> model,
                                            const EngineConfig& cfg);
// An Engine on the CPU (what the commands build today).
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<model::Model> model, EngineConfig cfg);

}  // namespace ms::runtime
