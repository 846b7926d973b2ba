// Pre-tokenizers: Split (regex or string, all five behaviours, invert), ByteLevel, Digits, Metaspace,
// Whitespace, WhitespaceSplit, Sequence. Each maps pieces to finer pieces, dropping empty ones.
#include <algorithm>

#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace ms::tokenizer {

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  MS_THROW("{}: unsupported split behavior \"{}\"", where, s);
}

// GCC 12 warns falsely (-Wrestrict) on std::string::insert(0, ...); build the new string instead.
std::string prepend(std::string_view head, const std::string& tail) {
  std::string out;
  out.reserve(head.size() + tail.size());
  out.append(head);
  out.append(tail);
  return out;
}

struct Span {
  size_t b, e;
  bool match;
};

// Splits `piece` given the byte ranges of its matches, appending the resulting pieces to `out`.
void split_by_matches(const std::string& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                      Behavior behavior, bool invert, Pieces& out) {
  if (matches.empty() && !invert) {
    if (!piece.empty()) out.push_back(piece);
    return;
  }
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t last = 0;
  for (auto [b, e] : matches) {
    if (b > last) spans.push_back({last, b, invert});
    spans.push_back({b, e, !invert});
    last = e;
  }
  if (last < piece.size()) spans.push_back({last, piece.size(), invert});

  std::vector<Span> acc;
  acc.reserve(spans.size());
  switch (behavior) {
    case Behavior::Isolated:
      acc = spans;
      break;
    case Behavior::Removed:
      for (auto& s : spans)
        if (!s.match) acc.push_back(s);
      break;
    case Behavior::MergedWithPrevious: {
      bool prev = false;
      for (auto& s : spans) {
        if (s.match && !prev && !acc.empty())
          acc.back().e = s.e;
        else
          acc.push_back(s);
        prev = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const auto& s = spans[k];
        if (s.match && !prev && !acc.empty())
          acc.back().b = s.b;
        else
          acc.push_back(s);
        prev = s.match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    }
    case Behavior::Contiguous: {
      bool prev = false;
      for (auto& s : spans) {
        if (s.match == prev && !acc.empty())
          acc.back().e = s.e;
        else
          acc.push_back(s);
        prev = s.match;
      }
      break;
    }
  }
  for (auto& s : acc)
    if (s.e > s.b) out.push_back(piece.substr(s.b, s.e - s.b));
}

class Split : public PreTokenizer {
 public:
  Split(const nlohmann::json& j, const std::string& where) {
    const auto& pat = j.at("pattern");
    bool literal = pat.contains("String");
    re_ = std::make_unique<Regex>(
        literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>(), literal,
        where + ".pattern");
    behavior_ = parse_behavior(j.at("behavior").get<std::string>(), where + ".behavior");
    invert_ = j.value("invert", false);
  }
  void pre_tokenize(Pieces& pieces, bool) const override {
    Pieces out;
    out.reserve(pieces.size() * 4);
    thread_local std::vector<std::pair<size_t, size_t>> m;
    for (const auto& p : pieces) {
      re_->find_all(p, m);
      split_by_matches(p, m, behavior_, invert_, out);
    }
    pieces.swap(out);
  }

 private:
  std::unique_ptr<Regex> re_;
  Behavior behavior_ = Behavior::Isolated;
  bool invert_ = false;
};

// GPT-2's split regex, used by ByteLevel when use_regex is on.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(const nlohmann::json& j, const std::string& where)
      : add_prefix_space_(j.value("add_prefix_space", true)), use_regex_(j.value("use_regex", true)) {
    if (use_regex_) re_ = std::make_unique<Regex>(kGpt2Pattern, false, where);
  }
  void pre_tokenize(Pieces& pieces, bool) const override {
    Pieces out;
    out.reserve(pieces.size() * (use_regex_ ? 4 : 1));
    thread_local std::vector<std::pair<size_t, size_t>> m;
    for (auto& p : pieces) {
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) p = prepend(" ", p);
      if (use_regex_) {
        size_t first = out.size();
        re_->find_all(p, m);
        split_by_matches(p, m, Behavior::Isolated, false, out);
        for (size_t k = first; k < out.size(); ++k) out[k] = bytes_to_byte_level(out[k]);
      } else if (!p.empty()) {
        out.push_back(bytes_to_byte_level(p));
      }
    }
    pieces.swap(out);
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> re_;
};

