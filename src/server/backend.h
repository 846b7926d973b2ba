// What the HTTP server needs from an inference engine. The tokenizer half is const and called from many HTTP
// threads at once; the engine half is called only from the server's engine-loop thread (EngineLoop), one call
// at a time, so an implementation needs no locking of its own.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "moe/expert_stats.h"
#include "runtime/engine_types.h"

namespace ms::profiler {
class ProfileController;
}

namespace ms::server {

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- tokenizer and model facts: thread-safe ----
  virtual std::string model_name() const = 0;
  virtual int64_t max_context() const = 0;  // prompt + completion tokens
  virtual int32_t vocab_size() const = 0;
  // add_special_tokens: what the tokenizer adds around a plain prompt (a BOS, say); false for a rendered
  // chat, whose template already wrote them.
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const = 0;
  // Text of ids, special tokens skipped. May end in an incomplete UTF-8 sequence (shown as U+FFFD).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The same with special tokens kept: tool-call tags are special tokens in some vocabularies.
  virtual std::string decode_with_special(const std::vector<int32_t>& ids) const { return decode(ids); }
  // The prompt text of a chat: messages as the OpenAI API sends them, tools (array or null) and
  // chat_template_kwargs (object or null) passed through to the template. Throws ms::Error on bad input.
  virtual std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                  const nlohmann::ordered_json& template_kwargs) const = 0;

  // ---- engine: engine-loop thread only ----
  // Queues a request under the server's id. Throws ms::Error (with the field in its message) when the request
  // can never run.
  virtual void submit(uint64_t id, const runtime::Request& request) = 0;
  // Drops a request wherever it is and frees its KV pages; no output for it follows. Unknown ids are ignored.
  virtual void cancel(uint64_t id) = 0;
  virtual bool has_work() const = 0;
  // Runs one step; returns the news of every request that produced a token or finished.
  virtual std::vector<runtime::RequestOutput> step() = 0;
  virtual runtime::EngineStats stats() const = 0;

  // Distinct experts per MoE layer per decode step (all layers together); empty bounds when the backend
  // keeps no such statistics. Thread-safe.
  virtual moe::DistinctExpertsHistogram distinct_experts_histogram(moe::RoutingKind) const { return {}; }

  // The profiler the backend's steps report to, or null when it has none. Its start/stop are thread-safe.
  virtual profiler::ProfileController* profile_controller() { return nullptr; }
};

}  // namespace ms::server
