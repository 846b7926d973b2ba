#include "server/openai_protocol.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <map>

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
  auto p = parse_completion_request(
      chat({{"max_completion_tokens", 7},
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
            {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}}),
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
  ASSERT_EQ(p.prompts.size(), 1u);
  EXPECT_EQ(p.prompts[0].text, "abc");
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_EQ(p.sampling.top_logprobs, 2);
  p = parse_completion_request({{"model", "m"}, {"prompt", {1, 2, 3}}}, false, {});
  EXPECT_EQ(p.prompts.at(0).ids, (std::vector<int32_t>{1, 2, 3}));
  p = parse_completion_request({{"model", "m"}, {"prompt", {"only"}}}, false, {});
  EXPECT_EQ(p.prompts.at(0).text, "only");
  p = parse_completion_request({{"model", "m"}, {"prompt", {"a", "bc"}}}, false, {});
  ASSERT_EQ(p.prompts.size(), 2u);
  EXPECT_EQ(p.prompts[1].text, "bc");
  p = parse_completion_request({{"model", "m"}, {"prompt", {{1, 2}, {3}}}}, false, {});
  ASSERT_EQ(p.prompts.size(), 2u);
  EXPECT_EQ(p.prompts[1].ids, std::vector<int32_t>{3});
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
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", {"a", ""}}}, false), "prompt[1]");
  EXPECT_EQ(rejected_field(chat({{"logit_bias", {{"5", 101}}}}), true), "logit_bias");
  EXPECT_EQ(rejected_field(chat({{"logit_bias", {{"x", 1}}}}), true), "logit_bias");
  EXPECT_EQ(rejected_field(chat({{"logit_bias", 3}}), true), "logit_bias");
  EXPECT_EQ(rejected_field(chat({{"response_format", {{"type", "json_object"}}}}), true), "response_format");
  EXPECT_EQ(rejected_field(chat({{"response_format", {{"type", "text"}}}}), true), "");
  EXPECT_EQ(rejected_field(chat({{"functions", json::array()}}), true), "functions");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", "a"}, {"suffix", "z"}}, false), "suffix");
  EXPECT_EQ(rejected_field(chat({{"tool_choice", "required"}}), true), "tool_choice");
  EXPECT_EQ(rejected_field(chat({{"tools", {{{"type", "function"}}}}}), true), "tools[0].function");
  EXPECT_EQ(rejected_field(chat({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
                                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}),
                           true),
            "tool_choice");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", {1, "b"}}}, false), "prompt[1]");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", "a"}, {"echo", true}}, false), "echo");
  EXPECT_EQ(rejected_field({{"model", "m"}, {"prompt", "a"}, {"logprobs", 30}}, false), "logprobs");
  EXPECT_EQ(rejected_field(chat({{"unknown_field", 1}, {"temperature", nullptr}}), true), "");
}

TEST(OpenAiProtocol, LogitBiasAndToolChoice) {
  auto p = parse_completion_request(chat({{"logit_bias", {{"7", -100}, {"3", 2.5}}}}), true, {});
  ASSERT_EQ(p.sampling.logit_bias.size(), 2u);
  std::map<int32_t, float> bias(p.sampling.logit_bias.begin(), p.sampling.logit_bias.end());
  EXPECT_EQ(bias, (std::map<int32_t, float>{{3, 2.5f}, {7, -100.0f}}));
  EXPECT_EQ(p.tool_choice.mode, ms::server::ToolChoice::Mode::None);  // no tools
  const json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  p = parse_completion_request(chat({{"tools", tools}}), true, {});
  EXPECT_EQ(p.tool_choice.mode, ms::server::ToolChoice::Mode::Auto);
  p = parse_completion_request(
      chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}), true,
      {});
  EXPECT_EQ(p.tool_choice.mode, ms::server::ToolChoice::Mode::Named);
  EXPECT_EQ(p.tool_choice.name, "f");
}

// Tools and message contents keep the client's key order all the way to the template.
TEST(OpenAiProtocol, KeepsTheClientsKeyOrder) {
  const std::string body =
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
          "function": {"name": "f", "parameters": {"type": "object", "properties": {"zeta": {"type": "string"},
          "alpha": {"type": "integer"}}}}}]})";
  auto p = parse_completion_request(ms::server::parse_json_body(body), true, {});
  EXPECT_EQ(p.tools[0].dump(),
            R"({"type":"function","function":{"name":"f","parameters":{"type":"object","properties":)"
            R"({"zeta":{"type":"string"},"alpha":{"type":"integer"}}}}})");
  EXPECT_EQ(p.messages[0].begin().key(), "role");
}

TEST(OpenAiProtocol, MalformedBodies) {
  EXPECT_THROW(ms::server::parse_json_body("{not json"), ApiError);
  EXPECT_THROW(ms::server::parse_json_body("[1, 2]"), ApiError);
  EXPECT_THROW(ms::server::parse_json_body(""), ApiError);
  EXPECT_THROW(ms::server::parse_json_body("{\"n\": 3E311}"), ApiError);  // number overflow
  EXPECT_NO_THROW(ms::server::parse_json_body("{}"));
  EXPECT_EQ(ms::server::dump_json(json("a\xC3")), "\"a\xEF\xBF\xBD\"");  // invalid UTF-8 does not throw
}

namespace {

// The model's generation_config.json fills what a request leaves out, and only that.
TEST(OpenAiProtocol, SamplingDefaultsFromTheModel) {
  ms::server::ProtocolLimits limits;
  limits.sampling_defaults = ms::io::parse_generation_config(json{{"temperature", 0.6},
                                                                  {"top_p", 0.9},
                                                                  {"top_k", 40},
                                                                  {"repetition_penalty", 1.1},
                                                                  {"eos_token_id", 2}},
                                                             "generation_config.json");
  auto p = parse_completion_request(chat(), true, limits);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.9f);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.0f);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.1f);
  p = parse_completion_request(
      chat({{"temperature", 0}, {"top_p", 1}, {"top_k", -1}, {"repetition_penalty", 1}}), true, limits);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 1.0f);
  EXPECT_EQ(p.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.0f);
  // Without a generation config: the OpenAI API's defaults.
  p = parse_completion_request(chat(), true, {});
  EXPECT_FLOAT_EQ(p.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 1.0f);
  EXPECT_EQ(p.sampling.top_k, 0);
}

TEST(GenerationConfig, DoSampleFalseIsGreedyAndBadFieldsAreNamed) {
  using ms::io::parse_generation_config;
  EXPECT_FLOAT_EQ(
      parse_generation_config(json{{"do_sample", false}, {"temperature", 0.7}}, "g.json").temperature, 0.0f);
  auto message = [](const json& j) {
    try {
      parse_generation_config(j, "g.json");
    } catch (const ms::Error& e) {
      return e.message();
    }
    return std::string();
  };
  EXPECT_NE(message(json{{"temperature", "hot"}}).find("'temperature'"), std::string::npos);
  EXPECT_NE(message(json{{"top_p", 0}}).find("'top_p'"), std::string::npos);
  EXPECT_NE(message(json{{"top_p", 3}}).find("g.json"), std::string::npos);
  EXPECT_NE(message(json{{"top_k", 2.5}}).find("'top_k'"), std::string::npos);
  EXPECT_NE(message(json{{"do_sample", "yes"}}).find("'do_sample'"), std::string::npos);
  EXPECT_NE(message(json::array()).find("g.json"), std::string::npos);
  EXPECT_EQ(message(json{{"temperature", nullptr}, {"bos_token_id", 0}}), "");
}

}  // namespace
