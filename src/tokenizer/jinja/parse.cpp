// Lexing (tags, whitespace control with trim_blocks + lstrip_blocks) and parsing into ast.h trees.
#include <cctype>
#include <set>

#include "core/error.h"
#include "tokenizer/jinja/template.h"

namespace ms::tokenizer::jinja {

bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

namespace {

struct RawTag {
  enum Kind { Text, Var, Stmt } kind;
  std::string text;
  int line;
};

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::vector<RawTag> lex_tags(const std::string& src, const std::string& where) {
  std::vector<RawTag> out;
  size_t pos = 0;
  bool line_start = true;
  bool strip_next = false;  // previous tag ended with '-'
  auto line_of = [&](size_t p) {
    return 1 + static_cast<int>(std::count(src.begin(), src.begin() + p, '\n'));
  };
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(pos, (open == std::string::npos ? src.size() : open) - pos);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_ws(text[k])) ++k;
      text.erase(0, k);
    }
    if (open == std::string::npos) {
      // keep_trailing_newline is off: one trailing newline of the source is dropped.
      if (!text.empty() && text.back() == '\n') text.pop_back();
      if (!text.empty()) out.push_back({RawTag::Text, text, line_of(pos)});
      break;
    }
    char kind = src[open + 1];
    size_t body = open + 2;
    char lsign = body < src.size() ? src[body] : 0;
    if (lsign == '-') {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (lsign != '+' && kind != '{') {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if (l_pos > 0 || line_start) {
        bool all = l_pos < text.size();
        for (size_t k = l_pos; k < text.size(); ++k) all = all && (text[k] == ' ' || text[k] == '\t');
        if (all) text.erase(l_pos);
      }
    }
    if (lsign == '-' || lsign == '+') ++body;
    if (!text.empty()) out.push_back({RawTag::Text, text, line_of(pos)});
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t end = body;
    if (kind == '#') {
      end = src.find(close, body);
    } else {
      char quote = 0;
      for (; end + 1 < src.size(); ++end) {
        char c = src[end];
        if (quote) {
          if (c == '\\')
            ++end;
          else if (c == quote)
            quote = 0;
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == close[0] && src[end + 1] == close[1]) {
          break;
        }
      }
      if (end + 1 >= src.size()) end = std::string::npos;
    }
    MS_CHECK(end != std::string::npos, "{}: line {}: unclosed '{{{}' tag", where, line_of(open), kind);
    size_t content_end = end;
    char rsign = content_end > body ? src[content_end - 1] : 0;
    if (rsign == '-' || rsign == '+')
      --content_end;
    else
      rsign = 0;
    std::string content = src.substr(body, content_end - body);
    pos = end + 2;
    strip_next = rsign == '-';
    line_start = false;
    if (rsign == '-') {
      size_t k = pos;
      while (k < src.size() && is_ws(src[k])) ++k;
      line_start = k > pos && src[k - 1] == '\n';
      pos = k;
      strip_next = false;
    } else if (kind != '{' && rsign != '+' && pos < src.size() && src[pos] == '\n') {
      ++pos;  // trim_blocks
      line_start = true;
    }
    if (kind == '#') continue;
    out.push_back({kind == '{' ? RawTag::Var : RawTag::Stmt, content, line_of(open)});
  }
  return out;
}

struct Tok {
  enum Kind { Name, Str, Int, Float, Op, End } kind;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

std::vector<Tok> lex_expr(const std::string& s, const std::string& where) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (is_ws(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = i;
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      out.push_back({Tok::Name, s.substr(b, i - b)});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t b = i;
      bool is_float = false;
      while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      if (i + 1 < s.size() && s[i] == '.' && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        is_float = true;
        ++i;
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
      }
      std::string num = s.substr(b, i - b);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      Tok t{is_float ? Tok::Float : Tok::Int, num};
      if (is_float)
        t.f = std::stod(num);
      else
        t.i = std::stoll(num);
      out.push_back(t);
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      ++i;
      while (i < s.size() && s[i] != c) {
        if (s[i] == '\\' && i + 1 < s.size()) {
          char e = s[++i];
          switch (e) {
            case 'n':
              v += '\n';
              break;
            case 't':
              v += '\t';
              break;
            case 'r':
              v += '\r';
              break;
            case '\\':
              v += '\\';
              break;
            case '\'':
              v += '\'';
              break;
            case '"':
              v += '"';
              break;
            default:
              v += '\\';
              v += e;
          }
          ++i;
        } else {
          v += s[i++];
        }
      }
      MS_CHECK(i < s.size(), "{}: unterminated string literal in '{}'", where, s);
      ++i;
      out.push_back({Tok::Str, v});
      continue;
    }
    static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
    bool matched = false;
    for (const char* op : two)
      if (s.compare(i, 2, op) == 0) {
        out.push_back({Tok::Op, op});
        i += 2;
        matched = true;
        break;
      }
    if (matched) continue;
    if (std::string("+-*/%~<>=()[]{},.:|").find(c) != std::string::npos) {
      out.push_back({Tok::Op, std::string(1, c)});
      ++i;
      continue;
    }
    MS_THROW("{}: unexpected character '{}' in '{}'", where, c, s);
  }
  out.push_back({Tok::End, ""});
  return out;
}

