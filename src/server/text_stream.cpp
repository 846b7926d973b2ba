#include "server/text_stream.h"

#include <algorithm>
#include <cstddef>

namespace ms::server {
namespace {

bool ends_incomplete(const std::string& s) {
  // U+FFFD from a decoder that met a partial character, or a raw partial UTF-8 sequence at the end.
  if (s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0) return true;
  size_t i = s.size();
  int cont = 0;
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80 && cont < 3) {
    --i;
    ++cont;
  }
  if (i == 0) return cont > 0;
  const auto lead = static_cast<unsigned char>(s[i - 1]);
  int need = 0;
  if ((lead & 0xE0) == 0xC0)
    need = 1;
  else if ((lead & 0xF0) == 0xE0)
    need = 2;
  else if ((lead & 0xF8) == 0xF0)
    need = 3;
  else
    return false;
  return cont < need;
}

}  // namespace

TextStream::TextStream(Decode decode, std::vector<std::string> stop)
    : decode_(std::move(decode)), stop_(std::move(stop)) {
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
  for (const auto& s : stop_) max_stop_ = std::max(max_stop_, s.size());
}

std::string TextStream::add(int32_t token) {
  if (stopped_) return {};
  ids_.push_back(token);
  const std::vector<int32_t> window(ids_.begin() + static_cast<ptrdiff_t>(prefix_offset_), ids_.end());
  const std::vector<int32_t> before(ids_.begin() + static_cast<ptrdiff_t>(prefix_offset_),
                                    ids_.begin() + static_cast<ptrdiff_t>(read_offset_));
  const std::string full = decode_(window);
  const std::string prev = decode_(before);
  if (full.size() > prev.size() && !ends_incomplete(full)) {
    text_ += full.substr(prev.size());
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
  }
  return release();
}

std::string TextStream::release() {
  if (!stop_.empty()) {
    // Whatever could begin a stop string was held back, so a match starts at or after sent_.
    const size_t from = sent_;
    size_t hit = std::string::npos;
    for (const auto& s : stop_) hit = std::min(hit, text_.find(s, from));
    if (hit != std::string::npos) {
      text_.resize(hit);
      stopped_ = true;
      std::string out = hit > sent_ ? text_.substr(sent_) : std::string();
      sent_ = text_.size();
      return out;
    }
  }
  size_t keep = 0;  // longest tail that begins some stop string
  for (const auto& s : stop_)
    for (size_t n = std::min(s.size() - 1, text_.size() - sent_); n > keep; --n)
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  const size_t upto = text_.size() - keep;
  std::string out = upto > sent_ ? text_.substr(sent_, upto - sent_) : std::string();
  sent_ = std::max(sent_, upto);
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  if (read_offset_ < ids_.size()) {
    const std::vector<int32_t> window(ids_.begin() + static_cast<ptrdiff_t>(prefix_offset_), ids_.end());
    const std::vector<int32_t> before(ids_.begin() + static_cast<ptrdiff_t>(prefix_offset_),
                                      ids_.begin() + static_cast<ptrdiff_t>(read_offset_));
    const std::string full = decode_(window), prev = decode_(before);
    if (full.size() > prev.size()) text_ += full.substr(prev.size());
    read_offset_ = ids_.size();
  }
  std::string out = release();  // a stop string may complete in the flushed text
  if (!stopped_) {
    out += text_.substr(sent_);
    sent_ = text_.size();
  }
  return out;
}

}  // namespace ms::server
