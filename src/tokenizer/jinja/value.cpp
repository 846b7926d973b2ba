#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace ms::tokenizer::jinja {

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return make_dict(std::move(d));
    }
    default:
      return Value();
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b;
    case Kind::Int:
      return i != 0;
    case Kind::Float:
      return f != 0;
    case Kind::String:
      return !s->empty();
    case Kind::List:
      return !list->empty();
    case Kind::Dict:
      return !dict->empty();
    default:
      return true;
  }
}

Value Value::get(const std::string& key) const {
  if (!dict) return Value();
  for (const auto& [k, v] : *dict)
    if (k == key) return v;
  return Value();
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, old] : *dict)
    if (k == key) {
      old = std::move(v);
      return;
    }
  dict->emplace_back(key, std::move(v));
}

namespace {

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, res.ptr);
  // Python's repr: scientific when the exponent is < -4 or >= 16, otherwise positional with ".0".
  int exp10 = d == 0 ? 0 : static_cast<int>(std::floor(std::log10(std::fabs(d))));
  if (exp10 >= 16 || exp10 < -4) {
    auto res2 = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
    s.assign(buf, res2.ptr);
    auto e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    int ev = std::stoi(ex);
    return mant + (ev < 0 ? "e-" : "e+") + (std::abs(ev) < 10 ? "0" : "") + std::to_string(std::abs(ev));
  }
  auto res3 = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::fixed);
  s.assign(buf, res3.ptr);
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

std::string py_repr_str(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}

void json_str(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[16];
    if (c == '"')
      out += "\\\"", ++i;
    else if (c == '\\')
      out += "\\\\", ++i;
    else if (c == '\n')
      out += "\\n", ++i;
    else if (c == '\r')
      out += "\\r", ++i;
    else if (c == '\t')
      out += "\\t", ++i;
    else if (c == '\b')
      out += "\\b", ++i;
    else if (c == '\f')
      out += "\\f", ++i;
    else if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
      ++i;
    } else {
      char32_t cp = utf8_next(s, i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, bool ea, int indent, int depth, const std::string& isep,
               const std::string& ksep, bool sort_keys) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      out += "null";
      break;
    case Value::Kind::Bool:
      out += v.b ? "true" : "false";
      break;
    case Value::Kind::Int:
      out += std::to_string(v.i);
      break;
    case Value::Kind::Float:
      out += std::isfinite(v.f) ? py_float(v.f)
                                : (std::isnan(v.f) ? "NaN" : (v.f > 0 ? "Infinity" : "-Infinity"));
      break;
    case Value::Kind::String:
      json_str(out, *v.s, ea);
      break;
    case Value::Kind::List:
      if (v.list->empty()) {
        out += "[]";
        break;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += isep;
        newline(depth + 1);
        json_dump(out, (*v.list)[k], ea, indent, depth + 1, isep, ksep, sort_keys);
      }
      newline(depth);
      out += ']';
      break;
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      if (v.dict->empty()) {
        out += "{}";
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += isep;
        newline(depth + 1);
        json_str(out, items[k]->first, ea);
        out += ksep;
        json_dump(out, items[k]->second, ea, indent, depth + 1, isep, ksep, sort_keys);
      }
      newline(depth);
      out += '}';
      break;
    }
    case Value::Kind::Callable:
      MS_THROW("tojson: a macro or function is not JSON serializable");
  }
}

}  // namespace

std::string Value::repr() const {
  switch (kind) {
    case Kind::String:
      return py_repr_str(*s);
    default:
      return to_output();
  }
}

std::string Value::to_output() const {
  switch (kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return b ? "True" : "False";
    case Kind::Int:
      return std::to_string(i);
    case Kind::Float:
      return py_float(f);
    case Kind::String:
      return *s;
    case Kind::List: {
      std::string out = "[";
      for (size_t k = 0; k < list->size(); ++k) out += (k ? ", " : "") + (*list)[k].repr();
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = "{";
      for (size_t k = 0; k < dict->size(); ++k)
        out += (k ? ", " : "") + py_repr_str((*dict)[k].first) + ": " + (*dict)[k].second.repr();
      return out + "}";
    }
    case Kind::Namespace:
      return "<Namespace>";
    case Kind::Callable:
      return "<macro>";
  }
  return "";
}

std::string Value::to_json(bool ensure_ascii, int indent, const std::string& item_sep,
                           const std::string& key_sep, bool sort_keys) const {
  std::string out;
  json_dump(out, *this, ensure_ascii, indent, 0, item_sep, key_sep, sort_keys);
  return out;
}

bool values_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if ((a.kind == K::None || a.kind == K::Undefined) && (b.kind == K::None || b.kind == K::Undefined))
    return a.kind == b.kind;
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::String:
      return *a.s == *b.s;
    case K::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case K::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict)
        if (!values_equal(v, b.get(k))) return false;
      return true;
    default:
      return a.dict == b.dict && a.fn == b.fn;
  }
}

}  // namespace ms::tokenizer::jinja
