#include "server/completion_job.h"

#include <fmt/format.h>

#include <atomic>
#include <cctype>

namespace ms::server {
namespace {

using nlohmann::json;

std::string new_id(bool chat) {
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  return fmt::format("{}-{:x}{:04x}", chat ? "chatcmpl" : "cmpl", static_cast<uint64_t>(now),
                     ++counter & 0xffff);
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// "max_tokens: ..." -> "max_tokens", for errors the engine raised about a field.
std::string leading_field(const std::string& message) {
  const size_t colon = message.find(':');
  if (colon == std::string::npos || colon == 0) return "";
  for (size_t i = 0; i < colon; ++i) {
    const char ch = message[i];
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.') return "";
  }
  return message.substr(0, colon);
}

}  // namespace

CompletionJob::CompletionJob(EngineLoop& loop, Metrics& metrics, CompletionParams params,
                             std::vector<std::vector<int32_t>> prompts, std::string model,
                             std::optional<ReasoningFormat> reasoning,
                             std::optional<ToolCallFormat> tool_calls)
    : loop_(loop),
      metrics_(metrics),
      params_(std::move(params)),
      prompts_(std::move(prompts)),
      model_(std::move(model)),
      id_(new_id(params_.chat)),
      reasoning_format_(params_.chat ? reasoning : std::nullopt),
      tool_call_format_(params_.chat && params_.tool_choice.mode != ToolChoice::Mode::None ? tool_calls
                                                                                           : std::nullopt),
      start_(Clock::now()),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

CompletionJob::~CompletionJob() {
  cancel();
}

void CompletionJob::cancel() {
  cancelled_here_ = true;
  for (auto& c : choices_) {
    if (c.stream && !c.done) {
      loop_.cancel(c.stream->id());
      c.done = true;
      c.finish = runtime::FinishReason::Cancelled;
    }
  }
  finish_metrics();
}

void CompletionJob::start() {
  Backend& backend = loop_.backend();
  for (size_t pi = 0; pi < prompts_.size(); ++pi)
    for (int i = 0; i < params_.n; ++i) {
      runtime::Request r;
      r.prompt_ids = prompts_[pi];
      r.sampling = params_.sampling;
      if (r.sampling.seed)
        r.sampling.seed = *r.sampling.seed + static_cast<uint64_t>(i);  // n different samples
      r.max_tokens = *params_.max_tokens;
      r.stop_token_ids = params_.stop_token_ids;
      r.ignore_eos = params_.ignore_eos;
      Choice c;
      c.prompt = pi;
      if (tool_call_format_) {
        // Tool-call tags are special tokens in some vocabularies (GLM's): keep them in the text.
        c.text = std::make_unique<TextStream>(
            [&backend](const std::vector<int32_t>& ids) { return backend.decode_with_special(ids); },
            params_.stop);
        c.tools = std::make_unique<ToolCallParser>(*tool_call_format_, params_.tools);
      } else {
        c.text = std::make_unique<TextStream>(
            [&backend](const std::vector<int32_t>& ids) { return backend.decode(ids); }, params_.stop);
      }
      if (reasoning_format_)
        c.reasoning = std::make_unique<ReasoningParser>(*reasoning_format_, params_.thinking);
      if (params_.chat) {
        c.logprobs = json::array();
      } else {
        c.logprobs = {{"tokens", json::array()},
                      {"token_logprobs", json::array()},
                      {"top_logprobs", json::array()},
                      {"text_offset", json::array()}};
      }
      c.stream = loop_.submit(std::move(r));
      choices_.push_back(std::move(c));
    }
}

void CompletionJob::logprob_entry(Choice& c, const runtime::GeneratedToken& g, json& out) {
  Backend& backend = loop_.backend();
  const std::string tok = backend.decode({g.token});
  if (params_.chat) {
    json top = json::array();
    for (const auto& t : g.top_logprobs) {
      const std::string s = backend.decode({t.token});
      top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}});
    }
    out.push_back({{"token", tok}, {"logprob", g.logprob}, {"bytes", bytes_of(tok)}, {"top_logprobs", top}});
  } else {
    json top = json::object();
    for (const auto& t : g.top_logprobs) top[backend.decode({t.token})] = t.logprob;
    out["tokens"].push_back(tok);
    out["token_logprobs"].push_back(g.logprob);
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(c.text_offset);
    c.text_offset += static_cast<int>(tok.size());
  }
}

