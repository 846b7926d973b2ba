#include "tokenizer/utf8.h"

#include <array>

namespace ms::tokenizer {

namespace {

// Returns the sequence length if s[i..] starts a well-formed UTF-8 sequence, else the length of the
// maximal invalid subpart (at least 1) as a negative number.
int utf8_check(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = s.size() - i;
  auto cont = [&](size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : -1;
  if (c >= 0xE0 && c <= 0xEF) {
    if (n < 2) return -1;
    unsigned char c1 = b(i + 1);
    bool ok1 = (c == 0xE0)   ? (c1 >= 0xA0 && c1 <= 0xBF)
               : (c == 0xED) ? (c1 >= 0x80 && c1 <= 0x9F)
                             : cont(i + 1);
    if (!ok1) return -1;
    return cont(i + 2) ? 3 : -2;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (n < 2) return -1;
    unsigned char c1 = b(i + 1);
    bool ok1 = (c == 0xF0)   ? (c1 >= 0x90 && c1 <= 0xBF)
               : (c == 0xF4) ? (c1 >= 0x80 && c1 <= 0x8F)
                             : cont(i + 1);
    if (!ok1) return -1;
    if (!cont(i + 2)) return -2;
    return cont(i + 3) ? 4 : -3;
  }
  return -1;
}

struct ByteMaps {
  std::array<char32_t, 256> to_char{};
  std::array<int, 512> to_byte{};
  std::array<std::string, 256> utf8{};
  ByteMaps() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      to_char[b] = c;
      to_byte[c] = b;
      utf8_append(utf8[b], c);
    }
  }
};

const ByteMaps& byte_maps() {
  static const ByteMaps maps;
  return maps;
}

}  // namespace

char32_t utf8_next(std::string_view s, size_t& i) {
  int n = utf8_check(s, i);
  if (n < 0) {
    i += 1;
    return 0xFFFD;
  }
  auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[k])); };
  char32_t cp;
  switch (n) {
    case 1:
      cp = b(i);
      break;
    case 2:
      cp = ((b(i) & 0x1F) << 6) | (b(i + 1) & 0x3F);
      break;
    case 3:
      cp = ((b(i) & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
      break;
    default:
      cp = ((b(i) & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
  }
  i += n;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    int n = utf8_check(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += -n;
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    size_t i = s.size() - back;
    auto c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) == 0x80) continue;
    int need = utf8_len(c);
    if (need > static_cast<int>(back) && utf8_check(s, i) <= -static_cast<int>(back)) return back;
    return 0;
  }
  return 0;
}

char32_t byte_to_char(uint8_t b) {
  return byte_maps().to_char[b];
}
int char_to_byte(char32_t c) {
  return c < 512 ? byte_maps().to_byte[c] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& m = byte_maps();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out.append(m.utf8[c]);
  return out;
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace ms::tokenizer
