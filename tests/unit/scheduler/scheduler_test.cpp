#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "core/error.h"

using namespace ms::scheduler;
using ms::kv::PageAllocator;
using ms::kv::RadixCache;

namespace {

std::vector<int32_t> iota_tokens(int32_t start, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

SequenceParams params(std::vector<int32_t> prompt, int32_t max_tokens, std::vector<int32_t> stop = {}) {
  SequenceParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.stop_token_ids = std::move(stop);
  return p;
}

// Samples token 7 for every planned sequence that samples.
std::vector<SampledToken> sample_all(const BatchPlan& plan, int32_t token = 7) {
  std::vector<SampledToken> out;
  for (const auto& s : plan.seqs)
    if (s.sample) out.push_back({s.seq_id, token});
  return out;
}

const PlannedSequence* entry(const BatchPlan& plan, uint64_t id) {
  for (const auto& s : plan.seqs)
    if (s.seq_id == id) return &s;
  return nullptr;
}

}  // namespace

TEST(Scheduler, PrefillBudgetSplitsPromptsIntoChunks) {
  PageAllocator a(64);
  SchedulerConfig cfg{.page_size = 16, .max_running_requests = 8, .max_prefill_tokens = 128};
  Scheduler s(cfg, a, nullptr);
  s.add(1, params(iota_tokens(0, 100), 4));
  s.add(2, params(iota_tokens(0, 100), 4));
  auto p1 = s.schedule();
  ASSERT_EQ(p1.seqs.size(), 2u);
  EXPECT_EQ(p1.num_prefill_tokens, 128);
  EXPECT_EQ(entry(p1, 1)->token_end, 100);
  EXPECT_TRUE(entry(p1, 1)->sample);
  EXPECT_EQ(entry(p1, 2)->token_end, 28);  // the rest of the budget
  EXPECT_FALSE(entry(p1, 2)->sample);
  EXPECT_EQ(entry(p1, 2)->page_ids.size(), 2u);
  auto u = s.commit(sample_all(p1));
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].seq_id, 1u);

  auto p2 = s.schedule();
  ASSERT_EQ(p2.seqs.size(), 2u);
  EXPECT_FALSE(p2.seqs[0].prefill);  // decode first
  EXPECT_EQ(p2.seqs[0].seq_id, 1u);
  EXPECT_EQ(p2.seqs[0].token_begin, 100);
  EXPECT_EQ(p2.seqs[0].token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(p2.seqs[1].token_begin, 28);
  EXPECT_EQ(p2.seqs[1].token_end, 100);
  EXPECT_EQ(p2.num_decode, 1);
  EXPECT_EQ(p2.num_tokens, 73);
}

TEST(Scheduler, LongPromptIsChunkedAndNeverDelaysDecodes) {
  PageAllocator a(128);
  SchedulerConfig cfg{.page_size = 16, .max_running_requests = 8, .max_prefill_tokens = 64};
  Scheduler s(cfg, a, nullptr);
  s.add(1, params(iota_tokens(0, 10), 50));
  s.commit(sample_all(s.schedule()));  // 1 is decoding now
  s.add(2, params(iota_tokens(0, 1000), 2));
  int chunks = 0;
  int32_t covered = 0;
  for (int step = 0; step < 16; ++step) {
    auto p = s.schedule();
    const auto* d = entry(p, 1);
    ASSERT_NE(d, nullptr) << "decode starved at step " << step;
    EXPECT_FALSE(d->prefill);
    if (const auto* c = entry(p, 2); c && c->prefill) {
      EXPECT_EQ(c->token_begin, covered);
      EXPECT_LE(c->token_end - c->token_begin, 64);
      EXPECT_EQ(c->sample, c->token_end == 1000);
      covered = c->token_end;
      ++chunks;
    }
    s.commit(sample_all(p));
  }
  EXPECT_EQ(chunks, 16);
  EXPECT_EQ(covered, 1000);
}

