// UTF-8 helpers shared by the tokenizer pipeline: code point iteration, lossy repair, byte-level alphabet.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ms::tokenizer {

// Length in bytes of the UTF-8 sequence starting with lead byte `c` (1 for an invalid lead byte).
inline int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

// Decodes the code point at s[i] and advances i; an invalid sequence yields U+FFFD and advances one byte.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);

// Replaces every invalid UTF-8 subsequence by U+FFFD, one per maximal invalid subpart (as Rust's
// String::from_utf8_lossy does, which is what Hugging Face decoders use).
std::string utf8_lossy(std::string_view bytes);
// Number of bytes at the end of `s` that form an incomplete (but so far valid) UTF-8 sequence.
size_t utf8_incomplete_tail(std::string_view s);

// The GPT-2 byte-level alphabet: each byte maps to one printable code point.
char32_t byte_to_char(uint8_t b);
// -1 when `c` is not in the alphabet.
int char_to_byte(char32_t c);
// UTF-8 text of the byte-level image of `bytes`.
std::string bytes_to_byte_level(std::string_view bytes);

bool is_unicode_whitespace(char32_t c);

}  // namespace ms::tokenizer
