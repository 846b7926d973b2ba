// Evaluation of parsed templates: scopes, loops, macros, operators, filters, tests and methods.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/utf8.h"

namespace ms::tokenizer::jinja {

namespace {

const std::set<std::string>& filter_names() {
  static const std::set<std::string> s = {
      "trim",    "length",    "count",      "tojson",   "string",     "default",    "d",    "items",
      "join",    "upper",     "lower",      "replace",  "selectattr", "rejectattr", "map",  "first",
      "last",    "list",      "capitalize", "title",    "safe",       "abs",        "int",  "float",
      "reverse", "select",    "reject",     "unique",   "min",        "max",        "sum",  "e",
      "escape",  "wordcount", "indent",     "dictsort", "sort",       "batch",      "round"};
  return s;
}
const std::set<std::string>& test_names() {
  static const std::set<std::string> s = {
      "defined",     "undefined", "none",     "string", "number", "integer",  "float", "boolean",
      "mapping",     "iterable",  "sequence", "true",   "false",  "callable", "even",  "odd",
      "divisibleby", "eq",        "equalto",  "ne",     "lower",  "upper",    "in",    "sameas"};
  return s;
}

struct BreakSignal {};
struct ContinueSignal {};

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t b = i;
    utf8_next(s, i);
    out.push_back(s.substr(b, i - b));
  }
  return out;
}

bool py_isspace(char32_t c) {
  return is_unicode_whitespace(c) || (c >= 0x1C && c <= 0x1F);
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cps = code_points(s);
  std::set<std::string> set;
  if (chars && chars->is_string())
    for (auto& c : code_points(chars->as_str())) set.insert(c);
  auto strip_it = [&](const std::string& c) {
    if (chars && chars->is_string()) return set.count(c) > 0;
    size_t i = 0;
    return py_isspace(utf8_next(c, i));
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

Value py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    auto cps = code_points(s);
    std::string cur;
    bool in_word = false;
    int64_t splits = 0;
    for (size_t k = 0; k < cps.size(); ++k) {
      size_t i = 0;
      bool ws = py_isspace(utf8_next(cps[k], i));
      if (ws && in_word && (maxsplit < 0 || splits < maxsplit)) {
        out.push_back(Value::str(cur));
        cur.clear();
        in_word = false;
        ++splits;
      } else if (!ws || in_word) {
        if (!in_word && !ws) in_word = true;
        if (in_word) cur += cps[k];
      }
    }
    if (in_word) {
      if (maxsplit >= 0 && splits >= maxsplit) cur = py_strip(cur, nullptr, false, true);
      out.push_back(Value::str(cur));
    }
    return Value::make_list(std::move(out));
  }
  const std::string& d = sep->as_str();
  MS_CHECK(!d.empty(), "split: empty separator");
  size_t pos = 0;
  int64_t splits = 0;
  for (;;) {
    size_t f = s.find(d, pos);
    if (f == std::string::npos || (maxsplit >= 0 && splits >= maxsplit)) break;
    out.push_back(Value::str(s.substr(pos, f - pos)));
    pos = f + d.size();
    ++splits;
  }
  out.push_back(Value::str(s.substr(pos)));
  return Value::make_list(std::move(out));
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String:
      return static_cast<int64_t>(code_points(*v.s).size());
    case Value::Kind::List:
      return static_cast<int64_t>(v.list->size());
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
      return static_cast<int64_t>(v.dict->size());
    default:
      MS_THROW("length of a value that has none ({})", v.to_output());
  }
}

// Items a for loop or filter iterates: list elements, dict keys, string characters.
List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::List:
      return *v.list;
    case Value::Kind::Dict: {
      List keys;
      for (auto& kv : *v.dict) keys.push_back(Value::str(kv.first));
      return keys;
    }
    case Value::Kind::String: {
      List out;
      for (auto& c : code_points(*v.s)) out.push_back(Value::str(c));
      return out;
    }
    case Value::Kind::Undefined:
      return {};
    default:
      MS_THROW("cannot iterate over {}", v.to_output());
  }
}

int compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string())
    return a.as_str().compare(b.as_str()) < 0 ? -1 : a.as_str() == b.as_str() ? 0 : 1;
  MS_THROW("cannot compare {} with {}", a.repr(), b.repr());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::String:
      MS_CHECK(item.is_string(), "'in <string>' requires a string on the left");
      return container.as_str().find(item.as_str()) != std::string::npos;
    case Value::Kind::List:
      for (const auto& v : *container.list)
        if (values_equal(v, item)) return true;
      return false;
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
      return item.is_string() && !container.get(item.as_str()).is_undefined();
    default:
      MS_THROW("'in' needs a string, list or dict on the right, not {}", container.repr());
  }
}

const Value* arg(std::vector<Value>& args, std::vector<std::pair<std::string, Value>>& kwargs, size_t pos,
                 const char* name) {
  if (pos < args.size()) return &args[pos];
  for (auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

class Renderer {
 public:
  explicit Renderer(const Value& context) {
    scopes_.emplace_back();
    if (context.dict)
      for (const auto& [k, v] : *context.dict) scopes_.back()[k] = v;
  }

  void render(const Body& body, std::string& out) {
    for (const auto& n : body) exec(*n, out);
  }

 private:
  using Scope = std::unordered_map<std::string, Value>;

  Value lookup(const std::string& name) {
    for (size_t k = scopes_.size(); k-- > 0;) {
      auto it = scopes_[k].find(name);
      if (it != scopes_[k].end()) return it->second;
    }
    return global(name);
  }

  Value make_fn(std::function<Value(std::vector<Value>&, std::vector<std::pair<std::string, Value>>&)> f) {
    Value v;
    v.kind = Value::Kind::Callable;
    v.fn = std::make_shared<Callable>(Callable{std::move(f)});
    return v;
  }

  Value global(const std::string& name) {
    if (name == "namespace")
      return make_fn([](auto& args, auto& kwargs) {
        Value ns = Value::make_dict({}, Value::Kind::Namespace);
        for (auto& a : args)
          if (a.is_mapping())
            for (auto& [k, v] : *a.dict) ns.set(k, v);
        for (auto& [k, v] : kwargs) ns.set(k, v);
        return ns;
      });
    if (name == "raise_exception")
      return make_fn([](auto& args, auto&) -> Value {
        MS_THROW("chat template raised an exception: {}", args.empty() ? std::string() : args[0].to_output());
      });
    if (name == "range")
      return make_fn([](auto& args, auto&) {
        MS_CHECK(!args.empty() && args.size() <= 3, "range() takes 1 to 3 arguments");
        int64_t start = 0, stop, step = 1;
        if (args.size() == 1)
          stop = args[0].i;
        else
          start = args[0].i, stop = args[1].i;
        if (args.size() == 3) step = args[2].i;
        MS_CHECK(step != 0, "range() step must not be zero");
        List l;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) l.push_back(Value::integer(k));
        return Value::make_list(std::move(l));
      });
    if (name == "dict")
      return make_fn([](auto&, auto& kwargs) {
        Value d = Value::make_dict();
        for (auto& [k, v] : kwargs) d.set(k, v);
        return d;
      });
    if (name == "strftime_now")
      return make_fn([](auto& args, auto&) {
        std::time_t t = std::time(nullptr);
        std::tm tm{};
        localtime_r(&t, &tm);
        char buf[256];
        std::string fmt_s = args.empty() ? "%Y-%m-%d" : args[0].to_output();
        size_t n = std::strftime(buf, sizeof(buf), fmt_s.c_str(), &tm);
        return Value::str(std::string(buf, n));
      });
    return Value();
  }

  void exec(const Node& n, std::string& out) {
    switch (n.type) {
      case Node::Type::Text:
        out += n.text;
        return;
      case Node::Type::Output:
        out += eval(*n.expr).to_output();
        return;
      case Node::Type::If:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond).truthy()) {
            render(body, out);
            return;
          }
        render(n.else_body, out);
        return;
      case Node::Type::For:
        exec_for(n, out);
        return;
      case Node::Type::Set: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value ns = lookup(n.text);
          MS_CHECK(ns.kind == Value::Kind::Namespace,
                   "cannot set attribute '{}' of '{}', which is not a namespace", n.attr, n.text);
          ns.set(n.attr, v);
        } else if (n.targets.size() == 1) {
          scopes_.back()[n.text] = v;
        } else {
          List items = iterate(v);
          MS_CHECK(items.size() == n.targets.size(), "set: cannot unpack {} values into {} names",
                   items.size(), n.targets.size());
          for (size_t k = 0; k < items.size(); ++k) scopes_.back()[n.targets[k]] = items[k];
        }
        return;
      }
      case Node::Type::SetBlock: {
        std::string s;
        render(n.body, s);
        scopes_.back()[n.text] = Value::str(s);
        return;
      }
      case Node::Type::Macro: {
        const Node* node = &n;
        scopes_.back()[n.text] = make_fn([this, node](auto& args, auto& kwargs) {
          Scope frame;
          for (size_t k = 0; k < node->targets.size(); ++k) {
            const std::string& p = node->targets[k];
            if (k < args.size())
              frame[p] = args[k];
            else if (node->defaults[k])
              frame[p] = eval(*node->defaults[k]);
            else
              frame[p] = Value();
          }
          for (auto& [k, v] : kwargs) frame[k] = v;
          // A macro sees the template's top-level names and its own parameters.
          std::vector<Scope> saved;
          saved.swap(scopes_);
          scopes_.push_back(saved.front());
          scopes_.push_back(std::move(frame));
          std::string s;
          try {
            render(node->body, s);
          } catch (...) {
            scopes_.swap(saved);
            throw;
          }
          scopes_.swap(saved);
          return Value::str(s);
        });
        return;
      }
      case Node::Type::Break:
        throw BreakSignal{};
      case Node::Type::Continue:
        throw ContinueSignal{};
      case Node::Type::Block:
        render(n.body, out);
        return;
    }
  }

  void exec_for(const Node& n, std::string& out) {
    List items = iterate(eval(*n.expr));
    auto bind = [&](Scope& s, const Value& item) {
      if (n.targets.size() == 1) {
        s[n.targets[0]] = item;
        return;
      }
      List parts = iterate(item);
      MS_CHECK(parts.size() == n.targets.size(), "for: cannot unpack {} values into {} names", parts.size(),
               n.targets.size());
      for (size_t k = 0; k < parts.size(); ++k) s[n.targets[k]] = parts[k];
    };
    if (n.cond) {
      List kept;
      for (const auto& it : items) {
        scopes_.emplace_back();
        bind(scopes_.back(), it);
        bool keep = eval(*n.cond).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(it);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      render(n.else_body, out);
      return;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    scopes_.emplace_back();
    try {
      for (int64_t k = 0; k < len; ++k) {
        Scope& s = scopes_.back();
        s.clear();
        bind(s, items[k]);
        Value loop = Value::make_dict();
        loop.set("index", Value::integer(k + 1));
        loop.set("index0", Value::integer(k));
        loop.set("revindex", Value::integer(len - k));
        loop.set("revindex0", Value::integer(len - k - 1));
        loop.set("first", Value::boolean(k == 0));
        loop.set("last", Value::boolean(k == len - 1));
        loop.set("length", Value::integer(len));
        loop.set("previtem", k > 0 ? items[k - 1] : Value());
        loop.set("nextitem", k + 1 < len ? items[k + 1] : Value());
        s["loop"] = loop;
        try {
          render(n.body, out);
        } catch (const ContinueSignal&) {
        }
      }
    } catch (const BreakSignal&) {
    } catch (...) {
      scopes_.pop_back();
      throw;
    }
    scopes_.pop_back();
  }

  Value eval(const Expr& e) {
    switch (e.type) {
      case Expr::Type::Literal:
        return e.lit;
      case Expr::Type::Name:
        return lookup(e.name);
      case Expr::Type::Attr: {
        Value base = eval(*e.kids[0]);
        if (base.is_mapping()) {
          Value v = base.get(e.name);
          if (!v.is_undefined() || base.kind == Value::Kind::Namespace) return v;
        }
        return method(base, e.name);
      }
      case Expr::Type::Item: {
        Value base = eval(*e.kids[0]);
        Value key = eval(*e.kids[1]);
        if (base.is_mapping()) {
          if (key.is_string()) return base.get(key.as_str());
          return Value();
        }
        if (base.kind == Value::Kind::List || base.is_string()) {
          MS_CHECK(key.kind == Value::Kind::Int, "list index must be an integer, not {}", key.repr());
          if (base.is_string()) {
            auto cps = code_points(base.as_str());
            int64_t i = key.i < 0 ? key.i + static_cast<int64_t>(cps.size()) : key.i;
            MS_CHECK(i >= 0 && i < static_cast<int64_t>(cps.size()), "string index {} out of range", key.i);
            return Value::str(cps[i]);
          }
          int64_t i = key.i < 0 ? key.i + static_cast<int64_t>(base.list->size()) : key.i;
          MS_CHECK(i >= 0 && i < static_cast<int64_t>(base.list->size()), "list index {} out of range",
                   key.i);
          return (*base.list)[i];
        }
        return Value();
      }
      case Expr::Type::Slice:
        return slice(e);
      case Expr::Type::Call: {
        std::vector<Value> args;
        std::vector<std::pair<std::string, Value>> kwargs;
        for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k]));
        for (auto& [name, ex] : e.kwargs) kwargs.emplace_back(name, eval(*ex));
        Value f = eval(*e.kids[0]);
        if (f.kind != Value::Kind::Callable) {
          std::string what = e.kids[0]->type == Expr::Type::Name || e.kids[0]->type == Expr::Type::Attr
                                 ? e.kids[0]->name
                                 : std::string("expression");
          MS_THROW("'{}' is not callable", what);
        }
        return f.fn->call(args, kwargs);
      }
      case Expr::Type::Filter: {
        std::vector<Value> args;
        std::vector<std::pair<std::string, Value>> kwargs;
        for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k]));
        for (auto& [name, ex] : e.kwargs) kwargs.emplace_back(name, eval(*ex));
        return filter(e.name, eval(*e.kids[0]), args, kwargs);
      }
      case Expr::Type::Test: {
        std::vector<Value> args;
        for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k]));
        bool r = test(e.name, eval(*e.kids[0]), args);
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::Type::Unary: {
        Value v = eval(*e.kids[0]);
        if (e.name == "not") return Value::boolean(!v.truthy());
        MS_CHECK(v.is_number(), "unary '{}' on a non-number {}", e.name, v.repr());
        if (e.name == "+") return v;
        return v.kind == Value::Kind::Float ? Value::number(-v.f)
                                            : Value::integer(-(v.kind == Value::Kind::Bool ? v.b : v.i));
      }
      case Expr::Type::Binary:
        return binary(e);
      case Expr::Type::Cond:
        if (eval(*e.kids[0]).truthy()) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : Value();
      case Expr::Type::ListLit: {
        List l;
        for (const auto& k : e.kids) l.push_back(eval(*k));
        return Value::make_list(std::move(l));
      }
      case Expr::Type::DictLit: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          Value key = eval(*e.kids[k]);
          MS_CHECK(key.is_string(), "dict literal keys must be strings");
          d.set(key.as_str(), eval(*e.kids[k + 1]));
        }
        return d;
      }
    }
    return Value();
  }

  Value slice(const Expr& e) {
    Value base = eval(*e.kids[0]);
    auto opt = [&](int k) -> std::optional<int64_t> {
      if (!e.kids[k]) return std::nullopt;
      Value v = eval(*e.kids[k]);
      if (v.is_none()) return std::nullopt;
      MS_CHECK(v.kind == Value::Kind::Int, "slice indices must be integers");
      return v.i;
    };
    auto start = opt(1), stop = opt(2), step_o = opt(3);
    int64_t step = step_o.value_or(1);
    MS_CHECK(step != 0, "slice step cannot be zero");
    std::vector<Value> items;
    bool is_str = base.is_string();
    if (is_str)
      for (auto& c : code_points(base.as_str())) items.push_back(Value::str(c));
    else if (base.kind == Value::Kind::List)
      items = *base.list;
    else
      MS_THROW("cannot slice {}", base.repr());
    int64_t n = static_cast<int64_t>(items.size());
    auto norm = [&](std::optional<int64_t> v, int64_t def, int64_t lo, int64_t hi) {
      if (!v) return def;
      int64_t x = *v < 0 ? *v + n : *v;
      return std::clamp(x, lo, hi);
    };
    List out;
    if (step > 0) {
      int64_t b = norm(start, 0, 0, n), en = norm(stop, n, 0, n);
      for (int64_t k = b; k < en; k += step) out.push_back(items[k]);
    } else {
      int64_t b = norm(start, n - 1, -1, n - 1), en = norm(stop, -1, -1, n - 1);
      for (int64_t k = b; k > en; k += step) out.push_back(items[k]);
    }
    if (!is_str) return Value::make_list(std::move(out));
    std::string s;
    for (auto& v : out) s += v.as_str();
    return Value::str(s);
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.kids[0]);
      return a.truthy() ? eval(*e.kids[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.kids[0]);
      return a.truthy() ? a : eval(*e.kids[1]);
    }
    Value a = eval(*e.kids[0]), b = eval(*e.kids[1]);
    if (op == "==") return Value::boolean(values_equal(a, b));
    if (op == "!=") return Value::boolean(!values_equal(a, b));
    if (op == "<") return Value::boolean(compare_values(a, b) < 0);
    if (op == ">") return Value::boolean(compare_values(a, b) > 0);
    if (op == "<=") return Value::boolean(compare_values(a, b) <= 0);
    if (op == ">=") return Value::boolean(compare_values(a, b) >= 0);
    if (op == "in") return Value::boolean(contains(b, a));
    if (op == "not in") return Value::boolean(!contains(b, a));
    if (op == "~") return Value::str(a.to_output() + b.to_output());
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::str(a.as_str() + b.as_str());
      if (a.kind == Value::Kind::List && b.kind == Value::Kind::List) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*" && a.is_string() && b.kind == Value::Kind::Int) {
      std::string s;
      for (int64_t k = 0; k < b.i; ++k) s += a.as_str();
      return Value::str(s);
    }
    MS_CHECK(a.is_number() && b.is_number(), "unsupported operand types for {}: {} and {}", op,
             a.is_undefined() ? "undefined" : a.repr(), b.is_undefined() ? "undefined" : b.repr());
    bool ints = a.kind != Value::Kind::Float && b.kind != Value::Kind::Float;
    int64_t x = a.kind == Value::Kind::Bool ? a.b : a.i, y = b.kind == Value::Kind::Bool ? b.b : b.i;
    double fx = a.as_double(), fy = b.as_double();
    if (op == "+") return ints ? Value::integer(x + y) : Value::number(fx + fy);
    if (op == "-") return ints ? Value::integer(x - y) : Value::number(fx - fy);
    if (op == "*") return ints ? Value::integer(x * y) : Value::number(fx * fy);
    if (op == "/") {
      MS_CHECK(fy != 0, "division by zero");
      return Value::number(fx / fy);
    }
    if (op == "//") {
      MS_CHECK(fy != 0, "division by zero");
      if (ints) return Value::integer(static_cast<int64_t>(std::floor(static_cast<double>(x) / y)));
      return Value::number(std::floor(fx / fy));
    }
    if (op == "%") {
      MS_CHECK(fy != 0, "modulo by zero");
      if (ints) return Value::integer(((x % y) + y) % y);
      return Value::number(fx - fy * std::floor(fx / fy));
    }
    if (op == "**")
      return ints && y >= 0 ? Value::integer(static_cast<int64_t>(std::pow(x, y)))
                            : Value::number(std::pow(fx, fy));
    MS_THROW("unsupported operator '{}'", op);
  }

  Value method(const Value& base, const std::string& name) {
    Value self = base;
    auto f = [&](auto body) { return make_fn(body); };
    if (base.is_string()) {
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return f([self, name](auto& args, auto&) {
          const Value* chars = args.empty() || args[0].is_none() ? nullptr : &args[0];
          return Value::str(py_strip(self.as_str(), chars, name != "rstrip", name != "lstrip"));
        });
      if (name == "split")
        return f([self](auto& args, auto& kwargs) {
          const Value* sep = arg(args, kwargs, 0, "sep");
          const Value* maxs = arg(args, kwargs, 1, "maxsplit");
          return py_split(self.as_str(), sep, maxs ? maxs->i : -1);
        });
      if (name == "startswith" || name == "endswith")
        return f([self, name](auto& args, auto&) {
          MS_CHECK(!args.empty(), "{}() needs an argument", name);
          List cands = args[0].kind == Value::Kind::List ? *args[0].list : List{args[0]};
          const std::string& s = self.as_str();
          for (const auto& c : cands) {
            const std::string& p = c.as_str();
            bool hit = name == "startswith"
                           ? s.compare(0, p.size(), p) == 0
                           : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
            if (hit) return Value::boolean(true);
          }
          return Value::boolean(false);
        });
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
        return f([this, self, name](auto&, auto&) {
          std::vector<Value> a;
          std::vector<std::pair<std::string, Value>> k;
          return filter(name, self, a, k);
        });
      if (name == "replace")
        return f([this, self](auto& args, auto& kwargs) { return filter("replace", self, args, kwargs); });
      if (name == "find")
        return f([self](auto& args, auto&) {
          size_t p = self.as_str().find(args.at(0).as_str());
          return Value::integer(p == std::string::npos
                                    ? -1
                                    : static_cast<int64_t>(code_points(self.as_str().substr(0, p)).size()));
        });
      if (name == "count")
        return f([self](auto& args, auto&) {
          const std::string& s = self.as_str();
          const std::string& sub = args.at(0).as_str();
          int64_t n = 0;
          if (sub.empty()) return Value::integer(length_of(self) + 1);
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
          return Value::integer(n);
        });
      if (name == "join")
        return f([self](auto& args, auto&) {
          std::string out;
          List items = iterate(args.at(0));
          for (size_t k = 0; k < items.size(); ++k) out += (k ? self.as_str() : "") + items[k].to_output();
          return Value::str(out);
        });
    }
    if (base.kind == Value::Kind::Dict) {
      if (name == "items")
        return f([self](auto&, auto&) {
          List l;
          for (auto& [k, v] : *self.dict) l.push_back(Value::make_list({Value::str(k), v}));
          return Value::make_list(std::move(l));
        });
      if (name == "keys" || name == "values")
        return f([self, name](auto&, auto&) {
          List l;
          for (auto& [k, v] : *self.dict) l.push_back(name == "keys" ? Value::str(k) : v);
          return Value::make_list(std::move(l));
        });
      if (name == "get")
        return f([self](auto& args, auto&) {
          Value v = self.get(args.at(0).to_output());
          return v.is_undefined() ? (args.size() > 1 ? args[1] : Value::none()) : v;
        });
    }
    return Value();
  }

  Value filter(const std::string& name, const Value& v, std::vector<Value>& args,
               std::vector<std::pair<std::string, Value>>& kwargs) {
    if (name == "trim")
      return Value::str(py_strip(v.to_output(), args.empty() ? nullptr : &args[0], true, true));
    if (name == "length" || name == "count") return Value::integer(length_of(v));
    if (name == "tojson") {
      const Value* ea = arg(args, kwargs, 99, "ensure_ascii");
      const Value* ind = arg(args, kwargs, 0, "indent");
      const Value* seps = arg(args, kwargs, 99, "separators");
      const Value* sk = arg(args, kwargs, 99, "sort_keys");
      int indent = ind && ind->kind == Value::Kind::Int ? static_cast<int>(ind->i) : -1;
      std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
      if (seps && seps->kind == Value::Kind::List && seps->list->size() == 2) {
        isep = (*seps->list)[0].as_str();
        ksep = (*seps->list)[1].as_str();
      }
      MS_CHECK(!v.is_undefined(), "tojson of an undefined value");
      return Value::str(v.to_json(ea && ea->truthy(), indent, isep, ksep, sk && sk->truthy()));
    }
    if (name == "string") return Value::str(v.to_output());
    if (name == "default" || name == "d") {
      const Value* boolean = arg(args, kwargs, 1, "boolean");
      bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      return use_default ? (args.empty() ? Value::str("") : args[0]) : v;
    }
    if (name == "items") {
      MS_CHECK(v.is_mapping() || v.is_undefined(), "items filter on a non-mapping {}", v.repr());
      List l;
      if (v.dict)
        for (auto& [k, x] : *v.dict) l.push_back(Value::make_list({Value::str(k), x}));
      return Value::make_list(std::move(l));
    }
    if (name == "join") {
      const Value* sep = arg(args, kwargs, 0, "d");
      const Value* attr = arg(args, kwargs, 1, "attribute");
      std::string out;
      List items = iterate(v);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k && sep) out += sep->to_output();
        out += (attr ? items[k].get(attr->to_output()) : items[k]).to_output();
      }
      return Value::str(out);
    }
    if (name == "upper" || name == "lower") {
      std::string s = v.to_output();
      for (auto& c : s)
        c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                              : std::tolower(static_cast<unsigned char>(c)));
      return Value::str(s);
    }
    if (name == "capitalize" || name == "title") {
      std::string s = v.to_output();
      bool start = true;
      for (size_t k = 0; k < s.size(); ++k) {
        unsigned char c = static_cast<unsigned char>(s[k]);
        bool alpha = std::isalpha(c);
        if (name == "capitalize")
          s[k] = static_cast<char>(k == 0 ? std::toupper(c) : std::tolower(c));
        else
          s[k] = static_cast<char>(start && alpha ? std::toupper(c) : std::tolower(c));
        start = !alpha;
      }
      return Value::str(s);
    }
    if (name == "replace") {
      std::string s = v.to_output();
      const std::string from = args.at(0).to_output(), to = args.at(1).to_output();
      int64_t count = args.size() > 2 ? args[2].i : -1;
      std::string out;
      size_t pos = 0;
      if (from.empty()) return Value::str(s);
      for (int64_t n = 0; count < 0 || n < count; ++n) {
        size_t f = s.find(from, pos);
        if (f == std::string::npos) break;
        out += s.substr(pos, f - pos) + to;
        pos = f + from.size();
      }
      return Value::str(out + s.substr(pos));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      bool attr_mode = name == "selectattr" || name == "rejectattr";
      bool want = name == "selectattr" || name == "select";
      size_t t = attr_mode ? 1 : 0;
      List out;
      for (const auto& item : iterate(v)) {
        Value subject = attr_mode ? item.get(args.at(0).to_output()) : item;
        bool r;
        if (args.size() > t) {
          std::vector<Value> targs(args.begin() + t + 1, args.end());
          r = test(args[t].to_output(), subject, targs);
        } else {
          r = subject.truthy();
        }
        if (r == want) out.push_back(item);
      }
      return Value::make_list(std::move(out));
    }
    if (name == "map") {
      const Value* attr = arg(args, kwargs, 99, "attribute");
      List out;
      for (const auto& item : iterate(v)) {
        if (attr) {
          out.push_back(item.get(attr->to_output()));
        } else {
          MS_CHECK(!args.empty(), "map needs a filter name or attribute=");
          std::vector<Value> rest(args.begin() + 1, args.end());
          std::vector<std::pair<std::string, Value>> nokw;
          out.push_back(filter(args[0].to_output(), item, rest, nokw));
        }
      }
      return Value::make_list(std::move(out));
    }
    if (name == "first" || name == "last") {
      List items = iterate(v);
      if (items.empty()) return Value();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::make_list(iterate(v));
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.as_str());
        std::string s;
        for (size_t k = cps.size(); k-- > 0;) s += cps[k];
        return Value::str(s);
      }
      List items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::make_list(std::move(items));
    }
    if (name == "unique") {
      List out;
      for (const auto& item : iterate(v))
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return values_equal(o, item); }))
          out.push_back(item);
      return Value::make_list(std::move(out));
    }
    if (name == "min" || name == "max") {
      List items = iterate(v);
      if (items.empty()) return Value();
      Value best = items[0];
      for (const auto& x : items)
        if ((name == "min") == (compare_values(x, best) < 0) && compare_values(x, best) != 0) best = x;
      return best;
    }
    if (name == "sum") {
      Value acc = Value::integer(0);
      for (const auto& x : iterate(v)) {
        MS_CHECK(x.is_number(), "sum of a non-number");
        acc = acc.kind == Value::Kind::Float || x.kind == Value::Kind::Float
                  ? Value::number(acc.as_double() + x.as_double())
                  : Value::integer(acc.i + x.i);
      }
      return acc;
    }
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : v.to_output()) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::str(out);
    }
    if (name == "abs")
      return v.kind == Value::Kind::Float ? Value::number(std::fabs(v.f)) : Value::integer(std::llabs(v.i));
    if (name == "int") {
      if (v.is_string()) {
        try {
          return Value::integer(std::stoll(v.as_str()));
        } catch (...) {
          return Value::integer(0);
        }
      }
      return Value::integer(v.is_number() ? static_cast<int64_t>(v.as_double()) : 0);
    }
    if (name == "float") {
      if (v.is_string()) {
        try {
          return Value::number(std::stod(v.as_str()));
        } catch (...) {
          return Value::number(0);
        }
      }
      return Value::number(v.is_number() ? v.as_double() : 0);
    }
    if (name == "round") {
      int64_t prec = args.empty() ? 0 : args[0].i;
      double m = std::pow(10.0, static_cast<double>(prec));
      return Value::number(std::nearbyint(v.as_double() * m) / m);
    }
    if (name == "wordcount")
      return Value::integer(static_cast<int64_t>(py_split(v.to_output(), nullptr, -1).list->size()));
    if (name == "indent") {
      int64_t width = args.empty() ? 4 : args[0].i;
      const Value* first = arg(args, kwargs, 1, "first");
      std::string pad(static_cast<size_t>(width), ' '), s = v.to_output(), out;
      for (size_t k = 0; k < s.size(); ++k) {
        out += s[k];
        if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') out += pad;
      }
      return Value::str((first && first->truthy() ? pad : "") + out);
    }
    if (name == "dictsort") {
      MS_CHECK(v.is_mapping(), "dictsort on a non-mapping");
      Dict d = *v.dict;
      std::stable_sort(d.begin(), d.end(), [](auto& a, auto& b) { return a.first < b.first; });
      List l;
      for (auto& [k, x] : d) l.push_back(Value::make_list({Value::str(k), x}));
      return Value::make_list(std::move(l));
    }
    if (name == "sort") {
      List items = iterate(v);
      const Value* attr = arg(args, kwargs, 99, "attribute");
      const Value* rev = arg(args, kwargs, 0, "reverse");
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return compare_values(attr ? a.get(attr->to_output()) : a, attr ? b.get(attr->to_output()) : b) < 0;
      });
      if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
      return Value::make_list(std::move(items));
    }
    if (name == "batch") {
      int64_t n = args.at(0).i;
      MS_CHECK(n > 0, "batch size must be positive");
      List out, cur;
      for (const auto& x : iterate(v)) {
        cur.push_back(x);
        if (static_cast<int64_t>(cur.size()) == n)
          out.push_back(Value::make_list(std::move(cur))), cur.clear();
      }
      if (!cur.empty()) out.push_back(Value::make_list(std::move(cur)));
      return Value::make_list(std::move(out));
    }
    MS_THROW("unsupported filter '{}'", name);
  }

  bool test(const std::string& name, const Value& v, std::vector<Value>& args) {
    using K = Value::Kind;
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.kind == K::Int || v.kind == K::Float;
    if (name == "integer") return v.kind == K::Int;
    if (name == "float") return v.kind == K::Float;
    if (name == "boolean") return v.kind == K::Bool;
    if (name == "mapping") return v.is_mapping();
    if (name == "iterable") return v.kind == K::List || v.is_string() || v.kind == K::Dict;
    if (name == "sequence") return v.kind == K::List || v.is_string() || v.kind == K::Dict;
    if (name == "true") return v.kind == K::Bool && v.b;
    if (name == "false") return v.kind == K::Bool && !v.b;
    if (name == "callable") return v.kind == K::Callable;
    if (name == "even") return v.kind == K::Int && v.i % 2 == 0;
    if (name == "odd") return v.kind == K::Int && v.i % 2 != 0;
    if (name == "divisibleby") return v.kind == K::Int && args.at(0).i != 0 && v.i % args[0].i == 0;
    if (name == "eq" || name == "equalto" || name == "sameas") return values_equal(v, args.at(0));
    if (name == "ne") return !values_equal(v, args.at(0));
    if (name == "in") return contains(args.at(0), v);
    if (name == "lower" || name == "upper") {
      if (!v.is_string()) return false;
      for (char c : v.as_str())
        if (name == "lower" ? std::isupper(static_cast<unsigned char>(c))
                            : std::islower(static_cast<unsigned char>(c)))
          return false;
      return true;
    }
    MS_THROW("unsupported test '{}'", name);
  }

  std::vector<Scope> scopes_;
};

}  // namespace

bool is_known_filter(const std::string& name) {
  return filter_names().count(name) > 0;
}
bool is_known_test(const std::string& name) {
  return test_names().count(name) > 0;
}

std::string Template::render(const Value& context) const {
  Renderer r(context);
  std::string out;
  try {
    r.render(root_, out);
  } catch (const BreakSignal&) {
    MS_THROW("{}: 'break' outside a loop", where_);
  } catch (const ContinueSignal&) {
    MS_THROW("{}: 'continue' outside a loop", where_);
  } catch (const ms::Error& e) {
    MS_THROW("{}: {}", where_, e.message());
  }
  return out;
}

}  // namespace ms::tokenizer::jinja
