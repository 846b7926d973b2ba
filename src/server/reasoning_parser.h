// Splits a reasoning model's output into reasoning and answer: the text between <think> and </think> is
// reasoning_content, the rest content. Works on streamed text: a tag split across pieces is held back until
// it can be told apart from ordinary text.
//   glm45:       the model writes <think> itself; text before it (there should be none) is content.
//   deepseek-r1: the chat template already opened the block, so output starts as reasoning (a leading <think>
//                is tolerated) until </think>.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ms::server {

enum class ReasoningFormat { Glm45, DeepSeekR1 };
// "glm45" | "deepseek-r1"; nullopt for an unknown name.
std::optional<ReasoningFormat> parse_reasoning_format(std::string_view name);

class ReasoningParser {
 public:
  struct Delta {
    std::string reasoning, content;
  };
  // thinking=false (e.g. chat_template_kwargs.enable_thinking false): everything is content.
  ReasoningParser(ReasoningFormat format, bool thinking = true);
  Delta feed(std::string_view text);
  Delta finish();  // flushes what was held back

 private:
  enum class State { Start, Reasoning, Content };
  void emit_content(Delta& d, std::string_view text);
  State state_;
  bool format_r1_ = false;
  bool skip_leading_space_ = false;  // after </think>: the answer's leading newlines
  std::string held_;
};

}  // namespace ms::server