ExprP mk(Expr::Type t) {
  auto e = std::make_shared<Expr>();
  e->type = t;
  return e;
}

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, std::string where) : t_(std::move(toks)), where_(std::move(where)) {}

  bool at_end() const { return t_[p_].kind == Tok::End; }
  bool is_op(const char* op) const { return t_[p_].kind == Tok::Op && t_[p_].s == op; }
  bool is_name(const char* n) const { return t_[p_].kind == Tok::Name && t_[p_].s == n; }
  const Tok& peek() const { return t_[p_]; }
  Tok next() { return t_[p_++]; }
  void expect_op(const char* op) {
    MS_CHECK(is_op(op), "{}: expected '{}' but found '{}'", where_, op, t_[p_].s);
    ++p_;
  }
  std::string expect_name() {
    MS_CHECK(t_[p_].kind == Tok::Name, "{}: expected a name but found '{}'", where_, t_[p_].s);
    return t_[p_++].s;
  }
  void expect_end() { MS_CHECK(at_end(), "{}: unexpected '{}' at the end of a tag", where_, t_[p_].s); }

  ExprP expr() {
    ExprP e = or_expr();
    if (is_name("if")) {
      ++p_;
      auto c = mk(Expr::Type::Cond);
      ExprP cond = or_expr();
      ExprP other = is_name("else") ? (++p_, expr()) : nullptr;
      c->kids = {cond, e, other};
      return c;
    }
    return e;
  }
  // Comma-separated expressions without brackets (for "set a, b = ..." and "for k, v in ...").
  ExprP or_expr() {
    ExprP l = and_expr();
    while (is_name("or")) {
      ++p_;
      l = bin("or", l, and_expr());
    }
    return l;
  }

 private:
  ExprP bin(const std::string& op, ExprP a, ExprP b) {
    auto e = mk(Expr::Type::Binary);
    e->name = op;
    e->kids = {std::move(a), std::move(b)};
    return e;
  }
  ExprP and_expr() {
    ExprP l = not_expr();
    while (is_name("and")) {
      ++p_;
      l = bin("and", l, not_expr());
    }
    return l;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      ++p_;
      auto e = mk(Expr::Type::Unary);
      e->name = "not";
      e->kids = {not_expr()};
      return e;
    }
    return compare();
  }
  ExprP compare() {
    ExprP l = math1();
    for (;;) {
      if (t_[p_].kind == Tok::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        std::string op = next().s;
        l = bin(op, l, math1());
      } else if (is_name("in")) {
        ++p_;
        l = bin("in", l, math1());
      } else if (is_name("not") && t_[p_ + 1].kind == Tok::Name && t_[p_ + 1].s == "in") {
        p_ += 2;
        l = bin("not in", l, math1());
      } else {
        return l;
      }
    }
  }
  ExprP math1() {
    ExprP l = concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().s;
      l = bin(op, l, concat());
    }
    return l;
  }
  ExprP concat() {
    ExprP l = math2();
    while (is_op("~")) {
      ++p_;
      l = bin("~", l, math2());
    }
    return l;
  }
  ExprP math2() {
    ExprP l = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().s;
      l = bin(op, l, power());
    }
    return l;
  }
  ExprP power() {
    ExprP l = unary();
    while (is_op("**")) {
      ++p_;
      l = bin("**", l, unary());
    }
    return l;
  }
  ExprP unary() {
    if (is_op("-") || is_op("+")) {
      auto e = mk(Expr::Type::Unary);
      e->name = next().s;
      e->kids = {unary()};
      return e;
    }
    return filters(postfix(primary()));
  }
  void call_args(const ExprP& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (t_[p_].kind == Tok::Name && t_[p_ + 1].kind == Tok::Op && t_[p_ + 1].s == "=") {
        std::string k = next().s;
        ++p_;
        e->kwargs.emplace_back(k, expr());
      } else {
        e->kids.push_back(expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }
  ExprP postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto a = mk(Expr::Type::Attr);
        a->name = expect_name();
        a->kids = {e};
        e = a;
      } else if (is_op("[")) {
        ++p_;
        ExprP parts[3] = {nullptr, nullptr, nullptr};
        bool slice = false;
        int k = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            slice = true;
            ++p_;
            ++k;
            MS_CHECK(k < 3, "{}: bad slice", where_);
            continue;
          }
          parts[k] = expr();
        }
        ++p_;
        auto s = mk(slice ? Expr::Type::Slice : Expr::Type::Item);
        s->kids =
            slice ? std::vector<ExprP>{e, parts[0], parts[1], parts[2]} : std::vector<ExprP>{e, parts[0]};
        MS_CHECK(slice || parts[0], "{}: empty subscript", where_);
        e = s;
      } else if (is_op("(")) {
        auto c = mk(Expr::Type::Call);
        c->kids = {e};
        call_args(c);
        e = c;
      } else {
        return e;
      }
    }
  }
  ExprP filters(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        auto f = mk(Expr::Type::Filter);
        f->name = expect_name();
        MS_CHECK(is_known_filter(f->name), "{}: unsupported filter '{}'", where_, f->name);
        f->kids = {e};
        if (is_op("(")) call_args(f);
        e = f;
      } else if (is_name("is")) {
        ++p_;
        auto t = mk(Expr::Type::Test);
        if (is_name("not")) {
          ++p_;
          t->negate = true;
        }
        t->name = expect_name();
        MS_CHECK(is_known_test(t->name), "{}: unsupported test 'is {}'", where_, t->name);
        t->kids = {e};
        if (is_op("("))
          call_args(t);
        else if (peek().kind == Tok::Str || peek().kind == Tok::Int || peek().kind == Tok::Float)
          t->kids.push_back(primary());
        e = t;
      } else {
        return e;
      }
    }
  }
  ExprP primary() {
    Tok t = next();
    if (t.kind == Tok::Str) {
      std::string s = t.s;
      while (peek().kind == Tok::Str) s += next().s;  // adjacent literals concatenate
      auto e = mk(Expr::Type::Literal);
      e->lit = Value::str(s);
      return e;
    }
    if (t.kind == Tok::Int || t.kind == Tok::Float) {
      auto e = mk(Expr::Type::Literal);
      e->lit = t.kind == Tok::Int ? Value::integer(t.i) : Value::number(t.f);
      return e;
    }
    if (t.kind == Tok::Name) {
      auto e = mk(Expr::Type::Literal);
      if (t.s == "true" || t.s == "True")
        e->lit = Value::boolean(true);
      else if (t.s == "false" || t.s == "False")
        e->lit = Value::boolean(false);
      else if (t.s == "none" || t.s == "None")
        e->lit = Value::none();
      else {
        e->type = Expr::Type::Name;
        e->name = t.s;
      }
      return e;
    }
    if (t.kind == Tok::Op && t.s == "(") {
      ExprP first = expr();
      if (is_op(")")) {
        ++p_;
        return first;
      }
      auto l = mk(Expr::Type::ListLit);  // a tuple behaves as a list here
      l->kids.push_back(first);
      while (is_op(",")) {
        ++p_;
        if (is_op(")")) break;
        l->kids.push_back(expr());
      }
      expect_op(")");
      return l;
    }
    if (t.kind == Tok::Op && t.s == "[") {
      auto l = mk(Expr::Type::ListLit);
      while (!is_op("]")) {
        l->kids.push_back(expr());
        if (!is_op("]")) expect_op(",");
      }
      ++p_;
      return l;
    }
    if (t.kind == Tok::Op && t.s == "{") {
      auto d = mk(Expr::Type::DictLit);
      while (!is_op("}")) {
        d->kids.push_back(expr());
        expect_op(":");
        d->kids.push_back(expr());
        if (!is_op("}")) expect_op(",");
      }
      ++p_;
      return d;
    }
    MS_THROW("{}: unexpected '{}' in an expression", where_, t.s);
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  std::string where_;
};

