// The Engine: requests in, tokens out. submit() validates and queues a request; step() schedules one batch
// (prefill chunks and decodes mixed), runs the model once, picks each sequence's next token and reports what
// happened to every request it touched; cancel() ends a request at the next step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "kv/kv_pool.h"
#include "model/model.h"
#include "profiler/op_record.h"
#include "profiler/step_hook.h"
#include "runtime/engine_types.h"
#include "runtime/fcfs_scheduler.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"

namespace ms::runtime {

struct EngineConfig {
  int32_t page_size = 64;
  int64_t kv_cache_tokens = 32768;  // pool capacity, in tokens over all sequences
  kv::KvCacheDType kv_cache_dtype = kv::KvCacheDType::Auto;
  int max_running = 8;
  int32_t max_batch_tokens = 2048;
  int64_t max_context = 0;  // 0: the model's max_position_embeddings
  SamplerOptions sampler;   // top_logprobs limit; the seed of requests that bring none
};

class Engine {
 public:
  Engine(std::shared_ptr<model::Model> model, EngineConfig cfg);

  // Throws ms::Error naming the problem (empty prompt, id outside the vocabulary, too long for the context
  // or the pool, max_tokens < 1, a sampling parameter out of range: "temperature must be ...").
  uint64_t submit(Request r);
  std::vector<RequestOutput> step();
  bool cancel(uint64_t id);
  bool has_work() const { return !seqs_.empty(); }
  EngineStats stats() const;

  const model::Model& model() const { return *model_; }
  const kv::KvPool& kv_pool() const { return pool_; }
  void set_op_sink(profiler::OpSink* sink) { sink_ = sink; }
  // Brackets every step that runs the model (e.g. a profiler::ProfileController); its sink, when it gives
  // one, replaces set_op_sink's for that step.
  void set_step_hook(profiler::StepHook* hook) { hook_ = hook; }

 private:
  void finish(Sequence& s, FinishReason why, std::vector<RequestOutput>& out, std::string error = {});
  RequestOutput output_of(const Sequence& s) const;

  std::shared_ptr<model::Model> model_;
  EngineConfig cfg_;
  kv::KvPool pool_;
  FcfsScheduler sched_;
  std::unique_ptr<Sampler> sampler_;
  std::map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  uint64_t next_id_ = 1;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0;
  profiler::OpSink* sink_ = nullptr;
  profiler::StepHook* hook_ = nullptr;
  // Scratch of step(), [rows whose next token comes out of the step], reused across steps.
  std::vector<const SamplingParams*> step_params_;
  std::vector<SamplerState*> step_states_;
  std::vector<GeneratedToken> step_tokens_;
};

}  // namespace ms::runtime