void CompletionJob::consume(size_t index, runtime::RequestOutput& o, Delta& d) {
  Choice& c = choices_[index];
  if (c.done) return;
  std::string piece;
  if (params_.logprobs && d.logprobs.is_null()) {
    d.logprobs = params_.chat ? json::array()
                              : json{{"tokens", json::array()},
                                     {"token_logprobs", json::array()},
                                     {"top_logprobs", json::array()},
                                     {"text_offset", json::array()}};
  }
  const auto now = Clock::now();
  for (size_t k = 0; k < o.tokens.size() && !c.done; ++k) {
    const auto& g = o.tokens[k];
    ++c.completion_tokens;
    metrics_.generation_tokens++;
    if (!first_token_seen_) {
      first_token_seen_ = true;
      metrics_.ttft.observe(std::chrono::duration<double>(now - start_).count());
    } else if (c.completion_tokens > 1) {
      metrics_.itl.observe(std::chrono::duration<double>(now - c.last_token).count());
    }
    c.last_token = now;
    if (params_.logprobs) {
      logprob_entry(c, g, d.logprobs);
      logprob_entry(c, g, c.logprobs);
    }
    // A stop token id ends the text without appearing in it.
    const bool stop_token = o.finish == runtime::FinishReason::Stop && k + 1 == o.tokens.size();
    if (!stop_token) piece += c.text->add(g.token);
    if (c.text->stopped()) {
      loop_.cancel(c.stream->id());
      c.done = true;
      c.finish = runtime::FinishReason::Stop;
    }
  }
  c.cached_tokens = o.cached_prompt_tokens;
  if (!c.done && o.finish != runtime::FinishReason::None) {
    piece += c.text->finish();
    c.done = true;
    c.finish = o.finish;
    c.error = o.error;
    c.refused = o.refused;
  }
  std::string content;
  if (c.reasoning) {
    auto r = c.reasoning->feed(piece);
    if (c.done) {
      auto rest = c.reasoning->finish();
      r.reasoning += rest.reasoning;
      r.content += rest.content;
    }
    d.reasoning += r.reasoning;
    content = std::move(r.content);
  } else {
    content = std::move(piece);
  }
  if (c.tools) {
    auto t = c.tools->feed(content);
    if (c.done) {
      auto rest = c.tools->finish();
      t.content += rest.content;
      for (auto& p : rest.calls) t.calls.push_back(std::move(p));
    }
    d.content += t.content;
    for (const auto& p : t.calls) {
      json e = {{"index", p.index}};
      if (!p.id.empty()) {
        e["id"] = p.id;
        e["type"] = "function";
        e["function"] = {{"name", p.name}, {"arguments", p.arguments}};
      } else {
        e["function"] = {{"arguments", p.arguments}};
      }
      d.tool_calls.push_back(std::move(e));
    }
    if (c.done) check_tool_choice(c);
  } else {
    d.content += content;
  }
}

// tool_choice "required" or a named function: an answer without that call is refused (no sampler here
// can force it).
void CompletionJob::check_tool_choice(Choice& c) const {
  if (c.finish == runtime::FinishReason::Error || c.finish == runtime::FinishReason::Cancelled) return;
  const ToolChoice& tc = params_.tool_choice;
  const auto& calls = c.tools->calls();
  std::string problem;
  if (tc.mode == ToolChoice::Mode::Required && calls.empty()) {
    problem = "tool_choice is 'required' but the model answered without a tool call";
  } else if (tc.mode == ToolChoice::Mode::Named) {
    if (calls.empty()) problem = fmt::format("tool_choice names '{}' but the model called no tool", tc.name);
    for (const auto& call : calls)
      if (call.name != tc.name)
        problem = fmt::format("tool_choice names '{}' but the model called '{}'", tc.name, call.name);
  }
  if (problem.empty()) return;
  c.finish = runtime::FinishReason::Error;
  c.error = problem;
  c.error_code = "tool_choice_unsatisfied";
  c.refused = false;
}

std::string CompletionJob::finish_name(const Choice& c) const {
  if (c.tools && !c.tools->calls().empty() && c.finish == runtime::FinishReason::Stop) return "tool_calls";
  return runtime::finish_reason_name(c.finish);
}

