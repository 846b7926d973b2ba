// The Engine over the scheduler and the prefix cache, on the built-in model (a DSA model: its indexer keys
// live in the same KV pages, so page sharing and recomputation cover them too). Every test compares tokens
// against the same requests run another way: alone, without the cache, in one prefill step.
#include <gtest/gtest.h>

#include <map>

#include "model/builtin_model.h"
#include "runtime/engine.h"

namespace ms {
namespace {

std::shared_ptr<model::Model> builtin() {
  static std::shared_ptr<model::Model> m = model::make_builtin_model();
  return m;
}

runtime::Request greedy(std::vector<int32_t> ids, int max_tokens) {
  runtime::Request r;
  r.prompt_ids = std::move(ids);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.top_logprobs = 2;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((i * 37 + salt * 101 + 11) % 512);
  return v;
}

runtime::EngineConfig config(int32_t pages, bool cache, int32_t prefill_budget = 64) {
  runtime::EngineConfig c;
  c.page_size = 8;
  c.kv_cache_tokens = int64_t{pages} * c.page_size;
  c.kv_cache_dtype = kv::KvCacheDType::F32;
  c.max_running = 8;
  c.max_prefill_tokens = prefill_budget;
  c.enable_prefix_cache = cache;
  return c;
}

struct Result {
  std::vector<runtime::GeneratedToken> tokens;
  runtime::FinishReason finish = runtime::FinishReason::None;
  int cached_prompt_tokens = -1;
  int completion_tokens = 0;
};

// Steps until idle. Fails the test if a request reports after it finished.
std::map<uint64_t, Result> run_all(runtime::Engine& e, int max_steps = 5000) {
  std::map<uint64_t, Result> got;
  for (int i = 0; e.has_work() && i < max_steps; ++i)
    for (const auto& o : e.step()) {
      Result& r = got[o.request_id];
      EXPECT_EQ(r.finish, runtime::FinishReason::None)
          << "request " << o.request_id << " reported after its end";
      r.tokens.insert(r.tokens.end(), o.tokens.begin(), o.tokens.end());
      r.finish = o.finish;
      r.completion_tokens = o.completion_tokens;
      if (r.cached_prompt_tokens < 0) r.cached_prompt_tokens = o.cached_prompt_tokens;
      EXPECT_EQ(o.cached_prompt_tokens, r.cached_prompt_tokens) << "cached_prompt_tokens changed";
    }
  EXPECT_FALSE(e.has_work()) << "still busy after " << max_steps << " steps";
  return got;
}

std::vector<int32_t> ids(const Result& r) {
  std::vector<int32_t> v;
  for (const auto& g : r.tokens) v.push_back(g.token);
  return v;
}

Result alone(const runtime::Request& r) {
  runtime::Engine e(builtin(), config(256, false, 4096));
  const uint64_t id = e.submit(r);
  return run_all(e)[id];
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  EXPECT_EQ(ids(got), ids(want)) << what;
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    EXPECT_NEAR(got.tokens[i].logprob, want.tokens[i].logprob, 1e-4) << what << " token " << i;
    ASSERT_EQ(got.tokens[i].top_logprobs.size(), want.tokens[i].top_logprobs.size()) << what;
    for (size_t k = 0; k < got.tokens[i].top_logprobs.size(); ++k)
      EXPECT_NEAR(got.tokens[i].top_logprobs[k].logprob, want.tokens[i].top_logprobs[k].logprob, 1e-4)
          << what << " token " << i << " top " << k;
  }
}

void expect_no_leak(runtime::Engine& e) {
  const runtime::EngineStats st = e.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_pages_used, st.kv_pages_cached) << "pages held by nobody but the prefix cache";
  EXPECT_EQ(e.page_allocator().num_free(), st.kv_pages_total - st.kv_pages_cached);
  e.clear_prefix_cache();
  EXPECT_EQ(e.stats().kv_pages_cached, 0);
  EXPECT_EQ(e.stats().kv_pages_used, 0);
  EXPECT_EQ(e.page_allocator().num_free(), st.kv_pages_total);
}

