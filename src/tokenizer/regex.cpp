#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <mutex>

#include "core/error.h"

namespace ms::tokenizer {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  // Match data is per call site; one per thread keeps the hot loop allocation-free.
  std::mutex mu;
  std::vector<pcre2_match_data*> pool;

  pcre2_match_data* acquire() {
    std::lock_guard<std::mutex> lock(mu);
    if (pool.empty()) return pcre2_match_data_create_from_pattern(code, nullptr);
    auto* md = pool.back();
    pool.pop_back();
    return md;
  }
  void release(pcre2_match_data* md) {
    std::lock_guard<std::mutex> lock(mu);
    pool.push_back(md);
  }
};

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) : impl_(new Impl) {
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) opts = PCRE2_UTF | PCRE2_LITERAL;  // LITERAL admits no other option but UTF
  impl_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    MS_THROW("{}: cannot compile regex '{}' at offset {}: {}", where, pattern, off,
             reinterpret_cast<const char*>(buf));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  for (auto* md : impl_->pool) pcre2_match_data_free(md);
  pcre2_code_free(impl_->code);
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  auto* md = impl_->acquire();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    int rc = impl_->jit
                 ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0, md, nullptr)
                 : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step one code point forward.
      if (b >= text.size()) break;
      size_t n = 1;
      while (b + n < text.size() && (static_cast<unsigned char>(text[b + n]) & 0xC0) == 0x80) ++n;
      start = b + n;
    }
  }
  impl_->release(md);
}

std::string Regex::replace_all(std::string_view text, std::string_view with) const {
  std::vector<std::pair<size_t, size_t>> m;
  find_all(text, m);
  std::string out;
  size_t last = 0;
  for (auto [b, e] : m) {
    out.append(text.substr(last, b - last));
    out.append(with);
    last = e;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace ms::tokenizer
