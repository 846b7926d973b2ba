#include "scheduler/batch_plan.h"

#include <algorithm>

#include "core/error.h"

namespace ms::scheduler {

kv::ForwardBatch flatten(const BatchPlan& plan, int32_t page_size) {
  MS_CHECK(page_size > 0, "page_size must be > 0, got {}", page_size);
  kv::ForwardBatch f;
  for (const auto& s : plan.seqs)
    f.max_blocks = std::max(f.max_blocks, static_cast<int32_t>(s.page_ids.size()));
  f.block_table.assign(plan.seqs.size() * static_cast<size_t>(f.max_blocks), -1);
  for (size_t b = 0; b < plan.seqs.size(); ++b) {
    const auto& s = plan.seqs[b];
    MS_CHECK(static_cast<int32_t>(s.token_ids.size()) == s.token_end - s.token_begin,
             "plan for sequence {}: {} token ids for positions [{}, {})", s.seq_id, s.token_ids.size(),
             s.token_begin, s.token_end);
    MS_CHECK(static_cast<int64_t>(s.page_ids.size()) * page_size >= s.token_end,
             "plan for sequence {}: {} pages cannot hold {} tokens", s.seq_id, s.page_ids.size(),
             s.token_end);
    for (int32_t pos = s.token_begin; pos < s.token_end; ++pos) {
      f.token_ids.push_back(s.token_ids[static_cast<size_t>(pos - s.token_begin)]);
      f.positions.push_back(pos);
      f.token_seq.push_back(static_cast<int32_t>(b));
      f.slot_mapping.push_back(static_cast<int64_t>(s.page_ids[static_cast<size_t>(pos / page_size)]) *
                                   page_size +
                               pos % page_size);
    }
    if (s.sample) f.logit_rows.push_back(static_cast<int32_t>(f.token_ids.size()) - 1);
    f.seq_lens.push_back(s.token_end);
    std::copy(s.page_ids.begin(), s.page_ids.end(),
              f.block_table.begin() + static_cast<ptrdiff_t>(b * f.max_blocks));
  }
  return f;
}

}  // namespace ms::scheduler
