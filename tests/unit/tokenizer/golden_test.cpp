// Parity with Hugging Face: ids, decodes and rendered chat prompts recorded by tools/golden/tokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using ms::tokenizer::Tokenizer;

nlohmann::ordered_json load(const std::string& rel) {
  std::ifstream f(std::string(MS_TEST_DATA) + "/tokenizer/" + rel);
  EXPECT_TRUE(f.good()) << rel;
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

TEST(TokenizerGolden, EncodeDecodeMatchesHuggingFace) {
  auto suites = load("encode_cases.json");
  ASSERT_GE(suites.size(), 2u);
  size_t checked = 0;
  for (const auto& suite : suites) {
    auto tok = Tokenizer::from_file(std::string(MS_TEST_DATA) + "/tokenizer/" +
                                    suite["tokenizer"].get<std::string>());
    for (const auto& c : suite["cases"]) {
      const std::string text = c["text"];
      auto ids = tok->encode(text, false);
      EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << suite["tokenizer"] << " text: " << text;
      EXPECT_EQ(tok->encode(text, true), c["ids_special"].get<std::vector<int32_t>>()) << text;
      EXPECT_EQ(tok->decode(ids, false), c["decoded"].get<std::string>()) << text;
      EXPECT_EQ(tok->decode(ids, true), c["decoded_skip"].get<std::string>()) << text;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100u);
}

TEST(TokenizerGolden, RoundTripWithoutNormalizer) {
  auto tok = Tokenizer::from_file(std::string(MS_TEST_DATA) + "/tokenizer/glm_like/tokenizer.json");
  for (const auto& c : load("encode_cases.json")[0]["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->decode(tok->encode(text, false), false), text);
  }
}

TEST(ChatTemplateGolden, RenderMatchesApplyChatTemplate) {
  auto cases = load("chat_cases.json");
  ASSERT_GE(cases.size(), 15u);
  std::set<std::string> templates;
  for (const auto& c : cases) {
    const std::string name = c["template"];
    templates.insert(name);
    auto tmpl = ms::tokenizer::ChatTemplate::from_file(
        std::string(MS_TEST_DATA) + "/tokenizer/templates/" + name, c["bos_token"], c["eos_token"]);
    ms::tokenizer::ChatInputs in;
    in.messages = c["messages"];
    in.tools = c["tools"];
    in.add_generation_prompt = c["add_generation_prompt"];
    in.extra = c["kwargs"];
    EXPECT_EQ(tmpl->render(in), c["expected"].get<std::string>()) << name << " " << c["messages"].dump();
  }
  EXPECT_EQ(templates.size(), 3u);
}

}  // namespace