class StmtParser {
 public:
  StmtParser(std::vector<RawTag> tags, std::string where)
      : tags_(std::move(tags)), where_(std::move(where)) {}

  Body parse_all() {
    std::string stop;
    Body b = parse_body({}, stop);
    MS_CHECK(stop.empty(), "{}: unexpected '{{% {} %}}'", where_, stop);
    return b;
  }

 private:
  std::string loc(const RawTag& t) const { return fmt::format("{}: line {}", where_, t.line); }

  // Parses nodes until a statement whose keyword is in `stops`; that keyword is returned in `stop` and the
  // statement's parser is left positioned after its keyword.
  Body parse_body(const std::set<std::string>& stops, std::string& stop) {
    Body body;
    while (i_ < tags_.size()) {
      const RawTag& tag = tags_[i_++];
      if (tag.kind == RawTag::Text) {
        auto n = std::make_shared<Node>();
        n->type = Node::Type::Text;
        n->text = tag.text;
        body.push_back(n);
        continue;
      }
      ExprParser p(lex_expr(tag.text, loc(tag)), loc(tag));
      if (tag.kind == RawTag::Var) {
        auto n = std::make_shared<Node>();
        n->type = Node::Type::Output;
        n->expr = p.expr();
        p.expect_end();
        body.push_back(n);
        continue;
      }
      std::string kw = p.expect_name();
      if (stops.count(kw)) {
        stop = kw;
        cur_ = std::make_unique<ExprParser>(std::move(p));
        return body;
      }
      body.push_back(statement(kw, p, tag));
    }
    MS_CHECK(stops.empty(), "{}: missing '{{% {} %}}' before the end of the template", where_,
             *stops.rbegin());
    stop.clear();
    return body;
  }

