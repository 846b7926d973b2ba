#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <cmath>

namespace ms::server {
namespace {

using json = nlohmann::ordered_json;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_float:
      return "number";
    default:
      return "integer";
  }
}

[[noreturn]] void bad(const std::string& field, const std::string& message,
                      const char* code = "invalid_value") {
  throw ApiError(400, fmt::format("{}: {}", field, message), field, code);
}

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& v) {
  bad(field, fmt::format("expected {}, got {}", expected, type_name(v)), "invalid_type");
}

// Present and not null.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double get_number(const json& body, const char* name, double lo, double hi, double fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad(name, fmt::format("must be in [{}, {}], got {}", lo, hi, x));
  return x;
}

std::optional<int64_t> get_int(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::floor(d) != d) wrong_type(name, "an integer", *v);
  } else if (!v->is_number_integer()) {
    wrong_type(name, "an integer", *v);
  }
  const double d = v->get<double>();
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    bad(name, fmt::format("must be in [{}, {}], got {}", lo, hi, v->dump()));
  return v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
}

bool get_bool(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

std::vector<int32_t> token_list(const json& v, const std::string& name) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& t = v[i];
    if (!t.is_number_integer()) wrong_type(fmt::format("{}[{}]", name, i), "an integer token id", t);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id > INT32_MAX)
      bad(fmt::format("{}[{}]", name, i), fmt::format("token id {} out of range", id));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

void parse_messages(const json& body, CompletionParams& p) {
  const json* m = field(body, "messages");
  if (!m) bad("messages", "is required", "missing_required_parameter");
  if (!m->is_array()) wrong_type("messages", "an array", *m);
  if (m->empty()) bad("messages", "must not be empty");
  static const char* roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
  for (size_t i = 0; i < m->size(); ++i) {
    const auto& msg = (*m)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!msg.is_object()) wrong_type(at, "an object", msg);
    const json* role = field(msg, "role");
    if (!role) bad(at + ".role", "is required", "missing_required_parameter");
    if (!role->is_string()) wrong_type(at + ".role", "a string", *role);
    bool known = false;
    for (const char* r : roles) known |= *role == r;
    if (!known) bad(at + ".role", fmt::format("unknown role '{}'", role->get<std::string>()));
    const json* content = field(msg, "content");
    if (content && !content->is_string() && !content->is_array())
      wrong_type(at + ".content", "a string or an array of content parts", *content);
    if (content && content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const auto& part = (*content)[k];
        const std::string pat = fmt::format("{}.content[{}]", at, k);
        if (!part.is_object()) wrong_type(pat, "an object", part);
        if (part.value("type", "") != "text") bad(pat + ".type", "only text content parts are supported");
        if (!part.contains("text") || !part["text"].is_string()) bad(pat + ".text", "expected a string");
      }
    }
    if (!content && *role != "assistant") bad(at + ".content", "is required", "missing_required_parameter");
  }
  // A key whose value is null (the official client sends back an assistant tool call with "content": null)
  // reaches the template as absent, as transformers' apply_chat_template gives it: templates test for a
  // missing key, and some would print "None".
  p.messages = json::array();
  for (const auto& msg : *m) {
    json kept = json::object();
    for (auto it = msg.begin(); it != msg.end(); ++it)
      if (!it.value().is_null()) kept[it.key()] = it.value();
    p.messages.push_back(std::move(kept));
  }
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) wrong_type("chat_template_kwargs", "an object", *k);
    p.template_kwargs = *k;
    for (const char* name : {"enable_thinking", "thinking"}) {
      if (k->contains(name) && (*k)[name].is_boolean()) p.thinking = (*k)[name].get<bool>();
    }
  }
}

PromptInput one_prompt(const json& v, const std::string& name) {
  PromptInput in;
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().empty()) bad(name, "must not be empty");
    in.text = v.get<std::string>();
  } else if (v.is_array()) {
    if (v.empty()) bad(name, "must not be empty");
    in.ids = token_list(v, name);
  } else {
    wrong_type(name, "a string or an array of token ids", v);
  }
  return in;
}

// A string, an array of token ids, or a batch: an array of strings or of token id arrays.
void parse_prompt(const json& body, CompletionParams& p, const ProtocolLimits& limits) {
  const json* v = field(body, "prompt");
  if (!v) bad("prompt", "is required", "missing_required_parameter");
  if (v->is_array() && !v->empty() && (v->front().is_string() || v->front().is_array())) {
    if (static_cast<int>(v->size()) > limits.max_prompts)
      bad("prompt", fmt::format("at most {} prompts in one request, got {}", limits.max_prompts, v->size()));
    for (size_t i = 0; i < v->size(); ++i) {
      const json& one = (*v)[i];
      if (!one.is_string() && !one.is_array())
        wrong_type(fmt::format("prompt[{}]", i), "a string or an array of token ids", one);
      p.prompts.push_back(one_prompt(one, v->size() == 1 ? "prompt" : fmt::format("prompt[{}]", i)));
    }
  } else {
    if (!v->is_string() && !v->is_array()) wrong_type("prompt", "a string or an array of token ids", *v);
    p.prompts.push_back(one_prompt(*v, "prompt"));
  }
}

