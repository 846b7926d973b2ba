#include "server/tool_call_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace ms::server {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kGlmOpen = "<tool_call>";
constexpr std::string_view kGlmClose = "</tool_call>";
constexpr std::string_view kGlmKeyOpen = "<arg_key>";
constexpr std::string_view kGlmKeyClose = "</arg_key>";
constexpr std::string_view kGlmValueOpen = "<arg_value>";
constexpr std::string_view kGlmValueClose = "</arg_value>";

constexpr std::string_view kDsSectionOpen = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsSectionClose = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallOpen = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallClose = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string new_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

// The JSON types a property schema allows: "type" (a name or a list) and the members of anyOf / oneOf.
void schema_types(const ojson& schema, std::vector<std::string>& out) {
  if (!schema.is_object()) return;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) out.push_back(t->get<std::string>());
    if (t->is_array())
      for (const auto& x : *t)
        if (x.is_string()) out.push_back(x.get<std::string>());
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (auto a = schema.find(k); a != schema.end() && a->is_array())
      for (const auto& m : *a) schema_types(m, out);
  if (out.empty() && schema.contains("properties")) out.push_back("object");
}

bool has_type(const ojson& v, const std::string& t) {
  if (t == "string") return v.is_string();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double x = v.get<double>();
    return x == std::floor(x) && std::fabs(x) < 9.0e15;
  }
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "null") return v.is_null();
  return false;
}

}  // namespace

std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "glm" || name == "glm45") return ToolCallFormat::Glm;
  if (name == "deepseek_v3" || name == "deepseekv3") return ToolCallFormat::DeepSeekV3;
  return std::nullopt;
}

ojson glm_typed_value(const std::string& text, const ojson* schema) {
  std::vector<std::string> types;
  if (schema) schema_types(*schema, types);
  const bool want_string = std::find(types.begin(), types.end(), "string") != types.end();
  if (types.empty() || (want_string && types.size() == 1)) return text;
  std::string_view t = trim(text);
  ojson v;
  if (t == "True" || t == "False" || t == "None") {  // Python spellings a model may write
    v = t == "True" ? ojson(true) : t == "False" ? ojson(false) : ojson();
  } else {
    v = ojson::parse(t, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) return text;
  }
  for (const auto& ty : types) {
    if (ty == "string") continue;
    if (has_type(v, ty)) {
      if (ty == "integer" && v.is_number_float()) return static_cast<int64_t>(v.get<double>());
      return v;
    }
  }
  return text;  // not what the schema says: the client sees what the model wrote
}

ojson messages_for_template(ToolCallFormat format, const ojson& messages) {
  ojson out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    if (!m.is_object() || m.value("role", "") != "assistant") continue;
    auto tcs = m.find("tool_calls");
    if (tcs == m.end() || !tcs->is_array()) continue;
    for (auto& tc : *tcs) {
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
      auto& fn = tc["function"];
      if (auto a = fn.find("arguments"); a != fn.end() && a->is_string()) {
        ojson parsed = ojson::parse(a->get<std::string>(), nullptr, false);
        if (!parsed.is_discarded() && parsed.is_object()) *a = std::move(parsed);
      }
    }
    // An assistant turn of tool calls without text: GLM's template expects a content, DeepSeek-V3's adds it
    // before the calls (missing, it fails as in transformers; "" renders as its branch for null does).
    if (!m.contains("content") || m["content"].is_null()) m["content"] = "";
  }
  return out;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, ojson tools)
    : format_(format), tools_(std::move(tools)) {}

void ToolCallParser::emit_content(Delta& d, std::string_view text) {
  if (skip_space_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (!text.empty()) skip_space_ = false;
  }
  d.content.append(text);
}

void ToolCallParser::start_call(Delta& d, std::string name) {
  if (name.empty()) return;  // not yet (or not) a call
  named_ = true;
  args_count_ = 0;
  calls_.push_back({new_call_id(), std::move(name), ""});
  CallPiece p;
  p.index = static_cast<int>(calls_.size()) - 1;
  p.id = calls_.back().id;
  p.name = calls_.back().name;
  d.calls.push_back(std::move(p));
}

