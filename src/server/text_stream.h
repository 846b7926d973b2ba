// Turns one completion's tokens into text pieces safe to send: incremental detokenization that never splits a
// UTF-8 character, and stop strings that end the text before the stop string (which is not sent). Text that
// could be the start of a stop string is held back until it is known not to be.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ms::server {

class TextStream {
 public:
  using Decode = std::function<std::string(const std::vector<int32_t>&)>;
  TextStream(Decode decode, std::vector<std::string> stop);

  // Returns the text that may be sent now. After a stop string was found, stopped() is true and further
  // tokens add nothing.
  std::string add(int32_t token);
  std::string finish();  // the rest, when the sequence ended for another reason
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // everything produced so far (stop string excluded)

 private:
  std::string release();
  Decode decode_;
  std::vector<std::string> stop_;
  size_t max_stop_ = 0;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0, read_offset_ = 0;  // ids_[prefix_offset_, read_offset_) were decoded already
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

}  // namespace ms::server