void parse_tool_choice(const json& body, CompletionParams& p) {
  const json* tc = field(body, "tool_choice");
  const bool has_tools = !p.tools.is_null() && !p.tools.empty();
  if (!tc) {
    p.tool_choice.mode = has_tools ? ToolChoice::Mode::Auto : ToolChoice::Mode::None;
    return;
  }
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "none") {
      p.tool_choice.mode = ToolChoice::Mode::None;
    } else if (s == "auto") {
      p.tool_choice.mode = has_tools ? ToolChoice::Mode::Auto : ToolChoice::Mode::None;
    } else if (s == "required") {
      if (!has_tools) bad("tool_choice", "'required' needs tools");
      p.tool_choice.mode = ToolChoice::Mode::Required;
    } else {
      bad("tool_choice", fmt::format("expected 'none', 'auto', 'required' or a named function, got '{}'", s));
    }
    return;
  }
  if (!tc->is_object()) wrong_type("tool_choice", "a string or an object", *tc);
  const json* fn = field(*tc, "function");
  if (tc->value("type", "") != "function" || !fn || !fn->is_object() || !fn->contains("name") ||
      !(*fn)["name"].is_string())
    bad("tool_choice", R"(expected {"type": "function", "function": {"name": ...}})");
  p.tool_choice.mode = ToolChoice::Mode::Named;
  p.tool_choice.name = (*fn)["name"].get<std::string>();
  bool found = false;
  if (has_tools)
    for (const auto& t : p.tools)
      found |= t.is_object() && t.contains("function") && t["function"].is_object() &&
               t["function"].value("name", "") == p.tool_choice.name;
  if (!found)
    bad("tool_choice", fmt::format("names function '{}', which is not among the tools", p.tool_choice.name));
}

void parse_tools(const json& body, CompletionParams& p) {
  const json* t = field(body, "tools");
  if (!t) return;
  if (!t->is_array()) wrong_type("tools", "an array", *t);
  for (size_t i = 0; i < t->size(); ++i) {
    const json& tool = (*t)[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!tool.is_object()) wrong_type(at, "an object", tool);
    if (tool.value("type", "function") != "function") bad(at + ".type", "only function tools are supported");
    const json* fn = field(tool, "function");
    if (!fn || !fn->is_object()) bad(at + ".function", "expected an object with a name");
    if (!fn->contains("name") || !(*fn)["name"].is_string() ||
        (*fn)["name"].get_ref<const std::string&>().empty())
      bad(at + ".function.name", "expected a non-empty string");
    if (const json* ps = field(*fn, "parameters"); ps && !ps->is_object())
      wrong_type(at + ".function.parameters", "a JSON schema object", *ps);
  }
  p.tools = *t;
}

// Fields of the OpenAI API this server does not implement: refused with their name, never ignored.
void refuse_unimplemented(const json& body, bool chat, int n) {
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object() || rf->value("type", "") != "text")
      bad("response_format", R"(only {"type": "text"} is supported (no JSON mode or schema-guided output))",
          "unsupported_value");
  }
  static const char* kNever[] = {"functions",          "function_call", "audio",        "prediction",
                                 "web_search_options", "guided_json",   "guided_regex", "guided_choice",
                                 "guided_grammar",     "suffix"};
  for (const char* name : kNever)
    if (field(body, name)) bad(name, "is not supported by this server", "unsupported_parameter");
  if (const json* m = field(body, "modalities")) {
    if (*m != json::array({"text"})) bad("modalities", R"(only ["text"] is supported)", "unsupported_value");
  }
  if (const json* b = field(body, "best_of")) {
    if (!b->is_number_integer() || b->get<int64_t>() != n)
      bad("best_of", "only best_of equal to n is supported", "unsupported_value");
  }
  if (chat) {
    if (const json* ptc = field(body, "parallel_tool_calls"); ptc && !ptc->is_boolean())
      wrong_type("parallel_tool_calls", "a boolean", *ptc);
  }
}

void parse_logit_bias(const json& body, runtime::SamplingParams& s) {
  const json* lb = field(body, "logit_bias");
  if (!lb) return;
  if (!lb->is_object()) wrong_type("logit_bias", "an object of token id -> bias", *lb);
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    size_t used = 0;
    try {
      id = std::stoll(key, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != key.size() || id < 0 || id > INT32_MAX)
      bad("logit_bias", fmt::format("key '{}' is not a token id", key));
    if (!it.value().is_number()) wrong_type(fmt::format("logit_bias.{}", key), "a number", it.value());
    const double b = it.value().get<double>();
    if (!std::isfinite(b) || b < -100.0 || b > 100.0)
      bad("logit_bias", fmt::format("the bias of token {} must be in [-100, 100], got {}", key, b));
    s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
}

}  // namespace

