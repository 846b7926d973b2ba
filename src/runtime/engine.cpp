#include "runtime/engine.h"

#include "runtime/engine_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "runtime/cpu_executor.h"
#include "scheduler/batch_plan.h"

namespace ms::runtime {

namespace {

FinishReason finish_of(scheduler::SeqFinish f) {
  switch (f) {
    case scheduler::SeqFinish::Stop:
      return FinishReason::Stop;
    case scheduler::SeqFinish::Length:
      return FinishReason::Length;
    case scheduler::SeqFinish::None:
      break;
  }
  return FinishReason::None;
}

}  // namespace

std::unique_ptr<Executor> make_cpu_executor(std::shared_ptr<const model::Model> model,
                                            const EngineConfig& cfg) {
  MS_CHECK(model, "engine: no model");
  const ExecutorConfig ec =
      executor_config_for(*model, cfg.page_size, cfg.kv_cache_tokens, cfg.kv_cache_dtype, cfg.max_running,
                          cfg.max_prefill_tokens, cfg.max_context);
  return std::make_unique<CpuExecutor>(std::move(model), ec);
}

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<model::Model> model, EngineConfig cfg) {
  return std::make_unique<Engine>(std::move(model), cfg);
}

Engine::Engine(std::shared_ptr<model::Model> model, EngineConfig cfg)
    : Engine(make_cpu_executor(std::move(model), cfg), cfg) {}

Engine::Engine(std::unique_ptr<Executor> executor, EngineConfig cfg)
    : exec_(std::move(executor)), cfg_(cfg), alloc_(exec_->kv_capacity().num_pages) {
  const KvCapacity kvc = exec_->kv_capacity();
  cfg_.page_size = kvc.page_size;
  cfg_.kv_cache_tokens = static_cast<int64_t>(kvc.num_pages) * kvc.page_size;
  cfg_.kv_cache_dtype = kvc.dtype;
  const model::Model* m = &exec_->model();
  MS_CHECK(cfg_.max_running > 0, "max running requests must be positive, got {}", cfg_.max_running);
  MS_CHECK(cfg_.max_prefill_tokens > 0, "max prefill tokens must be positive, got {}",
           cfg_.max_prefill_tokens);
  const int64_t model_ctx = m->config().max_position_embeddings;
  if (cfg_.max_context <= 0 || cfg_.max_context > model_ctx) cfg_.max_context = model_ctx;
  if (cfg_.enable_prefix_cache) cache_ = std::make_unique<kv::RadixCache>(alloc_, cfg_.page_size);
  scheduler::SchedulerConfig sc;
  sc.page_size = cfg_.page_size;
  sc.max_running_requests = cfg_.max_running;
  sc.max_prefill_tokens = cfg_.max_prefill_tokens;
  sc.max_context = cfg_.max_context;
  sched_ = std::make_unique<scheduler::Scheduler>(sc, alloc_, cache_.get());
  sampler_ = std::make_unique<Sampler>(static_cast<int>(m->config().vocab_size), cfg_.sampler);
  if (cfg_.oea.enabled) {
    const int k = m->router_config().top_k;
    MS_CHECK(cfg_.oea.k0 >= 1 && cfg_.oea.k0 <= k, "--oea-k0 {} must be in [1, {}] (the model's top-k)",
             cfg_.oea.k0, k);
    MS_CHECK(cfg_.oea.kmax == 0 || (cfg_.oea.kmax >= cfg_.oea.k0 && cfg_.oea.kmax <= k),
             "--oea-kmax {} must be in [--oea-k0 {}, {}]", cfg_.oea.kmax, cfg_.oea.k0, k);
    moe::validate(m->router_config(), cfg_.oea);
  }
  if (cfg_.expert_stats && m->config().n_routed_experts > 0)
    expert_stats_ =
        std::make_unique<moe::ExpertStats>(m->config().num_hidden_layers, m->config().n_routed_experts);
  if (cfg_.expert_distribution && m->config().n_routed_experts > 0) {
    std::vector<int> moe_layers;
    for (int l = 0; l < m->config().num_hidden_layers; ++l)
      if (m->config().layer_is_moe[static_cast<size_t>(l)]) moe_layers.push_back(l);
    expert_distribution_ =
        std::make_unique<moe::ExpertDistribution>(m->config().n_routed_experts, moe_layers);
  }
}