class Digits : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(Pieces& pieces, bool) const override {
    Pieces out;
    std::vector<std::pair<size_t, size_t>> m;
    for (const auto& p : pieces) {
      m.clear();
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] < '0' || p[i] > '9') continue;
        if (!individual_ && !m.empty() && m.back().second == i)
          m.back().second = i + 1;
        else
          m.emplace_back(i, i + 1);
      }
      split_by_matches(p, m, Behavior::Isolated, false, out);
    }
    pieces.swap(out);
  }

 private:
  bool individual_;
};

class Metaspace : public PreTokenizer {
 public:
  Metaspace(const nlohmann::json& j, const std::string& where) {
    replacement_ = j.value("replacement", std::string("\xE2\x96\x81"));
    split_ = j.value("split", true);
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    MS_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
             "{}.prepend_scheme: unsupported value \"{}\"", where, scheme);
    scheme_ = scheme;
  }
  void pre_tokenize(Pieces& pieces, bool first_span) const override {
    Pieces out;
    std::vector<std::pair<size_t, size_t>> m;
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::string p;
      for (char c : pieces[k]) {
        if (c == ' ')
          p += replacement_;
        else
          p.push_back(c);
      }
      bool starts = p.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == "always" || (scheme_ == "first" && first_span && k == 0)))
        p = prepend(replacement_, p);
      if (!split_) {
        if (!p.empty()) out.push_back(std::move(p));
        continue;
      }
      m.clear();
      for (size_t pos = p.find(replacement_); pos != std::string::npos; pos = p.find(replacement_, pos + 1))
        m.emplace_back(pos, pos + replacement_.size());
      split_by_matches(p, m, Behavior::MergedWithNext, false, out);
    }
    pieces.swap(out);
  }

 private:
  std::string replacement_, scheme_;
  bool split_ = true;
};

class WhitespaceSplit : public PreTokenizer {
 public:
  void pre_tokenize(Pieces& pieces, bool) const override {
    Pieces out;
    for (const auto& p : pieces) {
      size_t i = 0, start = std::string::npos;
      while (i < p.size()) {
        size_t at = i;
        bool ws = is_unicode_whitespace(utf8_next(p, i));
        if (ws && start != std::string::npos) {
          out.push_back(p.substr(start, at - start));
          start = std::string::npos;
        } else if (!ws && start == std::string::npos) {
          start = at;
        }
      }
      if (start != std::string::npos) out.push_back(p.substr(start));
    }
    pieces.swap(out);
  }
};

class Whitespace : public PreTokenizer {
 public:
  Whitespace() : re_(R"(\w+|[^\w\s]+)", false, "Whitespace") {}
  void pre_tokenize(Pieces& pieces, bool) const override {
    Pieces out;
    std::vector<std::pair<size_t, size_t>> m;
    for (const auto& p : pieces) {
      re_.find_all(p, m);
      split_by_matches(p, m, Behavior::Removed, true, out);
    }
    pieces.swap(out);
  }

 private:
  Regex re_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(Pieces& pieces, bool first_span) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces, first_span);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type"), "{}: expected an object with a \"type\"", where);
  const std::string type = j.at("type").get<std::string>();
  try {
    if (type == "Split") return std::make_unique<Split>(j, where);
    if (type == "ByteLevel") return std::make_unique<ByteLevel>(j, where);
    if (type == "Digits") return std::make_unique<Digits>(j.value("individual_digits", false));
    if (type == "Metaspace") return std::make_unique<Metaspace>(j, where);
    if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
    if (type == "Whitespace") return std::make_unique<Whitespace>();
    if (type == "Sequence")
      return std::make_unique<Sequence>(
          make_sequence_stages<PreTokenizer>(j, "pretokenizers", where, make_pre_tokenizer));
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{} ({}): {}", where, type, e.what());
  }
  MS_THROW("{}: unsupported pre_tokenizer type \"{}\"", where, type);
}

}  // namespace ms::tokenizer