// A second request with the same 100-token prompt reuses 12 whole pages (96 tokens: the last position is
// always computed) and produces the same tokens and logprobs as without any cache; a third that shares 5
// pages and then differs reuses exactly those.
TEST(EngineScheduler, PrefixCacheHitGivesTheSameOutput) {
  const auto p = prompt(100, 1);
  auto q = p;
  for (size_t i = 44; i < q.size(); ++i) q[i] = (q[i] + 1) % 512;  // differs from position 44 (page 5)
  const Result want_p = alone(greedy(p, 8)), want_q = alone(greedy(q, 8));

  runtime::Engine e(builtin(), config(256, true));
  const uint64_t first = e.submit(greedy(p, 8));
  auto r1 = run_all(e);
  EXPECT_EQ(r1[first].cached_prompt_tokens, 0);
  expect_same(r1[first], want_p, "first request");
  EXPECT_GT(e.stats().kv_pages_cached, 0);

  const uint64_t second = e.submit(greedy(p, 8));
  auto r2 = run_all(e);
  EXPECT_EQ(r2[second].cached_prompt_tokens, 96);
  expect_same(r2[second], want_p, "same prompt from the cache");

  const uint64_t third = e.submit(greedy(q, 8));
  auto r3 = run_all(e);
  EXPECT_EQ(r3[third].cached_prompt_tokens, 40);
  expect_same(r3[third], want_q, "shared first pages, then a different prompt");

  const runtime::EngineStats st = e.stats();
  EXPECT_EQ(st.prefix_cache_queries, 300);
  EXPECT_EQ(st.prefix_cache_hits, 96 + 40);
  // Prompt tokens computed: the cached ones are not.
  EXPECT_EQ(st.prompt_tokens_total, 100 + 4 + 60);
  expect_no_leak(e);
}

// Requests that share a prefix while both run (the second admitted after the first's prompt pages were
// cached) and requests with the cache off agree token for token.
TEST(EngineScheduler, ConcurrentSharingMatchesNoCache) {
  const auto base = prompt(48, 2);
  std::vector<runtime::Request> reqs;
  for (int i = 0; i < 4; ++i) {
    auto ids_i = base;
    ids_i.push_back(i + 1);
    for (int k = 0; k < i * 3; ++k) ids_i.push_back((k * 13 + i) % 512);
    reqs.push_back(greedy(ids_i, 10 + i));
  }
  runtime::Engine on(builtin(), config(256, true, 16)), off(builtin(), config(256, false, 16));
  std::vector<uint64_t> a, b;
  for (const auto& r : reqs) a.push_back(on.submit(r));
  auto got_on = run_all(on);
  for (const auto& r : reqs) b.push_back(off.submit(r));
  auto got_off = run_all(off);
  for (size_t i = 0; i < reqs.size(); ++i) {
    expect_same(got_on[a[i]], got_off[b[i]], "request " + std::to_string(i));
    expect_same(got_on[a[i]], alone(reqs[i]), "request " + std::to_string(i) + " alone");
  }
  EXPECT_EQ(off.stats().prefix_cache_hits, 0);
  EXPECT_EQ(off.stats().kv_pages_cached, 0);
  expect_no_leak(on);
  expect_no_leak(off);
}

// 4 requests of 4 pages each on a pool of 6 pages: the scheduler must preempt; every request still ends with
// exactly max_tokens tokens (none reported twice), the same as alone, with and without the cache.
TEST(EngineScheduler, PreemptionUnderATinyPoolGivesTheSameOutput) {
  std::vector<runtime::Request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy(prompt(10 + i, 10 + i), 20));
  runtime::Request seeded = greedy(prompt(9, 30), 20);
  seeded.sampling.temperature = 1.2f;
  seeded.sampling.seed = 77;
  seeded.sampling.repetition_penalty = 1.3f;  // the sampler state carries the seen tokens over preemption
  reqs.push_back(seeded);
  std::vector<Result> want;
  for (const auto& r : reqs) want.push_back(alone(r));
  for (bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "prefix cache on" : "prefix cache off");
    runtime::Engine e(builtin(), config(6, cache, 16));
    std::vector<uint64_t> id;
    for (const auto& r : reqs) id.push_back(e.submit(r));
    auto got = run_all(e);
    EXPECT_GT(e.stats().preemptions, 0);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[id[i]].finish, runtime::FinishReason::Length);
      EXPECT_EQ(got[id[i]].tokens.size(), 20u);
      EXPECT_EQ(got[id[i]].completion_tokens, 20);
      expect_same(got[id[i]], want[i], "request " + std::to_string(i));
    }
    EXPECT_EQ(e.stats().generation_tokens_total, 100);
    expect_no_leak(e);
  }
}

