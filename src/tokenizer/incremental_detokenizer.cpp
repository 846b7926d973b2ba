#include "tokenizer/incremental_detokenizer.h"

namespace ms::tokenizer {

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

std::string IncrementalDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  std::vector<int32_t> context(ids_.begin() + prefix_, ids_.begin() + read_);
  std::vector<int32_t> window(ids_.begin() + prefix_, ids_.end());
  std::string before = tok_.decode(context, skip_special_);
  std::string now = tok_.decode(window, skip_special_);
  if (now.size() <= before.size() || ends_with_replacement(now) || now.compare(0, before.size(), before) != 0)
    return {};
  std::string delta = now.substr(before.size());
  prefix_ = read_;
  read_ = ids_.size();
  return delta;
}

std::string IncrementalDetokenizer::flush() {
  std::vector<int32_t> context(ids_.begin() + prefix_, ids_.begin() + read_);
  std::vector<int32_t> window(ids_.begin() + prefix_, ids_.end());
  std::string before = tok_.decode(context, skip_special_);
  std::string now = tok_.decode(window, skip_special_);
  prefix_ = read_ = ids_.size();
  if (now.size() <= before.size() || now.compare(0, before.size(), before) != 0) return {};
  return now.substr(before.size());
}

}  // namespace ms::tokenizer
