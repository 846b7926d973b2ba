#include "server/reasoning_parser.h"

#include <algorithm>

namespace ms::server {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`: bytes that may start a tag.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::optional<ReasoningFormat> parse_reasoning_format(std::string_view name) {
  if (name == "glm45") return ReasoningFormat::Glm45;
  if (name == "deepseek-r1") return ReasoningFormat::DeepSeekR1;
  return std::nullopt;
}

ReasoningParser::ReasoningParser(ReasoningFormat format, bool thinking) {
  if (!thinking) {
    state_ = State::Content;
  } else {
    state_ = State::Start;  // both formats accept an explicit <think> first
  }
  (void)format;
  format_r1_ = format == ReasoningFormat::DeepSeekR1;
}

void ReasoningParser::emit_content(Delta& d, std::string_view text) {
  if (skip_leading_space_) {
    size_t i = 0;
    while (i < text.size() && (text[i] == '\n' || text[i] == ' ' || text[i] == '\r' || text[i] == '\t')) ++i;
    text.remove_prefix(i);
    if (!text.empty()) skip_leading_space_ = false;
  }
  d.content.append(text);
}

ReasoningParser::Delta ReasoningParser::feed(std::string_view text) {
  Delta d;
  held_.append(text);
  for (;;) {
    std::string_view buf = held_;
    if (state_ == State::Start) {
      // Leading whitespace, then either <think>, a prefix of it (wait), or anything else.
      size_t ws = 0;
      while (ws < buf.size() && (buf[ws] == '\n' || buf[ws] == ' ')) ++ws;
      std::string_view rest = buf.substr(ws);
      if (rest.size() >= kOpen.size() && rest.substr(0, kOpen.size()) == kOpen) {
        held_.erase(0, ws + kOpen.size());
        state_ = State::Reasoning;
        continue;
      }
      if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return d;  // undecided yet
      state_ = format_r1_ ? State::Reasoning : State::Content;
      continue;
    }
    if (state_ == State::Content) {
      emit_content(d, buf);
      held_.clear();
      return d;
    }
    // Reasoning
    size_t end = buf.find(kClose);
    if (end != std::string_view::npos) {
      d.reasoning.append(buf.substr(0, end));
      held_.erase(0, end + kClose.size());
      state_ = State::Content;
      skip_leading_space_ = true;
      continue;
    }
    const size_t keep = partial_tag_suffix(buf, kClose);
    d.reasoning.append(buf.substr(0, buf.size() - keep));
    held_.erase(0, buf.size() - keep);
    return d;
  }
}

ReasoningParser::Delta ReasoningParser::finish() {
  Delta d;
  if (state_ == State::Reasoning) {
    d.reasoning = std::move(held_);
  } else {
    if (state_ == State::Start && format_r1_) {
      d.reasoning = std::move(held_);
    } else {
      emit_content(d, held_);
    }
  }
  held_.clear();
  return d;
}

}  // namespace ms::server
