// Streaming decode: push ids one at a time, get back only text that is final. Text is held back while
// the decoded tail is an incomplete UTF-8 character (a token that splits a code point), so no chunk
// ever carries half a character.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ms::tokenizer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens = true)
      : tok_(tok), skip_special_(skip_special_tokens) {}

  // The new text this id completes (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back (ends of streams that stop inside a character), lossily decoded.
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  // ids_[prefix_, read_) were already emitted; they are decoded again as context so that decoders which
  // depend on neighbours (Metaspace's leading space, byte-level runs) give the same text as a full decode.
  size_t prefix_ = 0, read_ = 0;
};

}  // namespace ms::tokenizer
