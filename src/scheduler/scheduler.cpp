#include "scheduler/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace ms::scheduler {

Scheduler::Scheduler(const SchedulerConfig& config, kv::PageAllocator& allocator, kv::RadixCache* cache)
    : config_(config), allocator_(allocator), cache_(cache) {
  MS_CHECK(config.page_size > 0, "page_size must be > 0, got {}", config.page_size);
  MS_CHECK(config.max_running_requests > 0, "max_running_requests must be > 0, got {}",
           config.max_running_requests);
  MS_CHECK(config.max_prefill_tokens > 0, "max_prefill_tokens must be > 0, got {}",
           config.max_prefill_tokens);
  MS_CHECK(cache == nullptr || cache->page_size() == config.page_size,
           "prefix cache page size {} differs from the scheduler's {}", cache ? cache->page_size() : 0,
           config.page_size);
}

Scheduler::~Scheduler() {
  for (auto& [id, s] : seqs_) release(*s);
}

void Scheduler::add(uint64_t seq_id, SequenceParams params) {
  MS_CHECK(!seqs_.count(seq_id), "sequence id {} is already queued", seq_id);
  if (params.prompt.empty()) MS_THROW("prompt: must hold at least one token");
  if (params.max_tokens < 1) MS_THROW("max_tokens: must be >= 1, got {}", params.max_tokens);
  const int64_t total = static_cast<int64_t>(params.prompt.size()) + params.max_tokens;
  if (config_.max_context > 0 && total > config_.max_context)
    MS_THROW("max_tokens: prompt ({} tokens) + max_tokens ({}) exceeds the context length {}",
             params.prompt.size(), params.max_tokens, config_.max_context);
  const int64_t capacity = static_cast<int64_t>(allocator_.num_pages()) * config_.page_size;
  if (total > capacity)
    MS_THROW("max_tokens: prompt ({} tokens) + max_tokens ({}) exceeds the KV cache capacity of {} tokens",
             params.prompt.size(), params.max_tokens, capacity);
  auto s = std::make_unique<Sequence>();
  s->id = seq_id;
  s->arrival = next_arrival_++;
  s->num_prompt = static_cast<int32_t>(params.prompt.size());
  s->tokens = std::move(params.prompt);
  s->max_tokens = params.max_tokens;
  s->stop_token_ids = std::move(params.stop_token_ids);
  waiting_.push_back(s.get());
  seqs_.emplace(seq_id, std::move(s));
}

const Sequence* Scheduler::find(uint64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

bool Scheduler::abort(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return false;
  Sequence* s = it->second.get();
  if (s->state == SeqState::Waiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), s));
  } else {
    remove_running(s);
  }
  release(*s);
  seqs_.erase(it);
  return true;
}

