// The Engine on the built-in model: greedy continuations equal a full recomputation, concurrent requests
// do not disturb each other, cancel and bad input behave.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/builtin_model.h"
#include "runtime/engine.h"

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
    kv::KvPool pool(m.kv_pool_config(16, 16, kv::KvCacheDType::F32));
    std::vector<int32_t> pages;
    EXPECT_TRUE(pool.allocator().allocate(pool.pages_for(static_cast<int64_t>(ids.size())), pages));
    kv::ForwardBatchBuilder bb(16);
    bb.add_sequence(pages, 0, ids.data(), static_cast<int32_t>(ids.size()), true);
    Tensor lg = m.forward(bb.finish(), pool);
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
  cfg.max_batch_tokens = 16;  // forces chunked prefill of the long prompt, mixed with decodes
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
  EXPECT_EQ(e.stats().kv_pages_used, 0);
  EXPECT_EQ(e.stats().generation_tokens_total, 27);
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
  EXPECT_FALSE(e.has_work());
}

}  // namespace
}  // namespace ms
