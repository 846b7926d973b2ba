#include "kv/forward_batch.h"

#include <algorithm>

#include "core/error.h"

namespace ms::kv {

int32_t ForwardBatch::max_position() const {
  int32_t m = 0;
  for (int32_t p : positions) m = std::max(m, p);
  return m;
}

int ForwardBatchBuilder::add_sequence(const std::vector<int32_t>& pages, int32_t start, const int32_t* tokens,
                                      int32_t n, bool want_last_logits) {
  MS_CHECK(n > 0, "a sequence in a batch needs at least one new token");
  const int64_t end = static_cast<int64_t>(start) + n;
  MS_CHECK(static_cast<int64_t>(pages.size()) * page_size_ >= end, "{} pages of {} cannot hold {} tokens",
           pages.size(), page_size_, end);
  const int seq = static_cast<int>(b_.seq_lens.size());
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = start + i;
    b_.token_ids.push_back(tokens[i]);
    b_.positions.push_back(pos);
    b_.token_seq.push_back(seq);
    b_.slot_mapping.push_back(
        static_cast<int64_t>(pages[static_cast<size_t>(pos / page_size_)]) * page_size_ + pos % page_size_);
  }
  if (want_last_logits) b_.logit_rows.push_back(b_.n_tokens() - 1);
  b_.seq_lens.push_back(static_cast<int32_t>(end));
  pages_.push_back(pages);
  return seq;
}

ForwardBatch ForwardBatchBuilder::finish() {
  int32_t mb = 1;
  for (const auto& p : pages_) mb = std::max(mb, static_cast<int32_t>(p.size()));
  b_.max_blocks = mb;
  b_.block_table.assign(static_cast<size_t>(mb) * pages_.size(), -1);
  for (size_t s = 0; s < pages_.size(); ++s)
    std::copy(pages_[s].begin(), pages_[s].end(), b_.block_table.begin() + static_cast<int64_t>(s) * mb);
  ForwardBatch out = std::move(b_);
  b_ = ForwardBatch{};
  pages_.clear();
  return out;
}

}  // namespace ms::kv
