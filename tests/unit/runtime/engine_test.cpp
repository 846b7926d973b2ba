// The Engine on the built-in model: greedy continuations equal a full recomputation, concurrent requests
// do not disturb each other, cancel and bad input behave.
#include <gtest/gtest.h>

#include <thread>

#include <chrono>

#include <cmath>

#include "core/error.h"
#include "model/builtin_model.h"
#include "runtime/engine.h"
#include "test_executor.h"

namespace ms {
namespace {

std::shared_ptr<model::Model> builtin() {
  static std::shared_ptr<model::Model> m = model::make_builtin_model();
  return m;
}

// Greedy continuation by recomputing the whole sequence each token (no cache reuse).
std::vector<int32_t> greedy_by_recompute(model::Model& m, std::vector<int32_t> ids, int n) {
  std::vector<int32_t> out;
  const int64_t V = m.config().vocab_size;
  for (int i = 0; i < n; ++i) {
    test::ExecPool pool(m, 16, 16, kv::KvCacheDType::F32);
    std::vector<int32_t> pages;
    EXPECT_TRUE(pool.allocator().allocate(pool.pages_for(static_cast<int64_t>(ids.size())), pages));
    kv::ForwardBatchBuilder bb(16);
    bb.add_sequence(pages, 0, ids.data(), static_cast<int32_t>(ids.size()), true);
    Tensor lg = pool.forward(bb.finish());
    const float* row = lg.data<float>();
    const int32_t best = static_cast<int32_t>(std::max_element(row, row + V) - row);
    out.push_back(best);
    ids.push_back(best);
  }
  return out;
}

std::map<uint64_t, std::vector<int32_t>> run_all(runtime::Engine& e,
                                                 std::map<uint64_t, runtime::FinishReason>* why = nullptr) {
  std::map<uint64_t, std::vector<int32_t>> toks;
  for (int guard = 0; e.has_work() && guard < 1000; ++guard)
    for (const auto& o : e.step()) {
      for (const auto& g : o.tokens) toks[o.request_id].push_back(g.token);
      if (why && o.finish != runtime::FinishReason::None) (*why)[o.request_id] = o.finish;
    }
  return toks;
}

runtime::Request req(std::vector<int32_t> ids, int max_tokens) {
  runtime::Request r;
  r.prompt_ids = std::move(ids);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

TEST(Engine, GreedyMatchesRecomputationAndBatchingIsInvisible) {
  runtime::EngineConfig cfg;
  cfg.page_size = 8;
  cfg.kv_cache_tokens = 1024;
  cfg.kv_cache_dtype = kv::KvCacheDType::F32;
  cfg.max_prefill_tokens = 16;  // forces chunked prefill of the long prompt, mixed with decodes
  runtime::Engine e(builtin(), cfg);
  std::vector<int32_t> a = {72, 101, 108, 108, 111}, b, c = {7};
  for (int i = 0; i < 40; ++i) b.push_back((i * 37 + 11) % 512);
  const uint64_t ia = e.submit(req(a, 12)), ib = e.submit(req(b, 6)), ic = e.submit(req(c, 9));
  std::map<uint64_t, runtime::FinishReason> why;
  auto toks = run_all(e, &why);
  EXPECT_EQ(toks[ia], greedy_by_recompute(*builtin(), a, 12));
  EXPECT_EQ(toks[ib], greedy_by_recompute(*builtin(), b, 6));
  EXPECT_EQ(toks[ic], greedy_by_recompute(*builtin(), c, 9));
  EXPECT_EQ(why[ia], runtime::FinishReason::Length);
  EXPECT_EQ(e.stats().kv_pages_used, e.stats().kv_pages_cached);  // the prefix cache keeps whole pages
  EXPECT_EQ(e.stats().generation_tokens_total, 27);
}

runtime::Request sampled(std::vector<int32_t> ids, int max_tokens, uint64_t seed) {
  runtime::Request r = req(std::move(ids), max_tokens);
  r.sampling.temperature = 1.3f;  // flat enough that the draw, not the argmax, decides
  r.sampling.top_p = 0.95f;
  r.sampling.top_k = 200;
  r.sampling.seed = seed;
  r.sampling.top_logprobs = 3;
  r.ignore_eos = true;
  return r;
}

runtime::EngineConfig small_pages() {
  runtime::EngineConfig cfg;
  cfg.page_size = 8;
  cfg.kv_cache_tokens = 2048;
  cfg.kv_cache_dtype = kv::KvCacheDType::F32;
  cfg.max_prefill_tokens = 24;
  return cfg;
}

std::vector<runtime::GeneratedToken> run_one(const runtime::Request& r) {
  runtime::Engine e(builtin(), small_pages());
  const uint64_t id = e.submit(r);
  std::vector<runtime::GeneratedToken> got;
  while (e.has_work())
    for (const auto& o : e.step())
      if (o.request_id == id) got.insert(got.end(), o.tokens.begin(), o.tokens.end());
  return got;
}

std::vector<int32_t> ids_of(const std::vector<runtime::GeneratedToken>& g) {
  std::vector<int32_t> ids;
  for (const auto& t : g) ids.push_back(t.token);
  return ids;
}

// A seeded request draws the same tokens alone or in a batch with others, submitted first or last; another
// seed draws other tokens; logprobs are those of the model's distribution.
TEST(Engine, SeededSamplingIsReproducibleAndIndependentOfTheBatch) {
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 44, 32};
  const auto alone = run_one(sampled(prompt, 20, 1234));
  ASSERT_EQ(alone.size(), 20u);
  EXPECT_EQ(ids_of(run_one(sampled(prompt, 20, 1234))), ids_of(alone));
  EXPECT_NE(ids_of(run_one(sampled(prompt, 20, 99))), ids_of(alone));
  const auto greedy = ids_of(run_one(req(prompt, 20)));
  EXPECT_NE(ids_of(alone), greedy) << "temperature 1.3 drew exactly the greedy tokens: the draw is not used";

  runtime::Engine e(builtin(), small_pages());
  std::vector<int32_t> longp;
  for (int i = 0; i < 30; ++i) longp.push_back((i * 53 + 5) % 512);
  const uint64_t o1 = e.submit(sampled(longp, 9, 7));
  const uint64_t o2 = e.submit(req({3, 4}, 15));
  const uint64_t mine = e.submit(sampled(prompt, 20, 1234));
  const uint64_t o3 = e.submit(sampled(prompt, 20, 1235));
  auto toks = run_all(e);
  EXPECT_EQ(toks[mine], ids_of(alone)) << "batch composition changed a seeded request's tokens";
  EXPECT_NE(toks[o3], toks[mine]);
  EXPECT_EQ(toks[o1].size(), 9u);
  EXPECT_EQ(toks[o2].size(), 15u);

  for (const auto& g : alone) {
    ASSERT_EQ(g.top_logprobs.size(), 3u);
    EXPECT_LE(g.logprob, 0.0f);
    EXPECT_GE(g.top_logprobs[0].logprob, g.top_logprobs[1].logprob);
    EXPECT_GE(g.top_logprobs[0].logprob, g.logprob);
    const float p = std::exp(g.top_logprobs[0].logprob);
    EXPECT_GT(p, 0.0f);
    EXPECT_LE(p, 1.0f);
  }
}

// Logprobs are the log-softmax of the model's logits at that position (recomputed here without the cache).
TEST(Engine, LogprobsAreTheModelsLogSoftmax) {
  runtime::Request r = req({10, 20, 30, 40}, 3);
  r.sampling.top_logprobs = 2;
  const auto got = run_one(r);
  ASSERT_EQ(got.size(), 3u);
  std::vector<int32_t> ids = r.prompt_ids;
  const int64_t V = builtin()->config().vocab_size;
  for (const auto& g : got) {
    test::ExecPool pool(*builtin(), 16, 16, kv::KvCacheDType::F32);
    std::vector<int32_t> pages;
    ASSERT_TRUE(pool.allocator().allocate(pool.pages_for(static_cast<int64_t>(ids.size())), pages));
    kv::ForwardBatchBuilder bb(16);
    bb.add_sequence(pages, 0, ids.data(), static_cast<int32_t>(ids.size()), true);
    Tensor lg = pool.forward(bb.finish());
    const float* row = lg.data<float>();
    const float mx = *std::max_element(row, row + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
    const double want = row[g.token] - mx - std::log(sum);
    EXPECT_NEAR(g.logprob, want, 1e-4);
    ASSERT_EQ(g.top_logprobs.size(), 2u);
    EXPECT_EQ(g.top_logprobs[0].token, g.token);  // greedy: the chosen token is the most likely
    ids.push_back(g.token);
  }
}

TEST(Engine, CancelEndsTheRequestAndFreesPages) {
  runtime::EngineConfig cfg;
  cfg.kv_cache_tokens = 1024;
  cfg.page_size = 16;
  runtime::Engine e(builtin(), cfg);
  const uint64_t id = e.submit(req({1, 2, 3}, 50));
  e.step();
  EXPECT_GT(e.stats().kv_pages_used, 0);
  EXPECT_TRUE(e.cancel(id));
  auto outs = e.step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish, runtime::FinishReason::Cancelled);
  EXPECT_EQ(e.stats().kv_pages_used, 0);
  EXPECT_FALSE(e.has_work());
  EXPECT_FALSE(e.cancel(id));
}

// The busy-loop counters the server exports (/metrics) and `moeserve bench` reads: every model step counted,
// the executor's part within the steps' time, gaps only between steps that left work.
TEST(Engine, LoopCountersAddUpOverTheBusySteps) {
  runtime::EngineConfig cfg;
  cfg.kv_cache_tokens = 1024;
  cfg.page_size = 16;
  runtime::Engine e(builtin(), cfg);
  EXPECT_EQ(e.stats().model_steps_total, 0);
  e.submit(req({1, 2, 3}, 6));
  e.submit(req({4, 5}, 4));
  int steps = 0;
  while (e.has_work()) {
    e.step();
    ++steps;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the caller's own work between steps
  }
  const runtime::EngineStats s = e.stats();
  EXPECT_EQ(s.model_steps_total, steps);
  EXPECT_GT(s.executor_seconds_total, 0.0);
  EXPECT_LE(s.executor_seconds_total, s.step_seconds_total);
  // steps - 1 gaps of at least the 2 ms sleep (the last step left no work: no gap after it).
  EXPECT_GE(s.gap_seconds_total, 0.002 * (steps - 1) * 0.9);
  const double gap_before = s.gap_seconds_total;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // idle: not a gap
  e.submit(req({7}, 1));
  while (e.has_work()) e.step();
  EXPECT_LT(e.stats().gap_seconds_total - gap_before, 0.015);
}

void expect_error(runtime::Engine& e, runtime::Request r, const std::string& needle) {
  try {
    e.submit(std::move(r));
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& err) {
    EXPECT_NE(err.message().find(needle), std::string::npos) << err.message();
  }
}

TEST(Engine, BadInputIsRefusedWithAClearMessage) {
  runtime::EngineConfig cfg;
  cfg.kv_cache_tokens = 256;
  cfg.page_size = 16;
  runtime::Engine e(builtin(), cfg);
  expect_error(e, req({}, 4), "prompt is empty");
  expect_error(e, req({1, 512, 3}, 4), "token id 512 at position 1 is outside the vocabulary [0, 512)");
  expect_error(e, req({1, -2}, 4), "token id -2");
  expect_error(e, req({1, 2}, 0), "max_tokens must be at least 1");
  expect_error(e, req({1, 2}, 5000), "past the context limit of 4096");
  expect_error(e, req({1, 2}, 300), "does not fit the KV cache of 256 tokens");
  runtime::Request r = req({1, 2}, 4);
  r.sampling.top_p = 0;
  expect_error(e, r, "top_p must be in (0, 1]");
  r = req({1, 2}, 4);
  r.sampling.temperature = -1;
  expect_error(e, r, "temperature");
  r = req({1, 2}, 4);
  r.sampling.top_logprobs = 21;
  expect_error(e, r, "top_logprobs");
  EXPECT_FALSE(e.has_work());
}

}  // namespace
}  // namespace ms