json CompletionJob::usage() const {
  // Each prompt counts once, however many choices it has (as OpenAI counts); its cached tokens are those of
  // its first choice.
  int completion = 0, prompt = 0, cached = 0;
  for (const auto& c : choices_) completion += c.completion_tokens;
  for (const auto& ids : prompts_) prompt += static_cast<int>(ids.size());
  for (size_t i = 0; i < choices_.size(); i += static_cast<size_t>(params_.n))
    cached += choices_[i].cached_tokens;
  json u = {
      {"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  if (!choices_.empty()) u["prompt_tokens_details"] = {{"cached_tokens", cached}};
  return u;
}

json CompletionJob::chunk(json choices) const {
  return {{"id", id_},
          {"object", params_.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", std::move(choices)}};
}

void CompletionJob::finish_metrics() {
  bool all_done = true;
  for (const auto& c : choices_) all_done &= c.done;
  if (metrics_done_ || !all_done || choices_.empty()) return;
  metrics_done_ = true;
  for (const auto& ids : prompts_) metrics_.prompt_tokens += static_cast<int64_t>(ids.size());
  bool failed = false, cancelled = false;
  for (const auto& c : choices_) {
    failed |= c.finish == runtime::FinishReason::Error;
    cancelled |= c.finish == runtime::FinishReason::Cancelled;
  }
  if (failed) {
    metrics_.requests_failed++;
  } else if (cancelled) {
    metrics_.requests_cancelled++;
  } else {
    metrics_.requests_ok++;
    metrics_.e2e.observe(std::chrono::duration<double>(Clock::now() - start_).count());
  }
}

bool CompletionJob::poll(std::vector<json>& chunks, std::chrono::milliseconds timeout) {
  // One chunk per engine output (one step), so clients see tokens when they were made.
  auto make = [&](size_t i, const Delta* d) {
    Choice& c = choices_[i];
    json ch = {{"index", i}};
    bool has = false;
    if (params_.chat) {
      json delta = json::object();
      if (d && !d->content.empty()) delta["content"] = d->content, has = true;
      if (d && !d->reasoning.empty()) delta["reasoning_content"] = d->reasoning, has = true;
      if (d && !d->tool_calls.empty()) delta["tool_calls"] = d->tool_calls, has = true;
      ch["delta"] = delta;
    } else {
      ch["text"] = d ? d->content : std::string();
      has = d && !d->content.empty();
    }
    const bool lp = d && params_.logprobs && !d->logprobs.is_null() &&
                    (params_.chat ? !d->logprobs.empty() : !d->logprobs["tokens"].empty());
    if (lp) {
      ch["logprobs"] = params_.chat ? json{{"content", d->logprobs}} : d->logprobs;
      has = true;
    } else {
      ch["logprobs"] = nullptr;
    }
    ch["finish_reason"] = nullptr;
    if (c.done && !c.finished_chunk && c.finish != runtime::FinishReason::Cancelled &&
        c.finish != runtime::FinishReason::Error) {
      c.finished_chunk = true;
      ch["finish_reason"] = finish_name(c);
      has = true;
    }
    if (has) chunks.push_back(chunk(json::array({ch})));
  };
  bool waited = false;
  bool all_done = true;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (params_.chat && !c.sent_role) {
      c.sent_role = true;
      chunks.push_back(chunk(json::array({{{"index", i},
                                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                                           {"logprobs", nullptr},
                                           {"finish_reason", nullptr}}})));
    }
    if (!c.done) {
      std::vector<runtime::RequestOutput> outs;
      c.stream->pop(outs, waited ? std::chrono::milliseconds(0) : timeout);
      waited = true;
      for (auto& o : outs) {
        if (c.done) break;
        Delta d;
        consume(i, o, d);
        make(i, &d);
      }
    }
    if (c.finish == runtime::FinishReason::Error && !c.finished_chunk) {
      c.finished_chunk = true;
      const ApiError e = c.refused ? ApiError(400, c.error, leading_field(c.error))
                                   : ApiError(500, c.error, "", c.error_code);
      chunks.push_back({{"error", e.to_json()["error"]}});
    }
    if (c.finish == runtime::FinishReason::Cancelled && !c.finished_chunk && !cancelled_here_) {
      c.finished_chunk = true;  // the server cancelled it (shutting down): say so rather than end silently
      chunks.push_back({{"error", ApiError(503, "request cancelled: the server is shutting down", "",
                                           "service_unavailable")
                                      .to_json()["error"]}});
    }
    if (c.done && !c.finished_chunk) make(i, nullptr);
    all_done &= c.done;
  }
  if (!all_done) return true;
  finish_metrics();
  if (params_.include_usage && !usage_sent_) {
    usage_sent_ = true;
    json u = chunk(json::array());
    u["usage"] = usage();
    chunks.push_back(u);
  }
  return false;
}

json CompletionJob::collect(const std::function<bool()>& client_gone) {
  for (;;) {
    if (client_gone && client_gone()) {
      cancel();
      return nullptr;
    }
    bool all_done = true;
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      if (c.done) continue;
      std::vector<runtime::RequestOutput> outs;
      c.stream->pop(outs, std::chrono::milliseconds(100));
      for (auto& o : outs) {
        Delta d;
        consume(i, o, d);
        c.reasoning_content += d.reasoning;
        c.content += d.content;
      }
      all_done &= c.done;
    }
    if (all_done) break;
  }
  finish_metrics();
  json out_choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (c.finish == runtime::FinishReason::Error) {
      if (c.refused) throw ApiError(400, c.error, leading_field(c.error));
      throw ApiError(500, c.error, "", c.error_code);
    }
    if (c.finish == runtime::FinishReason::Cancelled)
      throw ApiError(503, "request cancelled: the server is shutting down", "", "service_unavailable");
    json ch = {{"index", i}, {"finish_reason", finish_name(c)}};
    if (params_.chat) {
      json msg = {{"role", "assistant"}, {"content", c.content}};
      if (c.reasoning) msg["reasoning_content"] = c.reasoning_content;
      if (c.tools && !c.tools->calls().empty()) {
        json calls = json::array();
        for (const auto& call : c.tools->calls())
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        msg["tool_calls"] = calls;
        if (c.content.find_first_not_of(" \n\r\t") == std::string::npos) msg["content"] = nullptr;
      }
      ch["message"] = msg;
      ch["logprobs"] = params_.logprobs ? json{{"content", c.logprobs}} : json();
    } else {
      ch["text"] = c.content;
      ch["logprobs"] = params_.logprobs ? c.logprobs : json();
    }
    out_choices.push_back(ch);
  }
  json r = chunk(out_choices);
  r["object"] = params_.chat ? "chat.completion" : "text_completion";
  r["usage"] = usage();
  return r;
}

}  // namespace ms::server
