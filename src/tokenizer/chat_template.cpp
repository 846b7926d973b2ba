#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/jinja/template.h"

namespace ms::tokenizer {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MS_CHECK(f.good(), "cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Special tokens in tokenizer_config.json are strings or {"content": ...} objects.
std::string token_text(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return {};
  const auto& v = cfg.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return {};
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, const std::string& where, std::string bos_token,
                           std::string eos_token)
    : tmpl_(std::make_unique<jinja::Template>(source, where)),
      bos_(std::move(bos_token)),
      eos_(std::move(eos_token)) {}

ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::from_file(const std::string& path, std::string bos_token,
                                                      std::string eos_token) {
  return std::make_unique<ChatTemplate>(read_text(path), path, std::move(bos_token), std::move(eos_token));
}

std::unique_ptr<ChatTemplate> ChatTemplate::from_model_dir(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path cfg_path = fs::path(model_dir) / "tokenizer_config.json";
  nlohmann::json cfg = nlohmann::json::object();
  if (fs::exists(cfg_path)) {
    try {
      cfg = nlohmann::json::parse(read_text(cfg_path.string()));
    } catch (const nlohmann::json::exception& e) {
      MS_THROW("{}: not valid JSON: {}", cfg_path.string(), e.what());
    }
  }
  std::string bos = token_text(cfg, "bos_token"), eos = token_text(cfg, "eos_token");
  fs::path jinja_path = fs::path(model_dir) / "chat_template.jinja";
  if (fs::exists(jinja_path)) return from_file(jinja_path.string(), bos, eos);
  MS_CHECK(cfg.contains("chat_template"), "{}: no chat_template (and no chat_template.jinja)",
           cfg_path.string());
  const auto& ct = cfg.at("chat_template");
  if (ct.is_string())
    return std::make_unique<ChatTemplate>(ct.get<std::string>(), cfg_path.string() + ": chat_template", bos,
                                          eos);
  MS_CHECK(ct.is_array(), "{}: chat_template is neither a string nor a list", cfg_path.string());
  for (const auto& e : ct)
    if (e.value("name", std::string()) == "default")
      return std::make_unique<ChatTemplate>(e.at("template").get<std::string>(),
                                            cfg_path.string() + ": chat_template[default]", bos, eos);
  MS_THROW("{}: chat_template list has no \"default\" entry", cfg_path.string());
}

std::string ChatTemplate::render(const ChatInputs& in) const {
  using jinja::Value;
  Value ctx = Value::make_dict();
  ctx.set("messages", Value::from_json(in.messages));
  ctx.set("tools", Value::from_json(in.tools));
  ctx.set("add_generation_prompt", Value::boolean(in.add_generation_prompt));
  if (!bos_.empty()) ctx.set("bos_token", Value::str(bos_));
  if (!eos_.empty()) ctx.set("eos_token", Value::str(eos_));
  MS_CHECK(in.extra.is_object() || in.extra.is_null(), "chat template kwargs must be an object");
  if (in.extra.is_object())
    for (auto it = in.extra.begin(); it != in.extra.end(); ++it)
      ctx.set(it.key(), Value::from_json(it.value()));
  return tmpl_->render(ctx);
}

}  // namespace ms::tokenizer
