// Chat templates as Hugging Face applies them: the Jinja `chat_template` of tokenizer_config.json
// rendered with messages, tools, add_generation_prompt, special tokens and extra keyword arguments.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace ms::tokenizer {

namespace jinja {
class Template;
}

struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, ...}]
  nlohmann::ordered_json tools;                                       // null when none
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // e.g. {"enable_thinking": false}
};

class ChatTemplate {
 public:
  // Parses the template now; unsupported syntax throws, naming the construct and line.
  ChatTemplate(const std::string& source, const std::string& where, std::string bos_token = {},
               std::string eos_token = {});
  ~ChatTemplate();
  // The template from tokenizer_config.json in `model_dir` ("chat_template" as a string, or a list of
  // named templates whose "default" is used; chat_template.jinja beside it wins), with its bos/eos tokens.
  static std::unique_ptr<ChatTemplate> from_model_dir(const std::string& model_dir);
  static std::unique_ptr<ChatTemplate> from_file(const std::string& path, std::string bos_token = {},
                                                 std::string eos_token = {});

  std::string render(const ChatInputs& in) const;

 private:
  std::unique_ptr<jinja::Template> tmpl_;
  std::string bos_, eos_;
};

}  // namespace ms::tokenizer
