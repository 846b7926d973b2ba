// A model-free backend for testing the server, the benchmark client and the scheduler together: the real
// scheduler, page allocator and prefix cache plan every step, and the "model" answers deterministically by
// repeating the prompt (output token i is prompt token i mod prompt length), or, in scripted mode, with the
// reply its script gives for the prompt, then the end-of-sequence token. Its tokenizer maps each byte to a
// token (ids 0..255); id 256 is the end-of-sequence token. render_chat joins the message contents with "\n",
// or renders a given chat template.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kv/page_allocator.h"
#include "kv/radix_cache.h"
#include "scheduler/scheduler.h"
#include "server/backend.h"
#include "tokenizer/chat_template.h"

namespace ms::server {

struct EchoBackendConfig {
  std::string model_name = "echo";
  int32_t num_pages = 1024;
  int32_t page_size = 16;
  int32_t max_running_requests = 64;
  int32_t max_prefill_tokens = 2048;
  int64_t max_context = 4096;
  std::chrono::microseconds step_time{0};  // slept per step, to look like a model
  // Scripted replies: (trigger, reply). A prompt that contains triggers gets the reply of the one whose last
  // occurrence ends latest (in a multi-turn chat: the newest message's), then the end-of-sequence token.
  std::vector<std::pair<std::string, std::string>> script;
  std::shared_ptr<const tokenizer::ChatTemplate> chat_template;  // null: contents joined with "\n"
  int fail_at_step = 0;  // > 0: that step throws std::runtime_error (tests of failure handling)
};

// A script file: a JSON object {"trigger": "reply", ...}, in file order.
std::vector<std::pair<std::string, std::string>> load_echo_script(const std::string& path);

class EchoBackend : public Backend {
 public:
  static constexpr int32_t kEos = 256;
  explicit EchoBackend(EchoBackendConfig config = {});
  ~EchoBackend() override;

  std::string model_name() const override { return config_.model_name; }
  int64_t max_context() const override { return config_.max_context; }
  int32_t vocab_size() const override { return 257; }
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                          const nlohmann::ordered_json& template_kwargs) const override;

  void submit(uint64_t id, const runtime::Request& request) override;
  void cancel(uint64_t id) override;
  bool has_work() const override { return scheduler_->has_work(); }
  std::vector<runtime::RequestOutput> step() override;
  runtime::EngineStats stats() const override;

 private:
  struct Live {
    runtime::Request request;
    std::optional<std::vector<int32_t>> reply;  // scripted mode: the tokens to answer
  };
  int steps_ = 0;
  EchoBackendConfig config_;
  std::unique_ptr<kv::PageAllocator> allocator_;
  std::unique_ptr<kv::RadixCache> cache_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unordered_map<uint64_t, Live> live_;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0;
};

}  // namespace ms::server
