// Continuous batching policy, pure CPU: which sequences run in the next step and which positions of each.
//
// Every step: all running decodes first (oldest first), so a long prompt never delays a decode; then prefill
// chunks of running prompts and newly admitted ones, first come first served, within max_prefill_tokens.
// Admission needs a free running slot and enough pages (free + evictable from the prefix cache) for the whole
// remaining prompt; the head of the queue blocks the rest, so a long prompt is not overtaken forever. When a
// running sequence needs a page and none is left, the newest running sequence is preempted: its computed
// pages go to the prefix cache, its references are dropped, and it returns to the front of the queue to be
// recomputed. The scheduler holds references on pages through the allocator and never owns either the
// allocator or the cache.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kv/page_allocator.h"
#include "kv/radix_cache.h"
#include "scheduler/batch_plan.h"

namespace ms::scheduler {

struct SchedulerConfig {
  int32_t page_size = 64;
  int32_t max_running_requests = 256;
  int32_t max_prefill_tokens = 8192;  // prompt tokens per step; longer prompts are prefilled in chunks
  int64_t max_context = 0;            // tokens per sequence (prompt + output); 0: only the KV pool limits it
};

struct SequenceParams {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // eos ids and the request's stop ids: generating one finishes it
};

enum class SeqState { Waiting, Prefill, Decode, Finished };
enum class SeqFinish { None, Stop, Length };

struct Sequence {
  uint64_t id = 0;
  uint64_t arrival = 0;         // admission order among equals
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int32_t num_prompt = 0;
  int32_t max_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  SeqState state = SeqState::Waiting;
  int32_t num_computed = 0;                    // positions whose KV is in `pages`
  std::vector<int32_t> pages;                  // one reference held on each
  kv::RadixCache::Node* cache_node = nullptr;  // locked while the sequence runs
  int32_t cached_prefix_tokens = 0;            // at the latest admission
  int32_t num_preemptions = 0;
  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - num_prompt; }
};

struct SampledToken {
  uint64_t seq_id = 0;
  int32_t token = 0;
};

// What commit() reports per sequence that sampled a token this step.
struct SequenceUpdate {
  uint64_t seq_id = 0;
  int32_t token = 0;
  SeqFinish finish = SeqFinish::None;
  int32_t num_prompt = 0, cached_prefix_tokens = 0, num_generated = 0;
};

struct SchedulerStats {
  int32_t running = 0, waiting = 0;
  int32_t pages_total = 0, pages_used = 0, pages_cached = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;  // at admissions
  int64_t preemptions = 0;
};

class Scheduler {
 public:
  // cache may be null: no prefix reuse.
  Scheduler(const SchedulerConfig& config, kv::PageAllocator& allocator, kv::RadixCache* cache);
  ~Scheduler();  // drops every reference it holds
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a sequence. Throws ms::Error naming the field when it can never run (empty prompt, max_tokens < 1,
  // longer than max_context or than the whole KV pool).
  void add(uint64_t seq_id, SequenceParams params);
  // Removes a sequence wherever it is and drops its pages. Returns false for an unknown id.
  bool abort(uint64_t seq_id);

  BatchPlan schedule();
  // After the engine ran the last plan: one sampled token per planned sequence with sample == true (aborted
  // ones may be missing). Advances every planned sequence, finishes those that stop, frees their pages.
  std::vector<SequenceUpdate> commit(const std::vector<SampledToken>& sampled);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  const Sequence* find(uint64_t seq_id) const;
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }

 private:
  int32_t pages_for(int64_t tokens) const {
    return static_cast<int32_t>((tokens + config_.page_size - 1) / config_.page_size);
  }
  int32_t available_pages() const;
  bool try_grow(Sequence& s, int32_t num_tokens);
  bool grow_or_preempt(Sequence& s, int32_t num_tokens, BatchPlan& plan);
  void preempt(Sequence& s, BatchPlan& plan);
  void release(Sequence& s);
  void cache_computed(Sequence& s);
  bool admit(Sequence& s, int32_t& budget, BatchPlan& plan);
  void plan_entry(Sequence& s, int32_t end, bool prefill, BatchPlan& plan);
  void insert_running(Sequence* s);
  void remove_running(Sequence* s);

  SchedulerConfig config_;
  kv::PageAllocator& allocator_;
  kv::RadixCache* cache_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // by arrival, oldest first
  struct Pending {
    uint64_t seq_id;
    int32_t token_end;
    bool sample, prefill;
  };
  std::vector<Pending> pending_;  // the plan awaiting commit()
  uint64_t next_arrival_ = 0;
  int64_t prefix_query_tokens_ = 0, prefix_hit_tokens_ = 0, preemptions_ = 0;
};

}  // namespace ms::scheduler
