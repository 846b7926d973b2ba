// One OpenAI completion call in flight: its engine requests (n per prompt; choice index prompt * n + k),
// their text (detokenized, stop strings, reasoning split), logprobs, usage and latency metrics, as one
// response or as stream chunks.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/reasoning_parser.h"
#include "server/text_stream.h"
#include "server/tool_call_parser.h"

namespace ms::server {

class CompletionJob {
 public:
  using Clock = std::chrono::steady_clock;
  CompletionJob(EngineLoop& loop, Metrics& metrics, CompletionParams params,
                std::vector<std::vector<int32_t>> prompts, std::string model,
                std::optional<ReasoningFormat> reasoning, std::optional<ToolCallFormat> tool_calls = {});
  ~CompletionJob();  // cancels what still runs

  void start();
  // Streaming: appends the chunks that are ready (waiting up to `timeout` for news). Returns false once every
  // choice has finished and its last chunk (and the usage chunk, when asked) was appended.
  bool poll(std::vector<nlohmann::json>& chunks, std::chrono::milliseconds timeout);
  // Not streaming: waits for every choice; the whole response. Throws ApiError when the engine refused it.
  // `client_gone`, when given, is asked while waiting: once it says true, the job is cancelled (its pages
  // freed) and collect returns null.
  nlohmann::json collect(const std::function<bool()>& client_gone = {});
  void cancel();

 private:
  struct Choice {
    size_t prompt = 0;  // index into prompts_
    std::shared_ptr<RequestStream> stream;
    std::unique_ptr<TextStream> text;
    std::unique_ptr<ReasoningParser> reasoning;
    std::unique_ptr<ToolCallParser> tools;   // chat with tools, a --tool-call-parser, tool_choice not none
    std::string content, reasoning_content;  // all of it, for the non-streaming answer
    nlohmann::json logprobs;                 // chat: array of entries; completions: the four parallel arrays
    int text_offset = 0;
    runtime::FinishReason finish = runtime::FinishReason::None;
    std::string error, error_code = "engine_error";
    bool refused = false;  // the engine refused its input: a client error
    bool done = false, sent_role = false, finished_chunk = false;
    int completion_tokens = 0, cached_tokens = 0;
    Clock::time_point last_token;
  };
  struct Delta {
    std::string content, reasoning;
    nlohmann::json logprobs;
    nlohmann::json tool_calls = nlohmann::json::array();  // OpenAI delta.tool_calls entries
  };
  void consume(size_t index, runtime::RequestOutput& o, Delta& d);
  void logprob_entry(Choice& c, const runtime::GeneratedToken& g, nlohmann::json& out);
  void check_tool_choice(Choice& c) const;
  std::string finish_name(const Choice& c) const;
  nlohmann::json chunk(nlohmann::json choices) const;
  nlohmann::json usage() const;
  void finish_metrics();

  EngineLoop& loop_;
  Metrics& metrics_;
  CompletionParams params_;
  std::vector<std::vector<int32_t>> prompts_;
  std::string model_, id_;
  std::optional<ReasoningFormat> reasoning_format_;
  std::optional<ToolCallFormat> tool_call_format_;
  std::vector<Choice> choices_;
  Clock::time_point start_;
  int64_t created_ = 0;
  bool first_token_seen_ = false, usage_sent_ = false, metrics_done_ = false;
  bool cancelled_here_ = false;  // cancel() was called: the client is gone
};

}  // namespace ms::server