  NodeP statement(const std::string& kw, ExprParser& p, const RawTag& tag) {
    auto n = std::make_shared<Node>();
    std::string stop;
    if (kw == "if") {
      n->type = Node::Type::If;
      ExprP cond = p.expr();
      p.expect_end();
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"}, stop);
        n->branches.emplace_back(cond, std::move(b));
        if (stop == "elif") {
          cond = cur_->expr();
          cur_->expect_end();
          continue;
        }
        if (stop == "else") {
          cur_->expect_end();
          n->else_body = parse_body({"endif"}, stop);
        }
        cur_->expect_end();
        return n;
      }
    }
    if (kw == "for") {
      n->type = Node::Type::For;
      n->targets.push_back(p.expect_name());
      while (p.is_op(",")) {
        p.next();
        n->targets.push_back(p.expect_name());
      }
      MS_CHECK(p.is_name("in"), "{}: expected 'in' in a for loop", loc(tag));
      p.next();
      n->expr = p.or_expr();
      if (p.is_name("if")) {
        p.next();
        n->cond = p.or_expr();
      }
      MS_CHECK(!p.is_name("recursive"), "{}: unsupported construct 'for ... recursive'", loc(tag));
      p.expect_end();
      n->body = parse_body({"else", "endfor"}, stop);
      if (stop == "else") {
        cur_->expect_end();
        n->else_body = parse_body({"endfor"}, stop);
      }
      cur_->expect_end();
      return n;
    }
    if (kw == "set") {
      std::string target = p.expect_name();
      if (p.is_op(".")) {
        p.next();
        n->attr = p.expect_name();
      }
      n->targets.push_back(target);
      while (p.is_op(",")) {
        p.next();
        n->targets.push_back(p.expect_name());
      }
      n->text = target;
      if (p.at_end()) {
        n->type = Node::Type::SetBlock;
        n->body = parse_body({"endset"}, stop);
        cur_->expect_end();
        return n;
      }
      n->type = Node::Type::Set;
      p.expect_op("=");
      n->expr = p.expr();
      if (p.is_op(",")) {  // set a, b = x, y
        auto l = mk(Expr::Type::ListLit);
        l->kids.push_back(n->expr);
        while (p.is_op(",")) {
          p.next();
          l->kids.push_back(p.expr());
        }
        n->expr = l;
      }
      p.expect_end();
      return n;
    }
    if (kw == "macro") {
      n->type = Node::Type::Macro;
      n->text = p.expect_name();
      p.expect_op("(");
      while (!p.is_op(")")) {
        n->targets.push_back(p.expect_name());
        ExprP def;
        if (p.is_op("=")) {
          p.next();
          def = p.expr();
        }
        n->defaults.push_back(def);
        if (!p.is_op(")")) p.expect_op(",");
      }
      p.next();
      p.expect_end();
      n->body = parse_body({"endmacro"}, stop);
      cur_->expect_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      p.expect_end();
      n->type = kw == "break" ? Node::Type::Break : Node::Type::Continue;
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: renders its body unchanged
      p.expect_end();
      n->type = Node::Type::Block;
      n->body = parse_body({"endgeneration"}, stop);
      cur_->expect_end();
      return n;
    }
    MS_THROW("{}: unsupported template construct '{{% {} %}}'", loc(tag), kw);
  }

  std::vector<RawTag> tags_;
  size_t i_ = 0;
  std::string where_;
  std::unique_ptr<ExprParser> cur_;
};

}  // namespace

Template::Template(const std::string& source, const std::string& where) : where_(where) {
  StmtParser parser(lex_tags(source, where), where);
  root_ = parser.parse_all();
}

}  // namespace ms::tokenizer::jinja
