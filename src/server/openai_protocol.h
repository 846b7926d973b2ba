// OpenAI request bodies -> validated parameters, and the JSON objects of responses. Every rejection is an
// ApiError whose param names the offending field.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "runtime/engine_types.h"
#include "server/api_error.h"

namespace ms::server {

struct ProtocolLimits {
  int max_n = 16;
  int max_top_logprobs = 20;
  int max_stop = 16;
};

// One /v1/chat/completions or /v1/completions call, before tokenization.
struct CompletionParams {
  bool chat = false;
  std::string model;
  // chat
  nlohmann::json messages, tools, template_kwargs;
  // completions: either text or token ids
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  std::optional<int> max_tokens;  // absent: up to the context
  runtime::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int n = 1;
  bool stream = false, include_usage = false;
  bool logprobs = false;  // top_logprobs in sampling.top_logprobs (0 when only the chosen token's)
  bool thinking = true;   // chat_template_kwargs.enable_thinking / thinking
};

// Throws ApiError(400) naming the field. `body` is the parsed JSON.
CompletionParams parse_completion_request(const nlohmann::json& body, bool chat,
                                          const ProtocolLimits& limits);

// Parses text as JSON; ApiError(400) with the parser's message when it is not a JSON object.
nlohmann::json parse_json_body(const std::string& text);

// Serialises without throwing on invalid UTF-8 (replaced by U+FFFD): model text may end mid-character.
std::string dump_json(const nlohmann::json& j);

}  // namespace ms::server
