// The BPE model of tokenizer.json: vocab, ranked merges, byte fallback, unk, subword prefix/suffix.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ms::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  Bpe(const nlohmann::json& model, const std::string& where);

  // Appends the ids of one pre-tokenized word. Thread-safe.
  void tokenize(const std::string& word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  void merge_word(const std::string& word, std::vector<int32_t>& out) const;

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  struct MergeTarget {
    int32_t rank, id;
  };
  // key: (left id << 32) | right id
  std::unordered_map<uint64_t, MergeTarget> merges_;
  std::string prefix_, suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];

  // Two generations of recently seen words: lookups hit either, inserts go to `fresh_`; when it fills,
  // it becomes `old_`, so words seen in the last ~kCacheWords stay cached.
  static constexpr size_t kCacheWords = 16384;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> fresh_, old_;
};

}  // namespace ms::tokenizer