void ToolCallParser::add_arguments(Delta& d, const std::string& fragment) {
  calls_.back().arguments += fragment;
  const int index = static_cast<int>(calls_.size()) - 1;
  if (!d.calls.empty() && d.calls.back().index == index) {
    d.calls.back().arguments += fragment;
  } else {
    CallPiece p;
    p.index = index;
    p.arguments = fragment;
    d.calls.push_back(std::move(p));
  }
}

// Reads the complete <arg_key>K</arg_key><arg_value>V</arg_value> pairs of body_ from args_at_; at the end
// of the call (`final`) an unclosed last value runs to the end.
void ToolCallParser::glm_arguments(Delta& d, bool final) {
  const ojson* properties = nullptr;
  if (tools_.is_array())
    for (const auto& t : tools_)
      if (t.is_object() && t.contains("function") && t["function"].is_object() &&
          t["function"].value("name", "") == calls_.back().name) {
        const auto& fn = t["function"];
        if (auto ps = fn.find("parameters"); ps != fn.end() && ps->is_object())
          if (auto pr = ps->find("properties"); pr != ps->end() && pr->is_object()) properties = &*pr;
      }
  std::string_view body = body_;
  for (;;) {
    const size_t k0 = body.find(kGlmKeyOpen, args_at_);
    if (k0 == std::string_view::npos) return;
    const size_t k1 = body.find(kGlmKeyClose, k0);
    if (k1 == std::string_view::npos) return;
    const size_t v0 = body.find(kGlmValueOpen, k1);
    if (v0 == std::string_view::npos) return;
    size_t v1 = body.find(kGlmValueClose, v0);
    size_t next = v1 + kGlmValueClose.size();
    if (v1 == std::string_view::npos) {
      if (!final) return;
      v1 = next = body.size();
    }
    const std::string key(trim(body.substr(k0 + kGlmKeyOpen.size(), k1 - k0 - kGlmKeyOpen.size())));
    const std::string value(body.substr(v0 + kGlmValueOpen.size(), v1 - v0 - kGlmValueOpen.size()));
    const ojson* schema = properties && properties->contains(key) ? &(*properties)[key] : nullptr;
    add_arguments(d, fmt::format("{}{}:{}", args_count_ == 0 ? "{" : ",", dump(key),
                                 dump(glm_typed_value(value, schema))));
    ++args_count_;
    args_at_ = next;
  }
}

void ToolCallParser::end_call(Delta& d) {
  if (format_ == ToolCallFormat::Glm) {
    glm_arguments(d, true);
    add_arguments(d, args_count_ == 0 ? "{}" : "}");
  } else {
    std::string_view a = trim(std::string_view(body_).substr(std::min(args_at_, body_.size())));
    if (a.substr(0, 3) == "```") {  // ```json ... ```
      const size_t nl = a.find('\n');
      a.remove_prefix(nl == std::string_view::npos ? 3 : nl + 1);
      if (a.size() >= 3 && a.substr(a.size() - 3) == "```") a.remove_suffix(3);
      a = trim(a);
    }
    const ojson parsed = ojson::parse(a, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) {
      add_arguments(d, dump(parsed));
    } else {
      add_arguments(d, a.empty() ? std::string("{}") : std::string(a));
    }
  }
  named_ = false;
  body_.clear();
  args_at_ = 0;
}

void ToolCallParser::text_state(Delta& d, bool final) {
  std::vector<std::string_view> openers;
  if (format_ == ToolCallFormat::Glm) {
    openers = {kGlmOpen};
  } else {
    openers = {kDsSectionOpen, kDsCallOpen};
  }
  size_t at = std::string::npos;
  std::string_view which;
  for (auto o : openers) {
    const size_t p = held_.find(o);
    if (p < at) at = p, which = o;
  }
  if (at != std::string::npos) {
    emit_content(d, std::string_view(held_).substr(0, at));
    held_.erase(0, at + which.size());
    state_ = which == kDsSectionOpen ? State::Section : State::Call;
    body_.clear();
    named_ = false;
    args_at_ = 0;
    return;
  }
  size_t keep = 0;
  if (!final)
    for (auto o : openers) keep = std::max(keep, partial_suffix(held_, o));
  emit_content(d, std::string_view(held_).substr(0, held_.size() - keep));
  held_.erase(0, held_.size() - keep);
}