TEST(Scheduler, MaxRunningRequestsAndFinishReasons) {
  PageAllocator a(64);
  SchedulerConfig cfg{.page_size = 4, .max_running_requests = 2, .max_prefill_tokens = 1000};
  Scheduler s(cfg, a, nullptr);
  for (uint64_t id = 1; id <= 4; ++id) s.add(id, params(iota_tokens(0, 5), 3, {99}));
  auto p = s.schedule();
  EXPECT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(s.stats().waiting, 2);
  auto u = s.commit({{1, 99}, {2, 5}});
  EXPECT_EQ(u[0].finish, SeqFinish::Stop);
  EXPECT_EQ(u[1].finish, SeqFinish::None);
  p = s.schedule();  // 2 decodes, 3 is admitted into the freed slot
  EXPECT_EQ(p.num_decode, 1);
  EXPECT_NE(entry(p, 3), nullptr);
  EXPECT_EQ(entry(p, 4), nullptr);
  s.commit(sample_all(p));
  u = s.commit(sample_all(s.schedule()));
  ASSERT_FALSE(u.empty());
  EXPECT_EQ(u[0].seq_id, 2u);
  EXPECT_EQ(u[0].finish, SeqFinish::Length);
  EXPECT_EQ(u[0].num_generated, 3);
}

TEST(Scheduler, RejectsWhatCanNeverRun) {
  PageAllocator a(4);
  SchedulerConfig cfg{.page_size = 4, .max_context = 12};
  Scheduler s(cfg, a, nullptr);
  EXPECT_THROW(s.add(1, params({}, 4)), ms::Error);
  EXPECT_THROW(s.add(1, params({1}, 0)), ms::Error);
  EXPECT_THROW(s.add(1, params(iota_tokens(0, 10), 4)), ms::Error);  // context
  SchedulerConfig big{.page_size = 4};
  Scheduler t(big, a, nullptr);
  try {
    t.add(1, params(iota_tokens(0, 10), 10));  // 20 tokens > 4 pages of 4
    FAIL();
  } catch (const ms::Error& e) {
    EXPECT_NE(e.message().find("max_tokens"), std::string::npos);
  }
}

TEST(Scheduler, PreemptsTheNewestAndRecomputesIt) {
  PageAllocator a(4);  // 16 tokens
  SchedulerConfig cfg{.page_size = 4, .max_running_requests = 4, .max_prefill_tokens = 100};
  Scheduler s(cfg, a, nullptr);
  s.add(1, params(iota_tokens(0, 4), 8));
  s.add(2, params(iota_tokens(10, 4), 8));
  auto p = s.schedule();  // both fit: 1 page each
  ASSERT_EQ(p.seqs.size(), 2u);
  s.commit({{1, 100}, {2, 200}});
  // Each needs a second page now, then a third after 4 more tokens: 1 + 1 + ... the pool runs out.
  bool preempted = false;
  for (int step = 0; step < 8 && !preempted; ++step) {
    p = s.schedule();
    if (!p.preempted.empty()) {
      preempted = true;
      EXPECT_EQ(p.preempted, std::vector<uint64_t>{2});
      EXPECT_NE(entry(p, 1), nullptr);
      EXPECT_EQ(entry(p, 2), nullptr);
      EXPECT_EQ(s.find(2)->state, SeqState::Waiting);
      EXPECT_TRUE(s.find(2)->pages.empty());
    }
    std::vector<SampledToken> t;
    for (const auto& e : p.seqs) t.push_back({e.seq_id, static_cast<int32_t>(e.seq_id * 100 + step + 1)});
    s.commit(t);
  }
  ASSERT_TRUE(preempted);
  const auto generated2 = s.find(2)->tokens;
  // Run 1 to the end; then 2 is recomputed from position 0 over prompt + what it had generated.
  bool recomputed = false;
  for (int step = 0; step < 20 && s.has_work(); ++step) {
    p = s.schedule();
    if (const auto* e = entry(p, 2); e && e->prefill && !recomputed) {
      recomputed = true;
      EXPECT_EQ(e->token_begin, 0);
      EXPECT_EQ(e->token_ids, generated2);
      EXPECT_TRUE(e->sample);
    }
    s.commit(sample_all(p));
  }
  EXPECT_TRUE(recomputed);
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(s.stats().preemptions, 1);
}

