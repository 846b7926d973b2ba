// Arbitrary request bodies through the OpenAI request parser, and arbitrary model text through the reasoning
// parser and the stop-string stream: nothing may crash; every rejection must be an ApiError naming a status.
// fuzz-sources: src/server/openai_protocol.cpp src/server/reasoning_parser.cpp src/server/text_stream.cpp
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/openai_protocol.h"
#include "server/reasoning_parser.h"
#include "server/text_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool chat = data[0] & 1;
  try {
    auto body = ms::server::parse_json_body(text);
    auto p = ms::server::parse_completion_request(body, chat, {});
    if (p.n < 1 || p.n > 16) __builtin_trap();
    (void)ms::server::dump_json(body);
  } catch (const ms::server::ApiError& e) {
    if (e.status < 400 || e.status >= 500) __builtin_trap();
  }

  // Model output split at every data[0]-th byte.
  const size_t step = 1 + data[0] % 7;
  ms::server::ReasoningParser rp(data[0] & 2 ? ms::server::ReasoningFormat::Glm45
                                             : ms::server::ReasoningFormat::DeepSeekR1);
  std::string joined;
  for (size_t i = 0; i < text.size(); i += step) {
    auto d = rp.feed(std::string_view(text).substr(i, step));
    joined += d.reasoning + d.content;
  }
  auto d = rp.finish();
  joined += d.reasoning + d.content;
  if (joined.size() > text.size()) __builtin_trap();  // the parser only removes tags and spaces

  ms::server::TextStream ts(
      [](const std::vector<int32_t>& ids) {
        std::string s;
        for (int32_t i : ids) s.push_back(static_cast<char>(i));
        return s;
      },
      {"</s>", "\n\n"});
  std::string sent;
  for (unsigned char c : text) sent += ts.add(c);
  sent += ts.finish();
  if (sent != ts.text()) __builtin_trap();  // what was sent is exactly the text so far
  if (sent.find("</s>") != std::string::npos) __builtin_trap();
  return 0;
}
