// Decoders: ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence. Each maps the token
// strings of a decode to new strings; the tokenizer joins the result.
#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace ms::tokenizer {

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      size_t start = bytes.size();
      bool all = true;
      for (size_t i = 0; i < t.size();) {
        int b = char_to_byte(utf8_next(t, i));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      // A token with any character outside the byte alphabet passes through as its own bytes.
      if (!all) {
        bytes.resize(start);
        bytes.append(t);
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      std::string lossy = utf8_lossy(pending);
      if (lossy.size() == pending.size() && lossy == pending) {
        out.push_back(pending);
      } else {
        // Invalid bytes: one U+FFFD per byte token, as the reference does.
        for (size_t k = 0; k < pending_count; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : tokens) {
      int b = parse_byte_token(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(const nlohmann::json& j, const std::string& where) {
    const auto& pat = j.at("pattern");
    bool literal = pat.contains("String");
    re_ = std::make_unique<Regex>(
        literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>(), literal,
        where + ".pattern");
    content_ = j.at("content").get<std::string>();
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = re_->replace_all(t, content_);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++k)
        b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(const nlohmann::json& j) {
    replacement_ = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    strip_first_ = scheme != "never";
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const auto& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, replacement_.size(), replacement_) == 0) {
          out.push_back(' ');
          i += replacement_.size();
        } else {
          out.push_back(t[i++]);
        }
      }
      if (k == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[k] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_ = true;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type"), "{}: expected an object with a \"type\"", where);
  const std::string type = j.at("type").get<std::string>();
  try {
    if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
    if (type == "Fuse") return std::make_unique<FuseDecoder>();
    if (type == "Replace") return std::make_unique<ReplaceDecoder>(j, where);
    if (type == "Strip")
      return std::make_unique<StripDecoder>(j.at("content").get<std::string>(), j.value("start", size_t{0}),
                                            j.value("stop", size_t{0}));
    if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(j);
    if (type == "Sequence")
      return std::make_unique<SequenceDecoder>(
          make_sequence_stages<Decoder>(j, "decoders", where, make_decoder));
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{} ({}): {}", where, type, e.what());
  }
  MS_THROW("{}: unsupported decoder type \"{}\"", where, type);
}

}  // namespace ms::tokenizer
