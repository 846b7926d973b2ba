#include "runtime/engine.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace ms::runtime {

namespace {

kv::KvPoolConfig pool_config(const model::Model& m, const EngineConfig& c) {
  MS_CHECK(c.page_size > 0, "--page-size must be positive, got {}", c.page_size);
  MS_CHECK(c.kv_cache_tokens >= c.page_size, "KV cache of {} tokens holds less than one page of {}",
           c.kv_cache_tokens, c.page_size);
  const auto pages = static_cast<int32_t>(c.kv_cache_tokens / c.page_size);
  return m.kv_pool_config(pages, c.page_size, c.kv_cache_dtype);
}

}  // namespace

Engine::Engine(std::shared_ptr<model::Model> model, EngineConfig cfg)
    : model_(std::move(model)),
      cfg_(cfg),
      pool_(pool_config(*model_, cfg)),
      sched_(SchedulerLimits{cfg.max_running, cfg.max_batch_tokens, cfg.page_size}),
      sampler_(std::make_unique<Sampler>(static_cast<int>(model_->config().vocab_size), cfg.sampler)) {
  MS_CHECK(cfg_.max_running > 0 && cfg_.max_batch_tokens > 0,
           "max running requests ({}) and batch tokens ({}) must be positive", cfg_.max_running,
           cfg_.max_batch_tokens);
  const int64_t model_ctx = model_->config().max_position_embeddings;
  if (cfg_.max_context <= 0 || cfg_.max_context > model_ctx) cfg_.max_context = model_ctx;
}

uint64_t Engine::submit(Request r) {
  const int64_t vocab = model_->config().vocab_size;
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
  if (pool_.pages_for(total) > pool_.allocator().num_pages())
    MS_THROW("the prompt plus max_tokens ({} tokens) does not fit the KV cache of {} tokens", total,
             static_cast<int64_t>(pool_.allocator().num_pages()) * pool_.page_size());
  auto s = std::make_unique<Sequence>();
  s->sampler = sampler_->new_state(r.sampling, r.prompt_ids);  // validates the sampling params
  s->id = next_id_++;
  s->tokens = r.prompt_ids;
  s->prompt_len = static_cast<int32_t>(r.prompt_ids.size());
  s->request = std::move(r);
  sched_.add(s.get());
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

RequestOutput Engine::output_of(const Sequence& s) const {
  RequestOutput o;
  o.request_id = s.id;
  o.prompt_tokens = s.prompt_len;
  o.completion_tokens = s.generated;
  return o;
}

void Engine::finish(Sequence& s, FinishReason why, std::vector<RequestOutput>& out, std::string error) {
  auto it =
      std::find_if(out.begin(), out.end(), [&](const RequestOutput& o) { return o.request_id == s.id; });
  if (it == out.end()) {
    out.push_back(output_of(s));
    it = out.end() - 1;
  }
  it->finish = why;
  it->error = std::move(error);
  sched_.remove(&s);
  pool_.allocator().release_all(s.pages);
  seqs_.erase(s.id);
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestOutput> out;
  std::vector<Sequence*> cancelled;
  for (auto& [id, s] : seqs_)
    if (s->cancelled) cancelled.push_back(s.get());
  for (Sequence* s : cancelled) finish(*s, FinishReason::Cancelled, out);

  std::vector<ScheduledSeq> plan = sched_.schedule(pool_.allocator());
  if (plan.empty()) return out;
  kv::ForwardBatchBuilder bb(pool_.page_size());
  std::vector<Sequence*> wants;  // sequences whose next token comes out of this step, in logit-row order
  for (const ScheduledSeq& p : plan) {
    Sequence* s = p.seq;
    const bool last = s->computed + p.n_tokens == static_cast<int32_t>(s->tokens.size());
    bb.add_sequence(s->pages, s->computed, s->tokens.data() + s->computed, p.n_tokens, last);
    if (last) wants.push_back(s);
  }
  kv::ForwardBatch batch = bb.finish();
  // The hook sees the whole step, token choice included; ok stays false if the step throws.
  struct HookBracket {
    profiler::StepHook* hook;
    bool ok = false;
    ~HookBracket() {
      if (hook) hook->step_end(ok);
    }
  } bracket{hook_};
  profiler::OpSink* sink = sink_;
  if (hook_) {
    const int32_t n = batch.n_tokens(), seqs = batch.n_seqs();
    const std::string label =
        fmt::format("{} tokens={} seqs={} ctx={}", n == seqs ? "decode" : "prefill", n, seqs,
                    *std::max_element(batch.seq_lens.begin(), batch.seq_lens.end()));
    if (profiler::OpSink* s = hook_->step_begin(label)) sink = s;
  }
  Tensor logits;
  try {
    logits = model_->forward(batch, pool_, sink);
  } catch (const Error& e) {
    MS_LOG_ERROR("engine step failed: {}", e.what());
    for (const ScheduledSeq& p : plan) finish(*p.seq, FinishReason::Error, out, e.message());
    return out;
  }
  for (const ScheduledSeq& p : plan) {
    p.seq->computed += p.n_tokens;
    if (p.seq->generated == 0) prompt_tokens_total_ += p.n_tokens;
  }
  const auto& cfg = model_->config();
  const size_t rows = wants.size();
  step_params_.resize(rows);
  step_states_.resize(rows);
  step_tokens_.resize(rows);
  for (size_t i = 0; i < rows; ++i) {
    step_params_[i] = &wants[i]->request.sampling;
    step_states_[i] = &wants[i]->sampler;
  }
  try {
    sampler_->sample_batch(
        std::span<const float>(logits.data<float>(), rows * static_cast<size_t>(cfg.vocab_size)),
        step_params_, step_states_, step_tokens_);
  } catch (const Error& e) {
    MS_LOG_ERROR("engine sampling failed: {}", e.what());
    for (Sequence* s : wants) finish(*s, FinishReason::Error, out, e.message());
    return out;
  }
  for (size_t i = 0; i < rows; ++i) {
    Sequence& s = *wants[i];
    const GeneratedToken& g = step_tokens_[i];
    s.tokens.push_back(g.token);
    ++s.generated;
    ++generation_tokens_total_;
    RequestOutput o = output_of(s);
    o.tokens.push_back(g);
    out.push_back(std::move(o));
    const Request& r = s.request;
    const bool eos = !r.ignore_eos && std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(),
                                                g.token) != cfg.eos_token_ids.end();
    const bool stop =
        std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), g.token) != r.stop_token_ids.end();
    if (eos || stop)
      finish(s, FinishReason::Stop, out);
    else if (s.generated >= r.max_tokens || static_cast<int64_t>(s.tokens.size()) >= cfg_.max_context)
      finish(s, FinishReason::Length, out);
  }
  bracket.ok = true;
  return out;
}

EngineStats Engine::stats() const {
  EngineStats st;
  st.running = sched_.running();
  st.waiting = sched_.waiting();
  st.kv_pages_total = pool_.allocator().num_pages();
  st.kv_pages_used = pool_.allocator().num_used();
  st.prompt_tokens_total = prompt_tokens_total_;
  st.generation_tokens_total = generation_tokens_total_;
  st.max_context = cfg_.max_context;
  return st;
}

}  // namespace ms::runtime