// Prefill chunks of 3 tokens (prompts spread over many steps, mixed with decodes) give what one-step
// prefills give.
TEST(EngineScheduler, ChunkedPrefillGivesTheSameOutput) {
  std::vector<runtime::Request> reqs = {greedy(prompt(41, 3), 6), greedy(prompt(5, 4), 12),
                                        greedy(prompt(23, 5), 9)};
  for (bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "prefix cache on" : "prefix cache off");
    runtime::Engine e(builtin(), config(128, cache, 3));
    std::vector<uint64_t> id;
    for (const auto& r : reqs) id.push_back(e.submit(r));
    auto got = run_all(e);
    for (size_t i = 0; i < reqs.size(); ++i)
      expect_same(got[id[i]], alone(reqs[i]), "request " + std::to_string(i));
    expect_no_leak(e);
  }
}

// A request cancelled while its prompt is half prefilled, another while decoding: both end Cancelled at the
// next step, their pages are free (or held only by the prefix cache) and the others are undisturbed.
TEST(EngineScheduler, CancelMidPrefillAndMidDecodeFreesPages) {
  for (bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "prefix cache on" : "prefix cache off");
    runtime::Engine e(builtin(), config(64, cache, 8));
    const auto keep_req = greedy(prompt(6, 6), 30);
    const uint64_t keep = e.submit(keep_req);
    const uint64_t decoding = e.submit(greedy(prompt(4, 7), 50));
    const uint64_t prefilling = e.submit(greedy(prompt(120, 8), 4));
    std::map<uint64_t, Result> got;
    auto collect = [&](const std::vector<runtime::RequestOutput>& outs) {
      for (const auto& o : outs) {
        got[o.request_id].tokens.insert(got[o.request_id].tokens.end(), o.tokens.begin(), o.tokens.end());
        got[o.request_id].finish = o.finish;
      }
    };
    for (int i = 0; i < 4; ++i) collect(e.step());
    ASSERT_FALSE(got[decoding].tokens.empty()) << "the short request should be decoding by now";
    ASSERT_TRUE(got[prefilling].tokens.empty()) << "the long prompt should still be prefilling";
    EXPECT_GT(e.stats().kv_pages_used, 0);
    EXPECT_TRUE(e.cancel(prefilling));
    EXPECT_TRUE(e.cancel(decoding));
    collect(e.step());
    EXPECT_EQ(got[prefilling].finish, runtime::FinishReason::Cancelled);
    EXPECT_EQ(got[decoding].finish, runtime::FinishReason::Cancelled);
    EXPECT_FALSE(e.cancel(prefilling));
    EXPECT_EQ(e.stats().running, 1);
    // Only `keep` (6 prompt + up to 6 generated tokens: 2 pages) and the cache hold pages now.
    EXPECT_LE(e.stats().kv_pages_used - e.stats().kv_pages_cached, 2);
    while (e.has_work()) collect(e.step());
    EXPECT_EQ(ids(got[keep]), ids(alone(keep_req)));
    expect_no_leak(e);
  }
}

// The cache gives way: a pool of 16 pages filled with cached prefixes still admits new prompts by evicting.
TEST(EngineScheduler, CachedPagesAreEvictedWhenNeeded) {
  runtime::Engine e(builtin(), config(16, true, 64));
  for (int i = 0; i < 6; ++i) {
    const auto r = greedy(prompt(40, 40 + i), 4);
    const uint64_t id = e.submit(r);
    auto got = run_all(e);
    EXPECT_EQ(ids(got[id]), ids(alone(r))) << "prompt " << i;
    EXPECT_LE(e.stats().kv_pages_used, 16);
  }
  EXPECT_GT(e.stats().kv_pages_cached, 0);
  expect_no_leak(e);
}

}  // namespace
}  // namespace ms
