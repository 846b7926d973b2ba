#include "server/echo_backend.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/error.h"
#include "runtime/engine_stats.h"

namespace ms::server {

EchoBackend::EchoBackend(EchoBackendConfig config) : config_(std::move(config)) {
  allocator_ = std::make_unique<kv::PageAllocator>(config_.num_pages);
  cache_ = std::make_unique<kv::RadixCache>(*allocator_, config_.page_size);
  scheduler::SchedulerConfig sc;
  sc.page_size = config_.page_size;
  sc.max_running_requests = config_.max_running_requests;
  sc.max_prefill_tokens = config_.max_prefill_tokens;
  sc.max_context = config_.max_context;
  scheduler_ = std::make_unique<scheduler::Scheduler>(sc, *allocator_, cache_.get());
}

EchoBackend::~EchoBackend() {
  scheduler_.reset();  // drops its references before the cache and the allocator go
  cache_.reset();
}

std::vector<int32_t> EchoBackend::encode(const std::string& text, bool /*add_special_tokens*/) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string EchoBackend::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids)
    if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
  return s;
}

std::string EchoBackend::render_chat(const nlohmann::json& messages, const nlohmann::json& tools,
                                     const nlohmann::json& template_kwargs) const {
  MS_CHECK(messages.is_array(), "messages: expected an array");
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& c = messages[i].value("content", nlohmann::json());
    if (i) out += "\n";
    if (c.is_string()) {
      out += c.get<std::string>();
    } else if (c.is_array()) {
      for (const auto& part : c)
        if (part.is_object() && part.value("type", "") == "text") out += part.value("text", "");
    }
  }
  return out;
}

void EchoBackend::submit(uint64_t id, const runtime::Request& request) {
  scheduler::SequenceParams p;
  p.prompt = request.prompt_ids;
  p.max_tokens = request.max_tokens;
  p.stop_token_ids = request.stop_token_ids;
  if (!request.ignore_eos) p.stop_token_ids.push_back(kEos);
  scheduler_->add(id, std::move(p));
  live_[id] = {request};
}

void EchoBackend::cancel(uint64_t id) {
  scheduler_->abort(id);
  live_.erase(id);
}

std::vector<runtime::RequestOutput> EchoBackend::step() {
  if (config_.step_time.count() > 0) std::this_thread::sleep_for(config_.step_time);
  auto plan = scheduler_->schedule();
  std::vector<scheduler::SampledToken> sampled;
  for (const auto& e : plan.seqs) {
    if (!e.sample) continue;
    const auto& prompt = live_.at(e.seq_id).request.prompt_ids;
    const auto* seq = scheduler_->find(e.seq_id);
    const size_t i = static_cast<size_t>(seq->num_generated());
    sampled.push_back({e.seq_id, prompt[i % prompt.size()]});
    if (e.prefill) prompt_tokens_total_ += static_cast<int64_t>(e.token_end - e.cached_prefix_tokens);
  }
  std::vector<runtime::RequestOutput> outs;
  for (const auto& u : scheduler_->commit(sampled)) {
    const auto& req = live_.at(u.seq_id).request;
    runtime::RequestOutput o;
    o.request_id = u.seq_id;
    runtime::GeneratedToken g;
    g.token = u.token;
    // Deterministic numbers: the chosen token is the most likely; the runner-ups are the next ids.
    g.logprob = -0.25f;
    for (int k = 0; k < req.sampling.top_logprobs; ++k)
      g.top_logprobs.push_back({(u.token + k) % 256, k == 0 ? -0.25f : -1.0f - static_cast<float>(k)});
    o.tokens.push_back(g);
    o.finish = u.finish == scheduler::SeqFinish::Stop     ? runtime::FinishReason::Stop
               : u.finish == scheduler::SeqFinish::Length ? runtime::FinishReason::Length
                                                          : runtime::FinishReason::None;
    o.prompt_tokens = u.num_prompt;
    o.cached_prompt_tokens = u.cached_prefix_tokens;
    o.completion_tokens = u.num_generated;
    ++generation_tokens_total_;
    if (o.finish != runtime::FinishReason::None) live_.erase(u.seq_id);
    outs.push_back(std::move(o));
  }
  return outs;
}

runtime::EngineStats EchoBackend::stats() const {
  return runtime::engine_stats_from(scheduler_->stats(), prompt_tokens_total_, generation_tokens_total_,
                                    config_.max_context);
}

}  // namespace ms::server