void Scheduler::insert_running(Sequence* s) {
  auto pos = std::upper_bound(running_.begin(), running_.end(), s,
                              [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  running_.insert(pos, s);
}

void Scheduler::remove_running(Sequence* s) {
  auto it = std::find(running_.begin(), running_.end(), s);
  if (it != running_.end()) running_.erase(it);
}

int32_t Scheduler::available_pages() const {
  return allocator_.num_free() + (cache_ ? cache_->evictable_pages() : 0);
}

void Scheduler::release(Sequence& s) {
  if (cache_ && s.cache_node) cache_->unlock(s.cache_node);
  s.cache_node = nullptr;
  allocator_.release_all(s.pages);
  s.pages.clear();
}

// Puts the whole computed pages of `s` into the prefix cache and moves its lock to the new end. Where the
// tree already had a page for a position, the sequence switches to the tree's page (same tokens at the same
// positions, so the same KV) and drops its own.
void Scheduler::cache_computed(Sequence& s) {
  if (!cache_) return;
  const int32_t full = s.num_computed / config_.page_size * config_.page_size;
  if (full == 0) return;
  std::vector<int32_t> prefix(s.tokens.begin(), s.tokens.begin() + full);
  auto ins = cache_->insert(prefix, s.pages);
  for (size_t i = 0; i < ins.pages.size(); ++i) {
    if (s.pages[i] != ins.pages[i]) {
      allocator_.retain(ins.pages[i]);
      allocator_.release(s.pages[i]);
      s.pages[i] = ins.pages[i];
    }
  }
  cache_->lock(ins.node);
  if (s.cache_node) cache_->unlock(s.cache_node);
  s.cache_node = ins.node;
}

bool Scheduler::try_grow(Sequence& s, int32_t num_tokens) {
  const int32_t need = pages_for(num_tokens) - static_cast<int32_t>(s.pages.size());
  if (need <= 0) return true;
  if (allocator_.num_free() < need && cache_) cache_->evict(need - allocator_.num_free());
  return allocator_.allocate(need, s.pages);
}

void Scheduler::preempt(Sequence& s, BatchPlan& plan) {
  cache_computed(s);
  release(s);
  s.num_computed = 0;
  s.state = SeqState::Waiting;
  ++s.num_preemptions;
  ++preemptions_;
  remove_running(&s);
  waiting_.push_front(&s);
  plan.preempted.push_back(s.id);
}

// Pages for positions [0, num_tokens) of s, preempting the newest running sequences until they fit. Returns
// false when s itself had to go.
bool Scheduler::grow_or_preempt(Sequence& s, int32_t num_tokens, BatchPlan& plan) {
  while (!try_grow(s, num_tokens)) {
    Sequence* victim = running_.back();
    preempt(*victim, plan);
    if (victim == &s) return false;
  }
  return true;
}

void Scheduler::plan_entry(Sequence& s, int32_t end, bool prefill, BatchPlan& plan) {
  PlannedSequence p;
  p.seq_id = s.id;
  p.token_begin = s.num_computed;
  p.token_end = end;
  p.token_ids.assign(s.tokens.begin() + s.num_computed, s.tokens.begin() + end);
  p.page_ids = s.pages;
  p.sample = end == static_cast<int32_t>(s.tokens.size());
  p.prefill = prefill;
  p.cached_prefix_tokens = s.cached_prefix_tokens;
  const int32_t n = end - s.num_computed;
  plan.num_tokens += n;
  if (prefill) {
    plan.num_prefill_tokens += n;
  } else {
    ++plan.num_decode;
  }
  plan.seqs.push_back(std::move(p));
  pending_.push_back({s.id, end, plan.seqs.back().sample, prefill});
}

bool Scheduler::admit(Sequence& s, int32_t& budget, BatchPlan& plan) {
  const int32_t len = static_cast<int32_t>(s.tokens.size());
  kv::RadixCache::Match m;
  if (cache_) {
    // At least the last position is computed, to get logits to sample from.
    m = cache_->match_prefix(std::vector<int32_t>(s.tokens.begin(), s.tokens.end() - 1), false);
    cache_->lock(m.node);
  }
  const int32_t need = pages_for(len) - static_cast<int32_t>(m.pages.size());
  if (available_pages() < need) {
    if (cache_) cache_->unlock(m.node);
    return false;
  }
  for (int32_t p : m.pages) allocator_.retain(p);
  s.pages = m.pages;
  s.cache_node = m.node;
  s.num_computed = m.matched_tokens;
  s.cached_prefix_tokens = m.matched_tokens;
  prefix_query_tokens_ += len;
  prefix_hit_tokens_ += m.matched_tokens;
  const int32_t end = s.num_computed + std::min(budget, len - s.num_computed);
  const bool ok = try_grow(s, end);
  MS_CHECK(ok, "admission of sequence {}: {} pages were available but allocation failed", s.id, need);
  budget -= end - s.num_computed;
  s.state = SeqState::Prefill;
  waiting_.pop_front();
  insert_running(&s);
  plan_entry(s, end, true, plan);
  return true;
}

BatchPlan Scheduler::schedule() {
  MS_CHECK(pending_.empty(), "schedule() called twice without commit()");
  BatchPlan plan;
  for (;;) {
    // 1. Decodes, oldest first; one that needs a page may preempt newer sequences (never planned ones: those
    // are all older).
    for (size_t i = 0; i < running_.size(); ++i) {
      Sequence& s = *running_[i];
      if (s.state != SeqState::Decode) continue;
      const int32_t end = static_cast<int32_t>(s.tokens.size());
      if (!grow_or_preempt(s, end, plan)) break;
      plan_entry(s, end, false, plan);
    }
    // 2. Chunks of prompts already running, oldest first. A chunk takes what pages there are; it never
    // preempts (the sequences it would preempt may already be planned).
    int32_t budget = config_.max_prefill_tokens;
    for (Sequence* sp : running_) {
      Sequence& s = *sp;
      if (s.state != SeqState::Prefill || budget == 0) continue;
      const int32_t len = static_cast<int32_t>(s.tokens.size());
      int32_t end = s.num_computed + std::min(budget, len - s.num_computed);
      if (!try_grow(s, end)) {
        const int64_t fits = (static_cast<int64_t>(s.pages.size()) + available_pages()) * config_.page_size;
        end = static_cast<int32_t>(std::min<int64_t>(end, fits));
        if (end <= s.num_computed || !try_grow(s, end)) continue;
      }
      budget -= end - s.num_computed;
      plan_entry(s, end, true, plan);
    }
    // 3. Admissions, first come first served: the head of the queue blocks the rest. None in a step that had
    // to preempt: the pool is short, and readmitting now would only thrash.
    while (plan.preempted.empty() && !waiting_.empty() && budget > 0 &&
           static_cast<int32_t>(running_.size()) < config_.max_running_requests) {
      if (!admit(*waiting_.front(), budget, plan)) break;
    }
    if (!plan.empty() || running_.empty()) break;
    // Every running sequence is a prompt stuck without pages: free the newest and try again. The oldest alone
    // always fits (add() checks it against the whole pool), so this ends.
    preempt(*running_.back(), plan);
  }
  return plan;
}

std::vector<SequenceUpdate> Scheduler::commit(const std::vector<SampledToken>& sampled) {
  std::unordered_map<uint64_t, int32_t> by_id;
  for (const auto& t : sampled) by_id[t.seq_id] = t.token;
  std::vector<SequenceUpdate> updates;
  std::vector<Pending> pending;
  pending.swap(pending_);
  for (const auto& p : pending) {
    auto it = seqs_.find(p.seq_id);
    if (it == seqs_.end() || it->second->state == SeqState::Waiting) continue;  // aborted or preempted since
    Sequence& s = *it->second;
    s.num_computed = p.token_end;
    if (!p.sample) {
      if (p.prefill) cache_computed(s);  // share finished prompt pages with later requests
      continue;
    }
    auto t = by_id.find(p.seq_id);
    MS_CHECK(t != by_id.end(), "commit: no sampled token for sequence {}", p.seq_id);
    if (p.prefill) cache_computed(s);
    s.tokens.push_back(t->second);
    s.state = SeqState::Decode;
    SequenceUpdate u;
    u.seq_id = s.id;
    u.token = t->second;
    if (std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), t->second) != s.stop_token_ids.end()) {
      u.finish = SeqFinish::Stop;
    } else if (s.num_generated() >= s.max_tokens ||
               (config_.max_context > 0 && static_cast<int64_t>(s.tokens.size()) >= config_.max_context)) {
      u.finish = SeqFinish::Length;
    }
    u.num_prompt = s.num_prompt;
    u.cached_prefix_tokens = s.cached_prefix_tokens;
    u.num_generated = s.num_generated();
    if (u.finish != SeqFinish::None) {
      cache_computed(s);
      release(s);
      remove_running(&s);
      s.state = SeqState::Finished;
      seqs_.erase(it);
    }
    updates.push_back(u);
  }
  return updates;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st;
  st.running = static_cast<int32_t>(running_.size());
  st.waiting = static_cast<int32_t>(waiting_.size());
  st.pages_total = allocator_.num_pages();
  st.pages_used = allocator_.num_used();
  st.pages_cached = cache_ ? cache_->cached_pages() : 0;
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.preemptions = preemptions_;
  return st;
}

}  // namespace ms::scheduler