moe::DistinctExpertsHistogram Engine::distinct_experts_histogram(moe::RoutingKind kind) const {
  return expert_stats_ ? expert_stats_->histogram(kind) : moe::DistinctExpertsHistogram{};
}

Engine::~Engine() {
  sched_.reset();  // its page references and cache locks go before the cache and the pool
  cache_.reset();
}

uint64_t Engine::submit(Request r) {
  const auto& mc = model().config();
  const int64_t vocab = mc.vocab_size;
  if (r.prompt_ids.empty()) MS_THROW("the prompt is empty: give at least one token");
  for (size_t i = 0; i < r.prompt_ids.size(); ++i)
    if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= vocab)
      MS_THROW("prompt token id {} at position {} is outside the vocabulary [0, {})", r.prompt_ids[i], i,
               vocab);
  if (r.max_tokens < 1) MS_THROW("max_tokens must be at least 1, got {}", r.max_tokens);
  const int64_t total = static_cast<int64_t>(r.prompt_ids.size()) + r.max_tokens;
  if (total > cfg_.max_context)
    MS_THROW("the prompt ({} tokens) plus max_tokens ({}) is {} tokens, past the context limit of {}",
             r.prompt_ids.size(), r.max_tokens, total, cfg_.max_context);
  if ((total + cfg_.page_size - 1) / cfg_.page_size > alloc_.num_pages())
    MS_THROW("the prompt plus max_tokens ({} tokens) does not fit the KV cache of {} tokens", total,
             static_cast<int64_t>(alloc_.num_pages()) * cfg_.page_size);
  auto s = std::make_unique<Sequence>();
  s->sampler = sampler_->new_state(r.sampling, r.prompt_ids);  // validates the sampling params
  s->id = next_id_++;
  s->prompt_len = static_cast<int32_t>(r.prompt_ids.size());
  scheduler::SequenceParams p;
  p.prompt = r.prompt_ids;
  p.max_tokens = r.max_tokens;
  p.stop_token_ids = r.stop_token_ids;
  if (!r.ignore_eos)
    p.stop_token_ids.insert(p.stop_token_ids.end(), mc.eos_token_ids.begin(), mc.eos_token_ids.end());
  s->request = std::move(r);
  sched_->add(s->id, std::move(p));
  const uint64_t id = s->id;
  seqs_.emplace(id, std::move(s));
  return id;
}

bool Engine::cancel(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  it->second->cancelled = true;
  return true;
}

int32_t Engine::clear_prefix_cache() {
  if (!cache_) return 0;
  const int32_t before = alloc_.num_free();
  cache_->clear();
  return alloc_.num_free() - before;
}

RequestOutput Engine::output_of(const Sequence& s) const {
  RequestOutput o;
  o.request_id = s.id;
  o.prompt_tokens = s.prompt_len;
  o.cached_prompt_tokens = s.cached_prompt_tokens;
  o.completion_tokens = s.generated;
  return o;
}

// Ends a request the scheduler still holds (cancelled or failed): its pages go back at once.
void Engine::finish(uint64_t id, FinishReason why, std::vector<RequestOutput>& out, std::string error) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  RequestOutput o = output_of(*it->second);
  o.finish = why;
  o.error = std::move(error);
  out.push_back(std::move(o));
  sched_->abort(id);
  seqs_.erase(it);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

