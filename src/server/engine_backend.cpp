#include "server/engine_backend.h"

#include <algorithm>

#include "core/error.h"

namespace ms::server {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// End-of-text spellings of the tokenizers this engine serves, for models whose config names no eos id.
constexpr const char* kEndOfTextTokens[] = {"<|endoftext|>", "</s>", "<|end_of_text|>",
                                            "<\xef\xbd\x9c"
                                            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"};

// A message's content as the template expects it: a string. The API also allows an array of parts, of
// which a text-only model reads the text ones.
ordered_json message_for_template(const ordered_json& m, size_t index) {
  MS_CHECK(m.is_object(), "messages[{}]: expected an object", index);
  ordered_json out = m;
  if (m.contains("content") && m["content"].is_array()) {
    std::string text;
    for (const auto& part : m["content"])
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
          part["text"].is_string())
        text += part["text"].get<std::string>();
    out["content"] = text;
  }
  return out;
}

}  // namespace

EngineBackend::EngineBackend(EngineBackendParts parts)
    : engine_(std::move(parts.engine)),
      tokenizer_(std::move(parts.tokenizer)),
      chat_template_(std::move(parts.chat_template)),
      profiler_(std::make_unique<profiler::ProfileController>(std::move(parts.profiler))),
      model_name_(std::move(parts.model_name)) {
  MS_CHECK(engine_ && tokenizer_, "EngineBackend needs an engine and a tokenizer");
  const io::ModelConfig& cfg = engine_->model().config();
  vocab_size_ = static_cast<int32_t>(cfg.vocab_size);
  MS_CHECK(tokenizer_->vocab_size() <= vocab_size_,
           "the tokenizer has {} tokens but the model's vocabulary is {}: they do not belong together",
           tokenizer_->vocab_size(), vocab_size_);
  const runtime::KvCapacity kvc = engine_->kv_capacity();
  const int64_t pool_tokens = static_cast<int64_t>(kvc.num_pages) * kvc.page_size;
  max_context_ = std::min(engine_->stats().max_context, pool_tokens);
  for (int64_t id : cfg.eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(id));
  if (eos_ids_.empty()) {
    for (const char* t : kEndOfTextTokens)
      if (int32_t id = tokenizer_->token_to_id(t); id >= 0) eos_ids_.push_back(id);
    eos_from_tokenizer_ = true;
  }
  engine_->set_step_hook(profiler_.get());
}

EngineBackend::~EngineBackend() {
  if (engine_) engine_->set_step_hook(nullptr);
}

std::vector<int32_t> EngineBackend::encode(const std::string& text, bool add_special_tokens) const {
  return tokenizer_->encode(text, add_special_tokens);
}

std::string EngineBackend::decode(const std::vector<int32_t>& ids) const {
  return tokenizer_->decode(ids, /*skip_special_tokens=*/true);
}

std::string EngineBackend::decode_with_special(const std::vector<int32_t>& ids) const {
  return tokenizer_->decode(ids, /*skip_special_tokens=*/false);
}

std::string EngineBackend::render_chat(const ordered_json& messages, const ordered_json& tools,
                                       const ordered_json& template_kwargs) const {
  MS_CHECK(chat_template_ != nullptr,
           "messages: this model has no chat template (start the server with --chat-template FILE, or use "
           "/v1/completions)");
  MS_CHECK(messages.is_array(), "messages: expected an array");
  tokenizer::ChatInputs in;
  for (size_t i = 0; i < messages.size(); ++i) in.messages.push_back(message_for_template(messages[i], i));
  if (tools.is_array()) in.tools = tools;
  if (template_kwargs.is_object()) {
    in.extra = template_kwargs;
    // The one keyword the renderer itself reads; the rest go to the template as variables.
    if (auto it = in.extra.find("add_generation_prompt"); it != in.extra.end() && it->is_boolean()) {
      in.add_generation_prompt = it->get<bool>();
      in.extra.erase(it);
    }
  }
  return chat_template_->render(in);
}

void EngineBackend::submit(uint64_t id, const runtime::Request& request) {
  MS_CHECK(!engine_id_of_.contains(id), "request id {} is already running", id);
  runtime::Request r = request;
  if (eos_from_tokenizer_ && !r.ignore_eos)
    r.stop_token_ids.insert(r.stop_token_ids.end(), eos_ids_.begin(), eos_ids_.end());
  const uint64_t eid = engine_->submit(std::move(r));
  engine_id_of_[id] = eid;
  server_id_of_[eid] = id;
}

void EngineBackend::cancel(uint64_t id) {
  auto it = engine_id_of_.find(id);
  if (it == engine_id_of_.end()) return;
  // The Engine frees the pages at the start of its next step (the engine loop runs one while it has work);
  // the Cancelled output that step reports has no server id any more and is dropped.
  engine_->cancel(it->second);
  server_id_of_.erase(it->second);
  engine_id_of_.erase(it);
}

std::vector<runtime::RequestOutput> EngineBackend::step() {
  std::vector<runtime::RequestOutput> outs = engine_->step();
  std::vector<runtime::RequestOutput> mine;
  mine.reserve(outs.size());
  for (auto& o : outs) {
    auto it = server_id_of_.find(o.request_id);
    if (it == server_id_of_.end()) continue;
    const uint64_t sid = it->second;
    if (o.finish != runtime::FinishReason::None) {
      server_id_of_.erase(it);
      engine_id_of_.erase(sid);
    }
    o.request_id = sid;
    mine.push_back(std::move(o));
  }
  return mine;
}

runtime::EngineStats EngineBackend::stats() const {
  runtime::EngineStats s = engine_->stats();
  s.max_context = max_context_;
  return s;
}

}  // namespace ms::server