TEST(Scheduler, SharesPrefixPagesWithLaterAndConcurrentRequests) {
  PageAllocator a(32);
  RadixCache c(a, 4);
  SchedulerConfig cfg{.page_size = 4, .max_running_requests = 8, .max_prefill_tokens = 100};
  Scheduler s(cfg, a, &c);
  auto sys = iota_tokens(1000, 8);  // two pages
  auto prompt_a = sys;
  prompt_a.insert(prompt_a.end(), {1, 2, 3});
  s.add(1, params(prompt_a, 5));
  auto p = s.schedule();
  const auto pages_a = entry(p, 1)->page_ids;
  s.commit(sample_all(p));  // prompt done: its two full pages are in the cache, 1 still decodes
  auto prompt_b = sys;
  prompt_b.insert(prompt_b.end(), {4, 5});
  s.add(2, params(prompt_b, 2));
  p = s.schedule();
  const auto* b = entry(p, 2);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->token_begin, 8);
  EXPECT_EQ(b->cached_prefix_tokens, 8);
  EXPECT_EQ(b->page_ids[0], pages_a[0]);
  EXPECT_EQ(b->page_ids[1], pages_a[1]);
  EXPECT_NE(b->page_ids[2], pages_a[2]);
  EXPECT_EQ(a.ref_count(pages_a[0]), 3);  // tree + 1 + 2
  s.commit(sample_all(p));
  while (s.has_work()) s.commit(sample_all(s.schedule()));
  auto st = s.stats();
  EXPECT_EQ(st.prefix_hit_tokens, 8);
  EXPECT_EQ(st.prefix_query_tokens, 11 + 10);
  // Everything left is cache, and all of it can be evicted.
  EXPECT_EQ(a.num_used(), c.cached_pages());
  EXPECT_EQ(c.evictable_pages(), c.cached_pages());
  c.clear();
  EXPECT_EQ(a.num_free(), 32);
}

TEST(Scheduler, EvictsCachedPrefixesWhenPagesAreNeeded) {
  PageAllocator a(8);
  RadixCache c(a, 4);
  SchedulerConfig cfg{.page_size = 4, .max_running_requests = 8, .max_prefill_tokens = 100};
  Scheduler s(cfg, a, &c);
  s.add(1, params(iota_tokens(0, 17), 1));  // 5 pages, 4 full ones stay cached
  while (s.has_work()) s.commit(sample_all(s.schedule()));
  EXPECT_EQ(c.cached_pages(), 4);
  EXPECT_EQ(a.num_free(), 4);
  s.add(2, params(iota_tokens(500, 24), 1));  // needs 6 pages: 2 must come out of the cache
  auto p = s.schedule();
  ASSERT_NE(entry(p, 2), nullptr);
  EXPECT_EQ(entry(p, 2)->page_ids.size(), 6u);
  EXPECT_LT(c.cached_pages(), 4);
  s.commit(sample_all(p));
  c.clear();
  EXPECT_EQ(a.num_free(), 8);
}

TEST(Scheduler, HeadOfQueueIsNotOvertaken) {
  PageAllocator a(8);
  SchedulerConfig cfg{.page_size = 4, .max_running_requests = 8, .max_prefill_tokens = 100};
  Scheduler s(cfg, a, nullptr);
  s.add(1, params(iota_tokens(0, 16), 8));  // 4 pages, grows to 6
  s.commit(sample_all(s.schedule()));
  s.add(2, params(iota_tokens(0, 20), 1));  // needs 6: waits for 1
  s.add(3, params(iota_tokens(0, 2), 1));   // would fit, but must not overtake 2
  int first2 = -1, first3 = -1;
  for (int step = 0; step < 40 && s.has_work(); ++step) {
    auto p = s.schedule();
    if (entry(p, 2) && first2 < 0) first2 = step;
    if (entry(p, 3) && first3 < 0) first3 = step;
    s.commit(sample_all(p));
  }
  EXPECT_GE(first2, 0);
  EXPECT_GE(first3, first2);
  EXPECT_EQ(a.num_free(), 8);
}

