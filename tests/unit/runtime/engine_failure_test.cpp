// A step that fails in any way (ms::Error, std::bad_alloc, a runtime_error from a backend) fails the
// requests of that step and the Engine goes on: later requests run and match a clean engine's answer.
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

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

// Throws from step_begin (inside the step, before the forward pass) on the steps it is told to.
class FailingHook : public profiler::StepHook {
 public:
  enum class Kind { BadAlloc, Runtime, MsError };
  FailingHook(int fail_at, Kind kind) : fail_at_(fail_at), kind_(kind) {}
  profiler::OpSink* step_begin(std::string_view) override {
    if (++steps_ == fail_at_) {
      switch (kind_) {
        case Kind::BadAlloc:
          throw std::bad_alloc();
        case Kind::Runtime:
          throw std::runtime_error("injected backend failure");
        case Kind::MsError:
          MS_THROW("injected engine error");
      }
    }
    return nullptr;
  }
  void step_end(bool ok) noexcept override { ends_.push_back(ok); }
  int steps_ = 0;
  std::vector<bool> ends_;

 private:
  int fail_at_;
  Kind kind_;
};

runtime::EngineConfig config() {
  runtime::EngineConfig cfg;
  cfg.page_size = 8;
  cfg.kv_cache_tokens = 1024;
  cfg.kv_cache_dtype = kv::KvCacheDType::F32;
  cfg.enable_prefix_cache = false;  // so that every page is free once nothing runs
  return cfg;
}

runtime::Request req(std::vector<int32_t> ids, int max_tokens) {
  runtime::Request r;
  r.prompt_ids = std::move(ids);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

struct Outcome {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, runtime::FinishReason> finish;
  std::map<uint64_t, std::string> error;
};

Outcome run_all(runtime::Engine& e) {
  Outcome r;
  for (int guard = 0; e.has_work() && guard < 1000; ++guard)
    for (const auto& o : e.step()) {
      for (const auto& g : o.tokens) r.tokens[o.request_id].push_back(g.token);
      if (o.finish != runtime::FinishReason::None) {
        r.finish[o.request_id] = o.finish;
        r.error[o.request_id] = o.error;
      }
    }
  return r;
}

std::vector<int32_t> clean_answer(const std::vector<int32_t>& prompt, int n) {
  runtime::Engine e(builtin(), config());
  const uint64_t id = e.submit(req(prompt, n));
  return run_all(e).tokens[id];
}

class EngineStepFailure : public ::testing::TestWithParam<FailingHook::Kind> {};

TEST_P(EngineStepFailure, FailsThatStepsRequestsAndLaterRequestsSucceed) {
  runtime::Engine e(builtin(), config());
  FailingHook hook(/*fail_at=*/3, GetParam());
  e.set_step_hook(&hook);
  const std::vector<int32_t> a = {5, 6, 7, 8, 9}, b = {100, 200, 300};
  const uint64_t ia = e.submit(req(a, 10)), ib = e.submit(req(b, 10));
  Outcome first = run_all(e);
  EXPECT_EQ(first.finish[ia], runtime::FinishReason::Error);
  EXPECT_EQ(first.finish[ib], runtime::FinishReason::Error);
  EXPECT_EQ(first.tokens[ia].size(), 2u);  // two steps went through before the third failed
  const char* expect = GetParam() == FailingHook::Kind::Runtime   ? "injected backend failure"
                       : GetParam() == FailingHook::Kind::MsError ? "injected engine error"
                                                                  : "bad_alloc";
  EXPECT_NE(first.error[ia].find(expect), std::string::npos) << first.error[ia];
  EXPECT_EQ(e.stats().kv_pages_used, 0);  // the failed requests' pages are back
  ASSERT_GE(hook.ends_.size(), 3u);
  EXPECT_FALSE(hook.ends_[2]);

  // The engine goes on: the same prompts now run to their end with the answer of an engine that never failed.
  const uint64_t ja = e.submit(req(a, 10)), jb = e.submit(req(b, 10));
  Outcome second = run_all(e);
  EXPECT_EQ(second.finish[ja], runtime::FinishReason::Length);
  EXPECT_EQ(second.finish[jb], runtime::FinishReason::Length);
  EXPECT_EQ(second.tokens[ja], clean_answer(a, 10));
  EXPECT_EQ(second.tokens[jb], clean_answer(b, 10));
  EXPECT_EQ(e.stats().kv_pages_used, 0);
  e.set_step_hook(nullptr);
}

INSTANTIATE_TEST_SUITE_P(AnyException, EngineStepFailure,
                         ::testing::Values(FailingHook::Kind::BadAlloc, FailingHook::Kind::Runtime,
                                           FailingHook::Kind::MsError));

// A block table that leaves a visible position without a page is refused before any kernel reads it.
TEST(ModelForward, RefusesABlockTableWithAMissingPage) {
  auto m = builtin();
  test::ExecPool pool(*m, 8, 8, kv::KvCacheDType::F32);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.allocator().allocate(2, pages));
  std::vector<int32_t> ids(12, 3);
  kv::ForwardBatchBuilder bb(8);
  bb.add_sequence(pages, 0, ids.data(), 12, true);
  kv::ForwardBatch b = bb.finish();
  EXPECT_NO_THROW(pool.forward(b));
  b.block_table[1] = -1;  // positions 8..11 are visible to the last token but have no page
  try {
    pool.forward(b);
    ADD_FAILURE() << "a block table with a hole was accepted";
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("sequence 0 has no page for positions [8, 12)"), std::string::npos)
        << err.message();
  }
}

}  // namespace
}  // namespace ms
