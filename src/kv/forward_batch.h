// One forward step as data: the tokens of every scheduled sequence (prefill chunks and single decode tokens
// mixed), where their keys go in the paged cache, and which rows need logits.
#pragma once

#include <cstdint>
#include <vector>

namespace ms::kv {

struct ForwardBatch {
  std::vector<int32_t> token_ids;    // [n_tokens] sequences back to back
  std::vector<int32_t> positions;    // [n_tokens] position of each token in its sequence
  std::vector<int32_t> token_seq;    // [n_tokens] batch sequence index of each token
  std::vector<int32_t> seq_lens;     // [n_seqs] context length after this step (cached + new)
  std::vector<int32_t> block_table;  // [n_seqs, max_blocks] page ids, -1 past the end
  int32_t max_blocks = 0;
  std::vector<int64_t> slot_mapping;  // [n_tokens] page * page_size + offset of each new token
  std::vector<int32_t> logit_rows;    // token indices whose logits are wanted, ascending

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t n_seqs() const { return static_cast<int32_t>(seq_lens.size()); }
  int32_t max_position() const;
};

// Builds a batch step by step: add each sequence's new tokens, then finish() lays out the block table.
class ForwardBatchBuilder {
 public:
  explicit ForwardBatchBuilder(int32_t page_size) : page_size_(page_size) {}
  // `pages` must hold positions [0, start + tokens.size()). Returns the sequence's batch index.
  int add_sequence(const std::vector<int32_t>& pages, int32_t start, const int32_t* tokens, int32_t n,
                   bool want_last_logits);
  ForwardBatch finish();

 private:
  int32_t page_size_;
  ForwardBatch b_;
  std::vector<std::vector<int32_t>> pages_;
};

}  // namespace ms::kv
