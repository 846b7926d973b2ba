#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

using ms::server::ReasoningFormat;
using ms::server::ReasoningParser;

namespace {

// Feeds text in pieces of `step` bytes and joins the deltas.
std::pair<std::string, std::string> run(ReasoningParser p, const std::string& text, size_t step) {
  std::string r, c;
  for (size_t i = 0; i < text.size(); i += step) {
    auto d = p.feed(text.substr(i, step));
    r += d.reasoning;
    c += d.content;
  }
  auto d = p.finish();
  return {r + d.reasoning, c + d.content};
}

}  // namespace

TEST(ReasoningParser, Glm45SplitsThinkBlockAtAnyPieceSize) {
  const std::string text = "<think>Let me see: 2+2.</think>\n\nIt is 4.";
  for (size_t step = 1; step <= text.size(); ++step) {
    auto [r, c] = run(ReasoningParser(ReasoningFormat::Glm45), text, step);
    EXPECT_EQ(r, "Let me see: 2+2.") << "step " << step;
    EXPECT_EQ(c, "It is 4.") << "step " << step;
  }
}

TEST(ReasoningParser, Glm45WithoutThinkIsAllContent) {
  auto [r, c] = run(ReasoningParser(ReasoningFormat::Glm45), "Hello <think> not a block", 3);
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "Hello <think> not a block");
  auto [r2, c2] = run(ReasoningParser(ReasoningFormat::Glm45), "<thin", 1);  // a tag that never completes
  EXPECT_EQ(r2, "");
  EXPECT_EQ(c2, "<thin");
}

TEST(ReasoningParser, DeepSeekR1StartsInReasoning) {
  for (size_t step = 1; step < 12; ++step) {
    auto [r, c] = run(ReasoningParser(ReasoningFormat::DeepSeekR1), "hmm, </thin>k</think>Answer", step);
    EXPECT_EQ(r, "hmm, </thin>k") << step;
    EXPECT_EQ(c, "Answer") << step;
  }
  auto [r, c] = run(ReasoningParser(ReasoningFormat::DeepSeekR1), "<think>abc</think>x", 2);
  EXPECT_EQ(r, "abc");
  EXPECT_EQ(c, "x");
  auto [r2, c2] = run(ReasoningParser(ReasoningFormat::DeepSeekR1), "cut off while thinking </thi", 4);
  EXPECT_EQ(r2, "cut off while thinking </thi");
  EXPECT_EQ(c2, "");
}

TEST(ReasoningParser, ThinkingOffIsAllContent) {
  auto [r, c] = run(ReasoningParser(ReasoningFormat::DeepSeekR1, false), "plain </think> answer", 5);
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "plain </think> answer");
}

TEST(ReasoningParser, Names) {
  EXPECT_EQ(ms::server::parse_reasoning_format("glm45"), ReasoningFormat::Glm45);
  EXPECT_EQ(ms::server::parse_reasoning_format("deepseek-r1"), ReasoningFormat::DeepSeekR1);
  EXPECT_FALSE(ms::server::parse_reasoning_format("qwen3").has_value());
}
