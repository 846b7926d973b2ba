// The simplest continuous-batching policy: running sequences decode first (one token each), then waiting
// requests are admitted first come, first served while pages and the step's token budget last; a prompt
// longer than the budget is prefilled in chunks. Kept in one class so a fuller scheduler can replace it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kv/page_allocator.h"
#include "runtime/sequence.h"

namespace ms::runtime {

struct SchedulerLimits {
  int max_running = 8;
  int32_t max_batch_tokens = 2048;
  int32_t page_size = 64;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int32_t n_tokens = 0;  // new tokens this step, starting at seq->computed
};

class FcfsScheduler {
 public:
  explicit FcfsScheduler(SchedulerLimits limits) : lim_(limits) {}
  void add(Sequence* s) { waiting_.push_back(s); }
  void remove(Sequence* s);  // finished or cancelled (its pages are released by the caller)
  // Chooses this step's work and grows each chosen sequence's pages to hold it.
  std::vector<ScheduledSeq> schedule(kv::PageAllocator& alloc);
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }

 private:
  bool grow(Sequence* s, int32_t tokens, kv::PageAllocator& alloc) const;
  SchedulerLimits lim_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;
};

}  // namespace ms::runtime
