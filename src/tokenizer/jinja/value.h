// Values of the Jinja subset: Python-like none/undefined, bool, int, float, str, list, dict (insertion
// ordered), plus the namespace(), loop and macro objects templates use.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ms::tokenizer::jinja {

struct Value;
using List = std::vector<Value>;
// Insertion-ordered; small dicts make linear lookup fine.
using Dict = std::vector<std::pair<std::string, Value>>;
struct Callable;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<std::string> s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // Dict and Namespace (mutable attributes)
  std::shared_ptr<Callable> fn;

  static Value none() { return with(Kind::None); }
  static Value boolean(bool v) {
    Value x = with(Kind::Bool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = with(Kind::Int);
    x.i = v;
    return x;
  }
  static Value number(double v) {
    Value x = with(Kind::Float);
    x.f = v;
    return x;
  }
  static Value str(std::string v) {
    Value x = with(Kind::String);
    x.s = std::make_shared<std::string>(std::move(v));
    return x;
  }
  static Value make_list(List v = {}) {
    Value x = with(Kind::List);
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value make_dict(Dict v = {}, Kind k = Kind::Dict) {
    Value x = with(k);
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  bool truthy() const;
  double as_double() const {
    return kind == Kind::Float ? f : static_cast<double>(kind == Kind::Bool ? b : i);
  }
  const std::string& as_str() const { return *s; }

  // Attribute / key lookup (undefined when absent).
  Value get(const std::string& key) const;
  void set(const std::string& key, Value v);

  // str(x) as Python prints it into the template output.
  std::string to_output() const;
  // repr(x) as Python writes it inside str(list) / str(dict).
  std::string repr() const;
  // json.dumps(x, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter does.
  std::string to_json(bool ensure_ascii, int indent, const std::string& item_sep, const std::string& key_sep,
                      bool sort_keys) const;

 private:
  static Value with(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
};

bool values_equal(const Value& a, const Value& b);

struct Callable {
  // Positional args and keyword args.
  std::function<Value(std::vector<Value>&, std::vector<std::pair<std::string, Value>>&)> call;
};

}  // namespace ms::tokenizer::jinja
