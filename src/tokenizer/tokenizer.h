// A Hugging Face tokenizer.json, loaded and run with the same results as the `tokenizers` library:
// added/special tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor; decode through the decoder.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/components.h"

namespace ms::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

class Tokenizer {
 public:
  // `where` names the source (a file path) in error messages.
  static std::unique_ptr<Tokenizer> from_json_text(const std::string& json_text, const std::string& where);
  static std::unique_ptr<Tokenizer> from_file(const std::string& path);

  // Text must be UTF-8; invalid bytes are replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // -1 when unknown. Added tokens first, then the model vocab.
  int32_t token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  int32_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  ~Tokenizer();

 private:
  Tokenizer() = default;
  struct Segment {
    std::string_view text;
    int32_t token = -1;  // id of the added token, or -1 for ordinary text
  };
  void split_added(std::string_view text, bool normalized_tokens, std::vector<Segment>& out) const;
  void encode_text(std::string text, bool first_span, std::vector<int32_t>& ids) const;

  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  TokenMap added_by_content_;
  std::vector<int32_t> added_by_id_;  // id -> index into added_, or -1
  // Candidates per first byte, longest first, for the two passes (raw text, normalized text).
  std::vector<int32_t> starts_[2][256];
};

}  // namespace ms::tokenizer
