#include "server/tool_call_parser.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

using ms::server::ToolCallFormat;
using ms::server::ToolCallParser;
using ojson = nlohmann::ordered_json;

namespace {

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "zip": {"type": "string"}, "where": {"type": "object"}, "tags": {"type": ["array", "null"]},
    "ratio": {"anyOf": [{"type": "number"}, {"type": "string"}]}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}}}}}
])");

struct Result {
  std::string content;
  std::vector<ms::server::ToolCall> calls;
  std::map<int, std::string> streamed_args, streamed_names;  // per call index, joined pieces
  std::set<std::string> ids;
};

// Feeds `pieces` one after another and joins what comes out.
Result run(ToolCallFormat f, const std::vector<std::string>& pieces, const ojson& tools = kTools) {
  ToolCallParser p(f, tools);
  Result r;
  auto take = [&r](const ToolCallParser::Delta& d) {
    r.content += d.content;
    for (const auto& c : d.calls) {
      if (!c.id.empty()) {
        EXPECT_TRUE(r.ids.insert(c.id).second) << "id given twice: " << c.id;
        EXPECT_EQ(r.streamed_names.count(c.index), 0u);
        r.streamed_names[c.index] = c.name;
      }
      r.streamed_args[c.index] += c.arguments;
    }
  };
  for (const auto& s : pieces) take(p.feed(s));
  take(p.finish());
  r.calls = p.calls();
  return r;
}

// Every way of cutting `text` in two, and pieces of every size.
std::vector<std::vector<std::string>> cuts(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  for (size_t i = 0; i <= text.size(); ++i) out.push_back({text.substr(0, i), text.substr(i)});
  for (size_t step = 1; step <= 7; ++step) {
    std::vector<std::string> v;
    for (size_t i = 0; i < text.size(); i += step) v.push_back(text.substr(i, step));
    out.push_back(v);
  }
  return out;
}

void expect_consistent(const Result& r) {
  ASSERT_EQ(r.streamed_args.size(), r.calls.size());
  for (size_t i = 0; i < r.calls.size(); ++i) {
    EXPECT_EQ(r.streamed_names.at(static_cast<int>(i)), r.calls[i].name);
    EXPECT_EQ(r.streamed_args.at(static_cast<int>(i)), r.calls[i].arguments);
    EXPECT_EQ(r.calls[i].id.rfind("call_", 0), 0u) << r.calls[i].id;
    EXPECT_TRUE(ojson::parse(r.calls[i].arguments).is_object()) << r.calls[i].arguments;
  }
}

}  // namespace

TEST(ToolCallParser, GlmCallsAreTypedByTheSchemaAtEveryChunkBoundary) {
  const std::string text =
      "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true"
      "</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>where</arg_key>\n"
      "<arg_value>{\"lat\": 48.9, \"lon\": 2.35}</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>null"
      "</arg_value>\n<arg_key>ratio</arg_key>\n<arg_value>0.5</arg_value>\n</tool_call>\n<tool_call>search\n"
      "<arg_key>query</arg_key>\n<arg_value>a < b </arg_value>\n</tool_call>";
  for (const auto& pieces : cuts(text)) {
    const Result r = run(ToolCallFormat::Glm, pieces);
    EXPECT_EQ(r.content, "Let me check.\n");
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(ojson::parse(r.calls[0].arguments),
              ojson::parse(R"({"city": "Paris", "days": 3, "metric": true, "zip": "75001",
                               "where": {"lat": 48.9, "lon": 2.35}, "tags": null, "ratio": 0.5})"));
    EXPECT_EQ(r.calls[0].arguments.substr(0, 16), R"({"city":"Paris",)");  // in the model's order
    EXPECT_EQ(r.calls[1].name, "search");
    EXPECT_EQ(r.calls[1].arguments, R"({"query":"a < b "})");
    expect_consistent(r);
  }
}

TEST(ToolCallParser, GlmStreamsOneArgumentAtATime) {
  ToolCallParser p(ToolCallFormat::Glm, kTools);
  auto d = p.feed("<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Pa");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, "");  // the value is not complete yet
  d = p.feed("ris</arg_value><arg_key>days</arg_key><arg_value>2</arg_v");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_TRUE(d.calls[0].id.empty());
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris")");
  d = p.feed("alue></tool_call>");
  EXPECT_EQ(d.calls[0].arguments, R"(,"days":2})");
  EXPECT_EQ(d.content, "");
}

