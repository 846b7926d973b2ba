// Normalizers: NFC/NFD/NFKC/NFKD and Lowercase through ICU; Replace, Prepend, Strip, Sequence.
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace ms::tokenizer {

namespace {

std::u16string to_u16(const std::string& s, const char* where) {
  std::u16string out(s.size() + 1, u'\0');
  int32_t len = 0;
  UErrorCode st = U_ZERO_ERROR;
  u_strFromUTF8WithSub(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &len, s.data(),
                       static_cast<int32_t>(s.size()), 0xFFFD, nullptr, &st);
  MS_CHECK(U_SUCCESS(st), "{}: UTF-8 to UTF-16 failed: {}", where, u_errorName(st));
  out.resize(len);
  return out;
}

std::string to_u8(const std::u16string& s, const char* where) {
  std::string out(s.size() * 3 + 1, '\0');
  int32_t len = 0;
  UErrorCode st = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len, reinterpret_cast<const UChar*>(s.data()),
              static_cast<int32_t>(s.size()), &st);
  MS_CHECK(U_SUCCESS(st), "{}: UTF-16 to UTF-8 failed: {}", where, u_errorName(st));
  out.resize(len);
  return out;
}

bool is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

class UnicodeNorm : public Normalizer {
 public:
  UnicodeNorm(const std::string& form, const std::string& where) : form_(form) {
    UErrorCode st = U_ZERO_ERROR;
    if (form == "NFC") n_ = unorm2_getNFCInstance(&st);
    if (form == "NFD") n_ = unorm2_getNFDInstance(&st);
    if (form == "NFKC") n_ = unorm2_getNFKCInstance(&st);
    if (form == "NFKD") n_ = unorm2_getNFKDInstance(&st);
    MS_CHECK(n_ && U_SUCCESS(st), "{}: ICU has no {} normalizer ({})", where, form, u_errorName(st));
  }
  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;  // ASCII is invariant under all four forms
    auto u = to_u16(text, "normalizer");
    UErrorCode st = U_ZERO_ERROR;
    int32_t cap = static_cast<int32_t>(u.size() * 4 + 16);
    std::u16string out(cap, u'\0');
    int32_t len =
        unorm2_normalize(n_, reinterpret_cast<const UChar*>(u.data()), static_cast<int32_t>(u.size()),
                         reinterpret_cast<UChar*>(out.data()), cap, &st);
    MS_CHECK(U_SUCCESS(st), "{} normalization failed: {}", form_, u_errorName(st));
    out.resize(len);
    text = to_u8(out, "normalizer");
  }

 private:
  std::string form_;
  const UNormalizer2* n_ = nullptr;
};

class Lowercase : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    if (is_ascii(text)) {
      for (auto& c : text) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
      return;
    }
    auto u = to_u16(text, "Lowercase");
    std::u16string out(u.size() * 3 + 16, u'\0');
    UErrorCode st = U_ZERO_ERROR;
    int32_t len =
        u_strToLower(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()),
                     reinterpret_cast<const UChar*>(u.data()), static_cast<int32_t>(u.size()), "", &st);
    MS_CHECK(U_SUCCESS(st), "Lowercase failed: {}", u_errorName(st));
    out.resize(len);
    text = to_u8(out, "Lowercase");
  }
};

class Replace : public Normalizer {
 public:
  Replace(const nlohmann::json& j, const std::string& where) {
    const auto& pat = j.at("pattern");
    bool literal = pat.contains("String");
    re_ = std::make_unique<Regex>(
        literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>(), literal,
        where + ".pattern");
    content_ = j.at("content").get<std::string>();
  }
  void normalize(std::string& text) const override { text = re_->replace_all(text, content_); }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, p_);
  }

 private:
  std::string p_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t b = 0, e = text.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!is_unicode_whitespace(utf8_next(text, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t s = e - 1;
        while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        size_t i = s;
        if (!is_unicode_whitespace(utf8_next(text, i))) break;
        e = s;
      }
    }
    text = text.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type"), "{}: expected an object with a \"type\"", where);
  const std::string type = j.at("type").get<std::string>();
  try {
    if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD")
      return std::make_unique<UnicodeNorm>(type, where);
    if (type == "Lowercase") return std::make_unique<Lowercase>();
    if (type == "Replace") return std::make_unique<Replace>(j, where);
    if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
    if (type == "Strip")
      return std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
    if (type == "Sequence")
      return std::make_unique<Sequence>(
          make_sequence_stages<Normalizer>(j, "normalizers", where, make_normalizer));
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{} ({}): {}", where, type, e.what());
  }
  MS_THROW("{}: unsupported normalizer type \"{}\"", where, type);
}

}  // namespace ms::tokenizer
