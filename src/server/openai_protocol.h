// OpenAI request bodies -> validated parameters, and the JSON objects of responses. Every rejection is an
// ApiError whose param names the offending field.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "io/generation_config.h"
#include "runtime/engine_types.h"
#include "server/api_error.h"

namespace ms::server {

struct ProtocolLimits {
  // Sampling settings of a request that leaves them out (the model's generation_config.json under
  // --generation-config auto; else the OpenAI API's defaults).
  io::GenerationDefaults sampling_defaults;
  int max_n = 16;
  int max_top_logprobs = 20;
  int max_stop = 16;
  int max_prompts = 64;  // prompts in one /v1/completions call (each gets n choices)
};

// One prompt of /v1/completions: text or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> ids;  // when text is absent
};

// tool_choice: which tool calls the answer may (or must) make.
struct ToolChoice {
  enum class Mode { Auto, None, Required, Named };
  Mode mode = Mode::Auto;
  std::string name;  // Named: the function to call
};

// One /v1/chat/completions or /v1/completions call, before tokenization.
struct CompletionParams {
  bool chat = false;
  std::string model;
  // chat: kept in the client's key order, which is what the template renders
  nlohmann::ordered_json messages, tools, template_kwargs;
  ToolChoice tool_choice;  // Auto without tools means no tool calls
  // completions: one or more prompts (a list of strings or of token id lists); each gets n choices
  std::vector<PromptInput> prompts;
  std::optional<int> max_tokens;  // absent: the server's default (chat) or up to the context
  runtime::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int n = 1;
  bool stream = false, include_usage = false;
  bool logprobs = false;  // top_logprobs in sampling.top_logprobs (0 when only the chosen token's)
  bool thinking = true;   // chat_template_kwargs.enable_thinking / thinking
};

// Throws ApiError(400) naming the field. `body` is the parsed JSON. A field the server knows but does not
// implement (response_format other than text, functions, suffix, ...) is refused, never ignored.
CompletionParams parse_completion_request(const nlohmann::ordered_json& body, bool chat,
                                          const ProtocolLimits& limits);

// Parses text as JSON, keys in the order sent; ApiError(400) with the parser's message when it is not a JSON
// object.
nlohmann::ordered_json parse_json_body(const std::string& text);

// Serialises without throwing on invalid UTF-8 (replaced by U+FFFD): model text may end mid-character.
std::string dump_json(const nlohmann::json& j);
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace ms::server
