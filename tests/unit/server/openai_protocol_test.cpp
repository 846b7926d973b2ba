#include "server/openai_protocol.h"

#include <gtest/gtest.h>

using ms::server::ApiError;
using ms::server::parse_completion_request;
using nlohmann::json;

namespace {

// The field an error names, or "" when the body is accepted.
std::string rejected_field(const json& body, bool chat) {
  try {
    parse_completion_request(body, chat, {});
    return "";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    return e.param.empty() ? "<none>" : e.param;
  }
}

json chat(json extra = json::object()) {
  json b = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  b.update(extra);
  return b;
}

}  // namespace

TEST(OpenAiProtocol, ParsesAChatRequest) {
  auto p = parse_completion_request(chat({{"max_completion_tokens", 7},
                                          {"temperature", 0.5},
                                          {"top_p", 0.9},
                                          {"top_k", 20},
                                          {"min_p", 0.1},
                                          {"n", 2},
                                          {"stop", "END"},
                                          {"seed", 42},
                                          {"logprobs", true},
                                          {"top_logprobs", 3},
                                          {"stream", true},
                                          {"stream_options", {{"include_usage", true}}},
                                          {"chat_template_kwargs", {{"enable_thinking", false}}},
                                          {"tools", json::array({{{"type", "function"}}})}}),
                                    true, {});
  EXPECT_TRUE(p.chat);
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 20);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(p.sampling.top_logprobs, 3);
  EXPECT_TRUE(p.stream && p.include_usage && p.logprobs);
  EXPECT_FALSE(p.thinking);
  EXPECT_EQ(p.tools.size(), 1u);
}

TEST(OpenAiProtocol, ParsesCompletionPrompts) {
  auto p = parse_completion_request({{"model", "m"}, {"prompt", "abc"}, {"logprobs", 2}}, false, {});
  EXPECT_EQ(p.prompt_text, "abc");
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_EQ(p.sampling.top_logprobs, 2);
  p = parse_completion_request({{"model", "m"}, {"prompt", {1, 2, 3}}}, false, {});
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  p = parse_completion_request({{"model", "m"}, {"prompt", {"only"}}}, false, {});
  EXPECT_EQ(p.prompt_text, "only");
  EXPECT_EQ(p.sampling.top_logprobs, -1);
}

TEST(OpenAiProtocol, EveryRejectionNamesItsField) {
  EXPECT_EQ(rejected_field({{"messages", chat()["messages"]}}, true), "model");
  EXPECT_EQ(rejected_field(chat({{"model", 3}}), true), "model");
  EXPECT_EQ(rejected_field({{"model", "m"}}, true), "messages");
  EXPECT_EQ(rejected_field(chat({{"messages", json::array()}}), true), "messages");
  EXPECT_EQ(rejected_field(chat({{"messages", "hi"}}), true), "messages");
  EXPECT_EQ(rejected_field(chat({{"messages", {{{"content", "x"}}}}}), true), "messages[0].role");
  EXPECT_EQ(rejected_field(chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), true),
            "messages[0].role");
  EXPECT_EQ(rejected_field(chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}), true),
            "messages[0].content");
  EXPECT_EQ(rejected_field(chat({{"temperature", 3}}), true), "temperature");
  EXPECT_EQ(rejected_field(chat({{"temperature", "hot"}}), true), "temperature");
  EXPECT_EQ(rejected_field(chat({{"top_p", 0}}), true), "top_p");
  EXPECT_EQ(rejected_field(chat({{"top_k", -2}}), true), "top_k");
  EXPECT_EQ(rejected_field(chat({{"min_p", 1.5}}), true), "min_p");
  EXPECT_EQ(rejected_field(chat({{"presence_penalty", -3}}), true), "presence_penalty");
  EXPECT_EQ(rejected_field(chat({{"frequency_penalty", 2.5}}), true), "frequency_penalty");
  EXPECT_EQ(rejected_field(chat({{"repetition_penalty", 0}}), true), "repetition_penalty");
  EXPECT_EQ(rejected_field(chat({{"max_tokens", 0}}), true), "max_tokens");
  EXPECT_EQ(rejected_field(chat({{"max_tokens", 1.5}}), true), "max_tokens");
  EXPECT_EQ(rejected_field(chat({{"max_completion_tokens", -1}}), true), "max_completion_tokens");
  EXPECT_EQ(rejected_field(chat({{"n", 17}}), true), "n");
  EXPECT_EQ(rejected_field(chat({{"n", 0}}), true), "n");
  EXPECT_EQ(rejected_field(chat({{"stop", 5}}), true), "stop");
  EXPECT_EQ(rejected_field(chat({{"stop", {"a", 1}}}), true), "stop[1]");
  EXPECT_EQ(rejected_field(chat({{"stop", {""}}}), true), "stop");
  EXPECT_EQ(rejected_field(chat({{"stop_token_ids", {-1}}}), true), "stop_token_ids[0]");
  EXPECT_EQ(rejected_field(chat({{"top_logprobs", 2}}), true), "top_logprobs");
  EXPECT_EQ(rejected_field(chat({{"logprobs", true}, {"top_logprobs", 21}}), true), "top_logprobs");
  EXPECT_EQ(rejected_field(chat({{"logprobs", 1}}), true), "logprobs");
  EXPECT_EQ(rejected_field(chat({{"stream", "yes"}}), true), "stream");
  EXPECT_EQ(rejected_field(chat({{"stream_options", {{"include_usage", true}}}}), true), "stream_options");
  EXPECT_EQ(rejected_field(chat({{"seed", "x"}}), true), "seed");
  EXPECT_EQ(rejected_field(chat({{"tools", "x"}}), true), "tools");
  EXPECT_EQ(rejected_field(chat({{"chat_template_kwargs", 1}}), true), "chat_template_kwargs");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", ""}}, false), "prompt");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", 5}}, false), "prompt");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", {"a", "b"}}}, false), "prompt");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", {1, "b"}}}, false), "prompt[1]");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", "a"}, {"echo", true}}, false), "echo");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", "a"}, {"logprobs", 30}}, false), "logprobs");
  EXPECT_EQ(rejected_field(chat({{"unknown_field", 1}, {"temperature", nullptr}}), true), "");
}

TEST(OpenAiProtocol, MalformedBodies) {
  EXPECT_THROW(ms::server::parse_json_body("{not json"), ApiError);
  EXPECT_THROW(ms::server::parse_json_body("[1, 2]"), ApiError);
  EXPECT_THROW(ms::server::parse_json_body(""), ApiError);
  EXPECT_THROW(ms::server::parse_json_body("{\"n\": 3E311}"), ApiError);  // number overflow
  EXPECT_NO_THROW(ms::server::parse_json_body("{}"));
  EXPECT_EQ(ms::server::dump_json(json("a\xC3")), "\"a\xEF\xBF\xBD\"");  // invalid UTF-8 does not throw
}