nlohmann::ordered_json parse_json_body(const std::string& text) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers too large for a double
    throw ApiError(400, fmt::format("request body is not valid JSON: {}", e.what()), "", "invalid_json");
  }
  if (!body.is_object()) throw ApiError(400, "request body must be a JSON object", "", "invalid_json");
  return body;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

CompletionParams parse_completion_request(const json& body, bool chat, const ProtocolLimits& limits) {
  CompletionParams p;
  p.chat = chat;
  const json* model = field(body, "model");
  if (!model) bad("model", "is required", "missing_required_parameter");
  if (!model->is_string()) wrong_type("model", "a string", *model);
  p.model = model->get<std::string>();
  if (chat) {
    parse_messages(body, p);
    parse_tools(body, p);
    parse_tool_choice(body, p);
  } else {
    parse_prompt(body, p, limits);
    if (field(body, "tools") || field(body, "tool_choice"))
      bad(field(body, "tools") ? "tools" : "tool_choice", "tools are for /v1/chat/completions");
  }

  auto max_tokens = get_int(body, "max_tokens", 1, INT32_MAX);
  if (chat) {
    if (auto mct = get_int(body, "max_completion_tokens", 1, INT32_MAX)) max_tokens = mct;
  }
  if (max_tokens) {
    p.max_tokens = static_cast<int>(*max_tokens);
  } else if (!chat) {
    p.max_tokens = 16;  // the completions API's default
  }

  auto& s = p.sampling;
  const io::GenerationDefaults& d = limits.sampling_defaults;
  s.temperature = static_cast<float>(get_number(body, "temperature", 0.0, 2.0, d.temperature));
  s.top_p = static_cast<float>(get_number(body, "top_p", 0.0, 1.0, d.top_p));
  if (const json* v = field(body, "top_p"); v && s.top_p <= 0.0f) bad("top_p", "must be in (0, 1], got 0");
  s.top_k = static_cast<int>(get_int(body, "top_k", -1, INT32_MAX).value_or(d.top_k));
  if (s.top_k < 0) s.top_k = 0;  // -1 means off, as in the tools users know
  s.min_p = static_cast<float>(get_number(body, "min_p", 0.0, 1.0, d.min_p));
  s.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", -2.0, 2.0, 0.0));
  s.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", -2.0, 2.0, 0.0));
  s.repetition_penalty =
      static_cast<float>(get_number(body, "repetition_penalty", 0.0, 2.0, d.repetition_penalty));
  if (field(body, "repetition_penalty") && s.repetition_penalty <= 0.0f)
    bad("repetition_penalty", "must be in (0, 2], got 0");
  if (auto seed = get_int(body, "seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*seed);

  parse_logit_bias(body, s);
  p.n = static_cast<int>(get_int(body, "n", 1, limits.max_n).value_or(1));
  refuse_unimplemented(body, chat, p.n);
  p.ignore_eos = get_bool(body, "ignore_eos", false);
  if (get_bool(body, "echo", false)) bad("echo", "echo is not supported");

  if (const json* st = field(body, "stop")) {
    if (st->is_string()) {
      p.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (static_cast<int>(st->size()) > limits.max_stop)
        bad("stop", fmt::format("at most {} stop strings, got {}", limits.max_stop, st->size()));
      for (size_t i = 0; i < st->size(); ++i) {
        if (!(*st)[i].is_string()) wrong_type(fmt::format("stop[{}]", i), "a string", (*st)[i]);
        p.stop.push_back((*st)[i].get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *st);
    }
    for (const auto& x : p.stop)
      if (x.empty()) bad("stop", "stop strings must not be empty");
  }
  if (const json* st = field(body, "stop_token_ids")) {
    if (!st->is_array()) wrong_type("stop_token_ids", "an array of token ids", *st);
    p.stop_token_ids = token_list(*st, "stop_token_ids");
  }

  const int max_top = limits.max_top_logprobs;
  if (chat) {
    p.logprobs = get_bool(body, "logprobs", false);
    auto top = get_int(body, "top_logprobs", 0, max_top);
    if (top && !p.logprobs) bad("top_logprobs", "requires logprobs to be true");
    s.top_logprobs = p.logprobs ? static_cast<int>(top.value_or(0)) : -1;
  } else {
    auto lp = get_int(body, "logprobs", 0, max_top);
    p.logprobs = lp.has_value();
    s.top_logprobs = lp ? static_cast<int>(*lp) : -1;
  }

  p.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (!p.stream) bad("stream_options", "only allowed when stream is true");
    p.include_usage = get_bool(*so, "include_usage", false);
  }
  return p;
}

}  // namespace ms::server