TEST(ToolCallParser, GlmWithoutSchemaKeepsStringsAndUnknownToolsWork) {
  const Result r = run(ToolCallFormat::Glm,
                       {"<tool_call>other\n<arg_key>n</arg_key>\n<arg_value>5</arg_value>\n</tool_call>"});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"n":"5"})");
  const Result empty = run(ToolCallFormat::Glm, {"<tool_call>search</tool_call>"}, ojson());
  ASSERT_EQ(empty.calls.size(), 1u);
  EXPECT_EQ(empty.calls[0].name, "search");
  EXPECT_EQ(empty.calls[0].arguments, "{}");
}

TEST(ToolCallParser, TextThatOnlyLooksLikeATagIsContent) {
  for (auto f : {ToolCallFormat::Glm, ToolCallFormat::DeepSeekV3}) {
    const std::string text = "x <tool_ca y <tool <｜tool▁call z <｜ <";
    for (const auto& pieces : cuts(text)) {
      const Result r = run(f, pieces);
      EXPECT_EQ(r.content, text);
      EXPECT_TRUE(r.calls.empty());
    }
  }
  const Result r = run(ToolCallFormat::Glm, {"answer <tool_c"});  // cut off inside a tag
  EXPECT_EQ(r.content, "answer <tool_c");
}

TEST(ToolCallParser, DeepSeekV3CallsAtEveryChunkBoundary) {
  const std::string text =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\", \"days\": "
      "2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
      "search\n```json\n{\"query\": \"cats\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  for (const auto& pieces : cuts(text)) {
    const Result r = run(ToolCallFormat::DeepSeekV3, pieces);
    EXPECT_EQ(r.content, "Sure.");
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","days":2})");
    EXPECT_EQ(r.calls[1].name, "search");
    EXPECT_EQ(r.calls[1].arguments, R"({"query":"cats"})");
    expect_consistent(r);
  }
}

TEST(ToolCallParser, DeepSeekV31FormAndAnUnfinishedCall) {
  const Result r = run(ToolCallFormat::DeepSeekV3,
                       {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\": \"x\"}"
                        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(r.calls[0].arguments, R"({"query":"x"})");
  EXPECT_EQ(r.content, "");
  // Cut off (max_tokens) inside the arguments: the call is closed with what it has.
  const Result cut =
      run(ToolCallFormat::Glm,
          {"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", "is</arg_value>\n<arg_k"});
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, R"({"city":"Paris"})");
  expect_consistent(cut);
}

TEST(ToolCallParser, ValuesTypedBySchema) {
  using ms::server::glm_typed_value;
  const ojson integer = {{"type", "integer"}}, number = {{"type", "number"}}, boolean = {{"type", "boolean"}};
  const ojson str = {{"type", "string"}}, arr = {{"type", "array"}};
  EXPECT_EQ(glm_typed_value("42", &integer), 42);
  EXPECT_EQ(glm_typed_value(" 4.0 ", &integer), 4);
  EXPECT_EQ(glm_typed_value("4.5", &integer), "4.5");  // not an integer: kept as the model wrote it
  EXPECT_EQ(glm_typed_value("4.5", &number), 4.5);
  EXPECT_EQ(glm_typed_value("True", &boolean), true);
  EXPECT_EQ(glm_typed_value("false", &boolean), false);
  EXPECT_EQ(glm_typed_value("yes", &boolean), "yes");
  EXPECT_EQ(glm_typed_value("42", &str), "42");
  EXPECT_EQ(glm_typed_value("[1, \"a\"]", &arr), ojson::parse("[1, \"a\"]"));
  EXPECT_EQ(glm_typed_value("42", nullptr), "42");
}

TEST(ToolCallParser, EarlierToolCallsReachTheTemplateAsObjects) {
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"days\": 2, \"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
  const ojson glm = ms::server::messages_for_template(ToolCallFormat::Glm, messages);
  EXPECT_EQ(glm[1]["content"], "");
  EXPECT_EQ(glm[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"days":2,"city":"Paris"})");
  const ojson ds = ms::server::messages_for_template(ToolCallFormat::DeepSeekV3, messages);
  EXPECT_EQ(ds[1]["content"], "");  // DeepSeek's templates render "" before the calls as they do null
  EXPECT_TRUE(ds[1]["tool_calls"][0]["function"]["arguments"].is_object());
  EXPECT_EQ(ds[2], messages[2]);
}