TEST(Scheduler, AbortFreesPagesAnywhere) {
  PageAllocator a(16);
  RadixCache c(a, 4);
  SchedulerConfig cfg{.page_size = 4, .max_running_requests = 1, .max_prefill_tokens = 100};
  Scheduler s(cfg, a, &c);
  s.add(1, params(iota_tokens(0, 9), 10));
  s.add(2, params(iota_tokens(0, 9), 10));
  auto p = s.schedule();
  EXPECT_TRUE(s.abort(2));  // waiting
  EXPECT_TRUE(s.abort(1));  // running, planned: commit skips it
  EXPECT_FALSE(s.abort(1));
  EXPECT_TRUE(s.commit(sample_all(p)).empty());
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(a.num_used(), c.cached_pages());
  EXPECT_EQ(c.evictable_pages(), c.cached_pages());
}

TEST(BatchPlan, FlattensIntoSlotMappingAndBlockTables) {
  BatchPlan plan;
  plan.seqs.push_back(
      {.seq_id = 1, .token_begin = 5, .token_end = 6, .token_ids = {42}, .page_ids = {3, 9}, .sample = true});
  plan.seqs.push_back({.seq_id = 2,
                       .token_begin = 2,
                       .token_end = 5,
                       .token_ids = {1, 2, 3},
                       .page_ids = {4, 0},
                       .sample = false});
  plan.num_tokens = 4;
  auto f = flatten(plan, 4);
  EXPECT_EQ(f.token_ids, (std::vector<int32_t>{42, 1, 2, 3}));
  EXPECT_EQ(f.positions, (std::vector<int32_t>{5, 2, 3, 4}));
  EXPECT_EQ(f.slot_mapping, (std::vector<int64_t>{9 * 4 + 1, 4 * 4 + 2, 4 * 4 + 3, 0 * 4 + 0}));
  EXPECT_EQ(f.token_seq, (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(f.seq_lens, (std::vector<int32_t>{6, 5}));
  EXPECT_EQ(f.logit_rows, std::vector<int32_t>{0});
  EXPECT_EQ(f.block_table, (std::vector<int32_t>{3, 9, 4, 0}));
  EXPECT_EQ(f.max_blocks, 2);
  plan.seqs[1].page_ids = {4};  // too few pages for 5 tokens
  EXPECT_THROW(flatten(plan, 4), ms::Error);
}

// Property test: random arrivals, aborts and stops over a small vocabulary (many shared prefixes), with a
// fake KV store that records which token was written at each slot. Every step checks that each sequence's
// block table holds exactly its own tokens at every position already computed (so sharing, swapping and
// preemption never hand a sequence wrong KV), that written pages are owned by one holder, and that budgets
// hold. At the end every page is free again and every sequence finished.
TEST(Scheduler, RandomWorkloadsKeepKvConsistentAndLeakNothing) {
  int64_t preemptions = 0, hits = 0;
  for (uint32_t seed = 0; seed < 60; ++seed) {
    std::mt19937 rng(seed);
    const int32_t page_size = 1 + static_cast<int32_t>(rng() % 4) * 3;  // 1, 4, 7, 10
    const int32_t num_pages = 24 + static_cast<int32_t>(rng() % 40);
    const bool use_cache = rng() % 4 != 0;
    PageAllocator a(num_pages);
    {
      RadixCache c(a, page_size);
      SchedulerConfig cfg{.page_size = page_size,
                          .max_running_requests = 1 + static_cast<int32_t>(rng() % 8),
                          .max_prefill_tokens = 8 + static_cast<int32_t>(rng() % 40)};
      Scheduler s(cfg, a, use_cache ? &c : nullptr);
      std::vector<int32_t> kv(static_cast<size_t>(num_pages * page_size), -1);
      std::map<uint64_t, std::vector<int32_t>> expect;  // our own copy of each live sequence's tokens
      std::set<uint64_t> finished;
      uint64_t next_id = 0;
      const int total = 40;
      int steps = 0;
      while ((next_id < total || s.has_work()) && steps < 5000) {
        ++steps;
        if (next_id < total && rng() % 3 == 0) {
          std::vector<int32_t> prompt(static_cast<size_t>(1 + rng() % 30));
          for (auto& t : prompt) t = static_cast<int32_t>(rng() % 2);
          const int32_t max_tokens = 1 + static_cast<int32_t>(rng() % 12);
          if (static_cast<int32_t>(prompt.size()) + max_tokens <= num_pages * page_size) {
            s.add(next_id, params(prompt, max_tokens, {5}));
            expect[next_id] = prompt;
          }
          ++next_id;
        }
        if (!expect.empty() && rng() % 25 == 0) {
          auto it = std::next(expect.begin(), static_cast<ptrdiff_t>(rng() % expect.size()));
          ASSERT_TRUE(s.abort(it->first));
          finished.insert(it->first);
          expect.erase(it);
        }
        auto plan = s.schedule();
        ASSERT_LE(plan.num_prefill_tokens, cfg.max_prefill_tokens);
        std::set<uint64_t> ids;
        std::vector<SampledToken> sampled;
        for (const auto& e : plan.seqs) {
          ASSERT_TRUE(ids.insert(e.seq_id).second) << "sequence planned twice";
          const auto& toks = expect.at(e.seq_id);
          ASSERT_EQ(e.token_ids,
                    std::vector<int32_t>(toks.begin() + e.token_begin, toks.begin() + e.token_end));
          ASSERT_GE(static_cast<int64_t>(e.page_ids.size()) * page_size, e.token_end);
          for (int32_t pos = 0; pos < e.token_begin; ++pos) {
            const int32_t slot =
                e.page_ids[static_cast<size_t>(pos / page_size)] * page_size + pos % page_size;
            ASSERT_EQ(kv[static_cast<size_t>(slot)], toks[static_cast<size_t>(pos)])
                << "seed " << seed << " seq " << e.seq_id << " pos " << pos;
          }
          for (int32_t pos = e.token_begin; pos < e.token_end; ++pos) {
            const int32_t page = e.page_ids[static_cast<size_t>(pos / page_size)];
            ASSERT_EQ(a.ref_count(page), 1) << "writing into a shared page, seed " << seed;
            kv[static_cast<size_t>(page * page_size + pos % page_size)] = toks[static_cast<size_t>(pos)];
          }
          if (e.sample) sampled.push_back({e.seq_id, static_cast<int32_t>(rng() % 6)});
        }
        for (const auto& u : s.commit(sampled)) {
          expect.at(u.seq_id).push_back(u.token);
          if (u.finish != SeqFinish::None) {
            finished.insert(u.seq_id);
            expect.erase(u.seq_id);
          }
        }
        if (use_cache) {
          ASSERT_LE(c.evictable_pages(), c.cached_pages());
        }
      }
      EXPECT_LT(steps, 5000) << "seed " << seed << ": work never finished";
      preemptions += s.stats().preemptions;
      hits += s.stats().prefix_hit_tokens;
      EXPECT_TRUE(expect.empty()) << "seed " << seed;
      EXPECT_EQ(a.num_used(), use_cache ? c.cached_pages() : 0) << "seed " << seed;
    }
    EXPECT_EQ(a.num_free(), a.num_pages()) << "seed " << seed;
  }
  // The workloads must actually exercise preemption and prefix reuse.
  EXPECT_GT(preemptions, 20);
  EXPECT_GT(hits, 100);
}