void ToolCallParser::section_state(Delta& d, bool final) {
  size_t ws = 0;
  while (ws < held_.size() && is_space(held_[ws])) ++ws;
  std::string_view rest = std::string_view(held_).substr(ws);
  for (auto tag : {kDsCallOpen, kDsSectionClose}) {
    if (rest.substr(0, tag.size()) == tag) {
      held_.erase(0, ws + tag.size());
      state_ = tag == kDsCallOpen ? State::Call : State::Text;
      skip_space_ = tag == kDsSectionClose;
      body_.clear();
      named_ = false;
      args_at_ = 0;
      return;
    }
    if (!final && rest.size() < tag.size() && tag.substr(0, rest.size()) == rest) return;  // undecided
  }
  state_ = State::Text;  // anything else after a call: ordinary text
  (void)d;
}

bool ToolCallParser::call_state(Delta& d, bool final) {
  body_ += held_;
  held_.clear();
  const std::string_view close_tag = format_ == ToolCallFormat::Glm ? kGlmClose : kDsCallClose;
  const size_t close = body_.find(close_tag);
  const bool complete = close != std::string::npos || final;
  if (close != std::string::npos) {  // the rest belongs after the call
    held_ = body_.substr(close + close_tag.size());
    body_.resize(close);
  }
  std::string_view body = body_;
  if (!named_) {
    if (format_ == ToolCallFormat::Glm) {
      size_t s = 0;
      while (s < body.size() && is_space(body[s])) ++s;
      size_t end = std::min(body.find('\n', s), body.find(kGlmKeyOpen, s));
      if (end == std::string_view::npos && complete) end = body.size();
      if (end != std::string_view::npos) {
        args_at_ = end;
        start_call(d, std::string(trim(body.substr(0, end))));
      }
    } else {
      const size_t sep = body.find(kDsSep);
      if (sep != std::string_view::npos) {
        const std::string_view before = trim(body.substr(0, sep));
        const size_t after = sep + kDsSep.size();
        if (before == "function") {
          size_t nl = body.find('\n', after);
          if (nl == std::string_view::npos && complete) nl = body.size();
          if (nl != std::string_view::npos) {
            args_at_ = std::min(nl + 1, body.size());
            start_call(d, std::string(trim(body.substr(after, nl - after))));
          }
        } else {
          args_at_ = after;
          start_call(d, std::string(before));
        }
      } else if (complete) {
        args_at_ = body.size();
        start_call(d, std::string(trim(body)));
      }
    }
  }
  if (named_ && format_ == ToolCallFormat::Glm) glm_arguments(d, false);
  if (!complete) return false;
  if (named_) {
    end_call(d);
  } else {  // no name: not a call after all
    const std::string_view open = format_ == ToolCallFormat::Glm ? kGlmOpen : kDsCallOpen;
    emit_content(d, std::string(open) + body_ + (close != std::string::npos ? std::string(close_tag) : ""));
    body_.clear();
    named_ = false;
  }
  state_ = format_ == ToolCallFormat::Glm ? State::Text : State::Section;
  skip_space_ = true;
  return true;
}

ToolCallParser::Delta ToolCallParser::feed(std::string_view text) {
  Delta d;
  held_.append(text);
  for (;;) {
    const State before = state_;
    const size_t held_before = held_.size();
    switch (state_) {
      case State::Text:
        text_state(d, false);
        break;
      case State::Section:
        section_state(d, false);
        break;
      case State::Call:
        if (!call_state(d, false)) return d;
        break;
    }
    if (state_ == before && held_.size() == held_before) return d;  // waits for more text
    if (held_.empty() && state_ != State::Call) return d;
  }
}

ToolCallParser::Delta ToolCallParser::finish() {
  Delta d;
  for (int guard = 0; guard < 64; ++guard) {
    switch (state_) {
      case State::Text:
        text_state(d, true);
        if (state_ == State::Text) return d;
        break;
      case State::Section:
        section_state(d, true);
        if (state_ == State::Section) {  // only an unfinished tag is left
          held_.clear();
          return d;
        }
        break;
      case State::Call:
        call_state(d, true);
        break;
    }
  }
  return d;
}

}  // namespace ms::server
