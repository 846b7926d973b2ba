// Turns a model's tool-call markup into OpenAI tool calls, on streamed text: markup split across pieces is
// held back until it can be told apart from ordinary text, so no part of a tag reaches `content`.
//   glm:         <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>, one block
//   per
//                call. Values are text; each is typed by the tool's JSON schema (a property whose type is not
//                "string" is read as JSON: 2 -> 2, true -> true, {"a": 1} -> an object).
//   deepseek_v3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
//                <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>; the V3.1 form NAME<｜tool▁sep｜>ARGS is read
//                too.
// A call's arguments are a JSON object text. Pieces come out as the model writes them: the call's id and
// name once its name is complete, then arguments fragments (glm: one per argument; deepseek_v3: the whole
// object at the call's end) whose concatenation is the call's arguments.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ms::server {

enum class ToolCallFormat { Glm, DeepSeekV3 };
// "glm" | "deepseek_v3"; nullopt for an unknown name.
std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name);

struct ToolCall {
  std::string id, name, arguments;  // arguments: a JSON object as text
};

class ToolCallParser {
 public:
  // One step of a call: `name` (with `id`) when the call starts, then `arguments` fragments.
  struct CallPiece {
    int index = 0;  // the call's position in the answer
    std::string id, name;
    std::string arguments;
  };
  struct Delta {
    std::string content;
    std::vector<CallPiece> calls;
  };
  // tools: the request's tools array (their parameter schemas type glm's values); may be null.
  ToolCallParser(ToolCallFormat format, nlohmann::ordered_json tools);
  Delta feed(std::string_view text);
  // Flushes what was held back; a call left open (the answer was cut short) is closed with what it has.
  Delta finish();
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class State { Text, Section, Call };
  void text_state(Delta& d, bool final);
  void section_state(Delta& d, bool final);
  bool call_state(Delta& d, bool final);  // false: wait for more text
  void start_call(Delta& d, std::string name);
  void add_arguments(Delta& d, const std::string& fragment);
  void glm_arguments(Delta& d, bool final);
  void end_call(Delta& d);
  void emit_content(Delta& d, std::string_view text);

  ToolCallFormat format_;
  nlohmann::ordered_json tools_;
  State state_ = State::Text;
  std::string held_;  // text not yet decided
  std::string body_;  // the open call's text after its start tag
  bool named_ = false;
  size_t args_at_ = 0;  // glm: body_ offset of the next unread argument; deepseek: where the arguments start
  int args_count_ = 0;
  bool skip_space_ = false;  // drop the whitespace between calls
  std::vector<ToolCall> calls_;
};

// A glm argument value typed by its property schema (null: no schema, kept as a string).
nlohmann::ordered_json glm_typed_value(const std::string& text, const nlohmann::ordered_json* schema);

// Chat messages as a template of this format expects them: a previous assistant turn's tool call arguments
// (OpenAI sends a JSON text) become objects (glm iterates `arguments.items()`, deepseek_v3 writes
// `arguments|tojson` in its json fence), and glm gets "" for an absent assistant content.
nlohmann::ordered_json messages_for_template(ToolCallFormat format, const nlohmann::ordered_json& messages);

}  // namespace ms::server
