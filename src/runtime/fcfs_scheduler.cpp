#include "runtime/fcfs_scheduler.h"

#include <algorithm>

namespace ms::runtime {

void FcfsScheduler::remove(Sequence* s) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
}

bool FcfsScheduler::grow(Sequence* s, int32_t tokens, kv::PageAllocator& alloc) const {
  const int32_t need = (tokens + lim_.page_size - 1) / lim_.page_size - static_cast<int32_t>(s->pages.size());
  return need <= 0 || alloc.allocate(need, s->pages);
}

std::vector<ScheduledSeq> FcfsScheduler::schedule(kv::PageAllocator& alloc) {
  std::vector<ScheduledSeq> out;
  int32_t budget = lim_.max_batch_tokens;
  for (Sequence* s : running_) {
    if (budget <= 0) break;
    const int32_t n = std::min(s->pending(), budget);
    if (n <= 0) continue;
    if (!grow(s, s->computed + n, alloc)) continue;  // waits for pages; nothing is preempted here
    out.push_back({s, n});
    budget -= n;
  }
  while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < lim_.max_running) {
    Sequence* s = waiting_.front();
    const int32_t n = std::min(s->pending(), budget);
    if (!grow(s, s->computed + n, alloc)) break;
    waiting_.pop_front();
    running_.push_back(s);
    out.push_back({s, n});
    budget -= n;
  }
  return out;
}

}  // namespace ms::runtime