void Engine::sample_step(double& executor_s) {
  const size_t rows = step_rows_.size();
  const StepLogits& L = step_logits_;
  const size_t vocab = static_cast<size_t>(model().config().vocab_size);
  MS_CHECK(L.full_index.size() == rows, "the executor returned {} logits rows for {} sampling rows",
           L.full_index.size(), rows);
  // Compacted rows of a [n, vocab] block, in the block's order.
  auto sample_full = [&](const Tensor& block, std::span<const int32_t> row_of_block) {
    const size_t n = row_of_block.size();
    if (n == 0) return;
    full_params_.resize(n);
    full_states_.resize(n);
    full_tokens_.resize(n);
    for (size_t j = 0; j < n; ++j) {
      full_params_[j] = step_params_[row_of_block[j]];
      full_states_[j] = step_states_[row_of_block[j]];
    }
    sampler_->sample_batch(std::span<const float>(block.data<float>(), n * vocab), full_params_, full_states_,
                           full_tokens_);
    for (size_t j = 0; j < n; ++j) step_tokens_[row_of_block[j]] = std::move(full_tokens_[j]);
  };

  step_refetch_.clear();
  int32_t n_summary = 0;
  for (size_t i = 0; i < rows; ++i) {
    if (L.full_index[i] >= 0) continue;
    try {
      if (sampler_->sample_summary(L.summaries[i], *step_params_[i], *step_states_[i], step_tokens_[i])) {
        ++n_summary;
      } else {
        step_refetch_.push_back(static_cast<int32_t>(i));
      }
    } catch (const Error& e) {
      MS_THROW("sampling row {}: {}", i, e.message());
    }
  }
  // Full rows in the order of full_index (the block's order).
  std::vector<int32_t> full_rows(static_cast<size_t>(L.full_rows()), -1);
  for (size_t i = 0; i < rows; ++i)
    if (L.full_index[i] >= 0) full_rows.at(static_cast<size_t>(L.full_index[i])) = static_cast<int32_t>(i);
  sample_full(L.full, full_rows);
  if (!step_refetch_.empty()) {
    const auto t = Clock::now();
    const Tensor fetched = exec_->fetch_rows(step_refetch_);
    executor_s += seconds_since(t);
    sample_full(fetched, step_refetch_);
  }
  last_times_.rows_full = L.full_rows();
  last_times_.rows_summary = n_summary;
  last_times_.rows_refetched = static_cast<int32_t>(step_refetch_.size());
}

