// The server's backend over a real model: runtime::Engine for the steps, tokenizer::Tokenizer for text and
// ids, tokenizer::ChatTemplate for chats. The server's request ids are its own; the Engine hands out
// others, so both directions are mapped here. It also owns the ProfileController the Engine reports its
// steps to (POST /start_profile, /stop_profile).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "profiler/profile_controller.h"
#include "runtime/engine.h"
#include "server/backend.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ms::server {

struct EngineBackendParts {
  std::unique_ptr<runtime::Engine> engine;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template;  // null: chat requests fail with a 400
  std::string model_name;
  profiler::ProfileControllerOptions profiler;  // ceilings measured at the first /start_profile unless given
};

class EngineBackend : public Backend {
 public:
  explicit EngineBackend(EngineBackendParts parts);
  ~EngineBackend() override;

  std::string model_name() const override { return model_name_; }
  // The smaller of the Engine's context limit and what the KV pool can hold for one request.
  int64_t max_context() const override { return max_context_; }
  int32_t vocab_size() const override { return vocab_size_; }
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string decode_with_special(const std::vector<int32_t>& ids) const override;
  std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                          const nlohmann::ordered_json& template_kwargs) const override;

  void submit(uint64_t id, const runtime::Request& request) override;
  void cancel(uint64_t id) override;
  bool has_work() const override { return engine_->has_work(); }
  std::vector<runtime::RequestOutput> step() override;
  runtime::EngineStats stats() const override;
  moe::DistinctExpertsHistogram distinct_experts_histogram(moe::RoutingKind kind) const override {
    return engine_->distinct_experts_histogram(kind);
  }
  profiler::ProfileController* profile_controller() override { return profiler_.get(); }

  // The ids that end a request besides its own stop ids (unless ignore_eos): the model config's eos ids, or
  // when it names none, the tokenizer's end-of-text token.
  const std::vector<int32_t>& eos_token_ids() const { return eos_ids_; }

 private:
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template_;
  std::unique_ptr<profiler::ProfileController> profiler_;
  std::string model_name_;
  int64_t max_context_ = 0;
  int32_t vocab_size_ = 0;
  std::vector<int32_t> eos_ids_;
  bool eos_from_tokenizer_ = false;  // the Engine does not know eos_ids_: they go in as stop ids
  std::unordered_map<uint64_t, uint64_t> engine_id_of_;  // server id -> Engine id
  std::unordered_map<uint64_t, uint64_t> server_id_of_;  // Engine id -> server id
};

}  // namespace ms::server
