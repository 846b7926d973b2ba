// PCRE2 regex compiled with UTF + UCP (Unicode classes for \s \w \p{..}) and JIT, shared by the
// Split pre-tokenizer and the Replace normalizer/decoder.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ms::tokenizer {

class Regex {
 public:
  // literal: the pattern is a plain string (tokenizer.json {"String": ...}), not a regex.
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of all non-overlapping non-empty matches, left to right.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  std::string replace_all(std::string_view text, std::string_view with) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ms::tokenizer