std::vector<RequestOutput> Engine::step() {
  const auto t_step = Clock::now();
  // A gap counts only after a step that left work: the loop was busy, not waiting for requests.
  const std::optional<Clock::time_point> prev_end = last_step_end_;
  last_step_end_.reset();
  double executor_s = 0.0;
  std::vector<RequestOutput> out;
  std::vector<uint64_t> cancelled;
  for (auto& [id, s] : seqs_)
    if (s->cancelled) cancelled.push_back(id);
  for (uint64_t id : cancelled) finish(id, FinishReason::Cancelled, out);
  if (seqs_.empty()) return out;

  const scheduler::BatchPlan plan = sched_->schedule();
  if (plan.empty()) return out;  // only after preempting every running prompt; the next step readmits
  // Any failure from here to the forward pass's end (a bad batch, out of memory in a scratch buffer, a device
  // error) fails the planned requests and clears the plan, so the next step starts clean.
  auto fail_plan = [&](const std::string& why) {
    MS_LOG_ERROR("engine step failed: {}", why);
    for (const auto& p : plan.seqs) finish(p.seq_id, FinishReason::Error, out, why);
    sched_->commit({});  // every planned sequence is gone: this only clears the plan
  };
  // The hook sees the whole step, token choice included; ok stays false if the step throws.
  struct HookBracket {
    profiler::StepHook* hook = nullptr;
    bool ok = false;
    ~HookBracket() {
      if (hook) hook->step_end(ok);
    }
  } bracket;
  try {
    const kv::ForwardBatch batch = scheduler::flatten(plan, cfg_.page_size);
    step_rows_.clear();
    model::StepRouting routing;
    routing.oea = cfg_.oea;
    routing.expert_stats = expert_stats_.get();
    routing.expert_distribution = expert_distribution_.get();
    for (const auto& p : plan.seqs) {
      Sequence& s = *seqs_.at(p.seq_id);
      if (!s.admitted) {
        s.admitted = true;
        s.cached_prompt_tokens = std::min(p.cached_prefix_tokens, s.prompt_len);
        s.prompt_done = s.cached_prompt_tokens;
      }
      // Decode tokens (OEA applies) are generated tokens fed back one at a time; prompt chunks and the
      // recompute of a preempted sequence route plainly.
      const bool decode = !p.prefill && p.token_begin >= s.prompt_len;
      routing.decode_tokens.insert(routing.decode_tokens.end(),
                                   static_cast<size_t>(p.token_end - p.token_begin), decode ? 1 : 0);
      if (p.sample) step_rows_.push_back(&s);
    }
    profiler::OpSink* sink = sink_;
    if (hook_) {
      const int32_t n = batch.n_tokens(), seqs = batch.n_seqs();
      const std::string label =
          fmt::format("{} tokens={} seqs={} ctx={}", plan.num_prefill_tokens == 0 ? "decode" : "prefill", n,
                      seqs, *std::max_element(batch.seq_lens.begin(), batch.seq_lens.end()));
      bracket.hook = hook_;
      if (profiler::OpSink* s = hook_->step_begin(label)) sink = s;
    }
    // How each sampling row may come back (logit row i is step_rows_[i]).
    const size_t rows = step_rows_.size();
    MS_CHECK(batch.logit_rows.size() == rows, "the batch has {} logit rows for {} sampling sequences",
             batch.logit_rows.size(), rows);
    step_summary_.assign(rows, 0);
    step_temperature_.assign(rows, 1.0f);
    if (cfg_.logits_summaries && exec_->supports_summaries() &&
        rows >= static_cast<size_t>(std::max(cfg_.logits_summary_min_rows, 1))) {
      for (size_t i = 0; i < rows; ++i) {
        const SamplingParams& sp = step_rows_[i]->request.sampling;
        if (sampler_->summary_may_decide(sp)) {
          step_summary_[i] = 1;
          step_temperature_[i] = sp.temperature;
        }
      }
    }
    const auto t_exec = Clock::now();
    exec_->run_rows(batch, LogitsRequest{step_summary_, step_temperature_}, step_logits_, routing, sink);
    executor_s += seconds_since(t_exec);
  } catch (const Error& e) {
    fail_plan(e.message());
    return out;
  } catch (const std::exception& e) {
    fail_plan(e.what());
    return out;
  } catch (...) {
    fail_plan("unknown error");
    return out;
  }
  for (const auto& p : plan.seqs) {
    Sequence& s = *seqs_.at(p.seq_id);
    const int32_t end = std::min(p.token_end, s.prompt_len);
    if (end > s.prompt_done) {
      prompt_tokens_total_ += end - std::max(p.token_begin, s.prompt_done);
      s.prompt_done = end;
    }
  }

  const size_t rows = step_rows_.size();
  step_params_.resize(rows);
  step_states_.resize(rows);
  step_tokens_.resize(rows);
  std::unordered_map<uint64_t, size_t> row_of;
  for (size_t i = 0; i < rows; ++i) {
    step_params_[i] = &step_rows_[i]->request.sampling;
    step_states_[i] = &step_rows_[i]->sampler;
    row_of[step_rows_[i]->id] = i;
  }
  std::vector<scheduler::SampledToken> sampled;
  const auto t_sample = Clock::now();
  const double executor_before = executor_s;
  try {
    if (rows > 0) sample_step(executor_s);
    for (size_t i = 0; i < rows; ++i) sampled.push_back({step_rows_[i]->id, step_tokens_[i].token});
  } catch (...) {
    std::string why = "unknown error";
    try {
      throw;
    } catch (const Error& e) {
      why = e.message();
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
    }
    MS_LOG_ERROR("engine sampling failed: {}", why);
    std::vector<uint64_t> ids;
    for (Sequence* s : step_rows_) ids.push_back(s->id);
    for (uint64_t id : ids) finish(id, FinishReason::Error, out, why);
    sampled.clear();  // the rows that sampled are gone; prefill chunks without a sample still commit
  }
  last_times_.sample_s = seconds_since(t_sample) - (executor_s - executor_before);

  for (const scheduler::SequenceUpdate& u : sched_->commit(sampled)) {
    Sequence& s = *seqs_.at(u.seq_id);
    ++s.generated;
    ++generation_tokens_total_;
    RequestOutput o = output_of(s);
    o.tokens.push_back(step_tokens_[row_of.at(u.seq_id)]);
    o.finish = finish_of(u.finish);
    out.push_back(std::move(o));
    if (u.finish != scheduler::SeqFinish::None) seqs_.erase(u.seq_id);  // the scheduler freed its pages
  }
  last_times_.executor_s = executor_s;
  last_times_.total_s = seconds_since(t_step);
  ++model_steps_total_;
  step_seconds_total_ += last_times_.total_s;
  executor_seconds_total_ += executor_s;
  if (prev_end) gap_seconds_total_ += std::chrono::duration<double>(t_step - *prev_end).count();
  if (has_work()) last_step_end_ = Clock::now();
  bracket.ok = true;
  return out;
}

EngineStats Engine::stats() const {
  EngineStats e =
      engine_stats_from(sched_->stats(), prompt_tokens_total_, generation_tokens_total_, cfg_.max_context);
  e.model_steps_total = model_steps_total_;
  e.step_seconds_total = step_seconds_total_;
  e.executor_seconds_total = executor_seconds_total_;
  e.gap_seconds_total = gap_seconds_total_;
  return e;
}

}  // namespace ms::runtime
