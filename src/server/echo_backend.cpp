#include "server/echo_backend.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
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

std::vector<std::pair<std::string, std::string>> load_echo_script(const std::string& path) {
  std::ifstream f(path);
  MS_CHECK(f.good(), "--script {}: cannot open", path);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(f);
  } catch (const std::exception& e) {
    MS_THROW("--script {}: not JSON: {}", path, e.what());
  }
  MS_CHECK(j.is_object(), "--script {}: expected an object of trigger -> reply", path);
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    MS_CHECK(it.value().is_string() && !it.key().empty(), "--script {}: '{}' must map to a string reply",
             path, it.key());
    out.emplace_back(it.key(), it.value().get<std::string>());
  }
  return out;
}

std::string EchoBackend::render_chat(const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& tools,
                                     const nlohmann::ordered_json& template_kwargs) const {
  MS_CHECK(messages.is_array(), "messages: expected an array");
  if (config_.chat_template) {
    tokenizer::ChatInputs in;
    in.messages = messages;
    if (tools.is_array()) in.tools = tools;
    if (template_kwargs.is_object()) in.extra = template_kwargs;
    return config_.chat_template->render(in);
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& c = messages[i].value("content", nlohmann::ordered_json());
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
  Live live{request, std::nullopt};
  if (!config_.script.empty()) {
    const std::string text = decode(request.prompt_ids);
    size_t best_end = 0;
    for (const auto& [trigger, reply] : config_.script) {
      const size_t at = text.rfind(trigger);
      if (at == std::string::npos || at + trigger.size() <= best_end) continue;
      best_end = at + trigger.size();
      live.reply = encode(reply, false);
    }
  }
  live_[id] = std::move(live);
}

void EchoBackend::cancel(uint64_t id) {
  scheduler_->abort(id);
  live_.erase(id);
}

std::vector<runtime::RequestOutput> EchoBackend::step() {
  if (config_.step_time.count() > 0) std::this_thread::sleep_for(config_.step_time);
  if (++steps_ == config_.fail_at_step) throw std::runtime_error("injected step failure");
  auto plan = scheduler_->schedule();
  std::vector<scheduler::SampledToken> sampled;
  for (const auto& e : plan.seqs) {
    if (!e.sample) continue;
    const Live& live = live_.at(e.seq_id);
    const auto& prompt = live.request.prompt_ids;
    const auto* seq = scheduler_->find(e.seq_id);
    const size_t i = static_cast<size_t>(seq->num_generated());
    if (live.reply) {
      sampled.push_back({e.seq_id, i < live.reply->size() ? (*live.reply)[i] : kEos});
    } else {
      sampled.push_back({e.seq_id, prompt[i % prompt.size()]});
    }
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
