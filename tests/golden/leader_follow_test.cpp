// One process per rank, as the GPU ranks will run, with ranks as threads of a LocalGroup: rank 0 runs a real
// Engine over a LeaderExecutor on its shard, ranks 1.. run follow_steps on theirs. Several greedy requests
// (batched, chunked prefill mixed with decodes, one finishing early) give the same tokens as the whole model
// on one rank, for TP2, EP2, TP2+EP2 and EP4 where experts divide; a rank that throws fails rank 0's step
// with a message naming it, and no rank waits forever.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <future>
#include <map>
#include <thread>

#include "core/error.h"
#include "dist/local_group.h"
#include "golden_fixture.h"
#include "kv/forward_batch.h"
#include "model/load_model.h"
#include "model/weight_loader.h"
#include "runtime/cpu_executor.h"
#include "runtime/engine.h"
#include "runtime/leader_executor.h"

namespace ms {
namespace {

using namespace std::chrono_literals;

runtime::EngineConfig engine_config() {
  runtime::EngineConfig c;
  c.page_size = 16;
  c.kv_cache_tokens = 1024;
  c.kv_cache_dtype = kv::KvCacheDType::F32;
  c.max_running = 4;
  c.max_prefill_tokens = 6;  // prompts are prefilled in chunks, beside other requests' decodes
  c.enable_prefix_cache = false;
  return c;
}

runtime::ExecutorConfig executor_config(const model::Model& m, const runtime::EngineConfig& c) {
  return runtime::executor_config_for(m, c.page_size, c.kv_cache_tokens, c.kv_cache_dtype, c.max_running,
                                      c.max_prefill_tokens, c.max_context);
}

// The fixture's prompts, greedy, each with its own length; the second stops well before the others.
std::vector<runtime::Request> requests(const test::Fixture& f) {
  std::vector<runtime::Request> out;
  const int lens[] = {7, 2, 5, 6};
  for (size_t i = 0; i < 4; ++i) {
    runtime::Request r;
    r.prompt_ids = f.prompts[i % f.prompts.size()];
    if (i >= f.prompts.size()) r.prompt_ids.resize(std::max<size_t>(1, r.prompt_ids.size() / 2));
    r.sampling.temperature = 0.0f;
    r.max_tokens = lens[i];
    r.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

struct Served {
  std::map<size_t, std::vector<int32_t>> tokens;  // request index -> tokens
  std::map<size_t, std::string> errors;           // request index -> error, for requests that failed
  int steps = 0;
};

// Submits every request and steps until all have finished (bounded, so a bug cannot loop forever).
Served serve(runtime::Engine& e, const std::vector<runtime::Request>& reqs) {
  Served s;
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < reqs.size(); ++i) index[e.submit(reqs[i])] = i;
  while (e.has_work() && s.steps < 500) {
    ++s.steps;
    for (const runtime::RequestOutput& o : e.step()) {
      const size_t i = index.at(o.request_id);
      for (const auto& t : o.tokens) s.tokens[i].push_back(t.token);
      if (o.finish == runtime::FinishReason::Error) s.errors[i] = o.error;
    }
  }
  return s;
}

// An executor that throws on its `fail_at`-th run (counting from 0), before touching the group.
class FailingExecutor final : public runtime::Executor {
 public:
  FailingExecutor(std::unique_ptr<runtime::Executor> inner, int fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  std::string_view name() const override { return "failing"; }
  Device device() const override { return inner_->device(); }
  runtime::KvCapacity kv_capacity() const override { return inner_->kv_capacity(); }
  const model::Model& model() const override { return inner_->model(); }
  const runtime::ExecutorConfig& config() const override { return inner_->config(); }
  void check_batch(const kv::ForwardBatch& b, const model::StepRouting& r) const override {
    inner_->check_batch(b, r);
  }
  Tensor run(const kv::ForwardBatch& b, const model::StepRouting& r, profiler::OpSink* sink) override {
    if (runs_++ == fail_at_) MS_THROW("planted failure in run {}", fail_at_);
    return inner_->run(b, r, sink);
  }

 private:
  std::unique_ptr<runtime::Executor> inner_;
  int fail_at_, runs_ = 0;
};

// One group of ranks as threads: rank 0 calls `lead` with its LeaderExecutor, the others run follow_steps.
// Rank fail_rank (>= 0) runs its executor through FailingExecutor(fail_at).
struct GroupRun {
  std::vector<std::string> follower_errors;  // [world] "" when follow_steps returned; index 0 unused
  std::vector<int64_t> follower_steps;       // [world] what follow_steps returned, -1 when it threw
  bool timed_out = false;
};

using Lead = std::function<void(std::unique_ptr<runtime::LeaderExecutor>)>;

GroupRun run_group(const std::vector<std::shared_ptr<model::Model>>& shards, const runtime::EngineConfig& ec,
                   const Lead& lead, int fail_rank = -1, int fail_at = 0) {
  const int n = static_cast<int>(shards.size());
  auto comms = dist::LocalGroup::create(n, 60s);
  std::vector<std::unique_ptr<runtime::Executor>> execs;
  for (int r = 0; r < n; ++r) {
    const auto& m = shards[static_cast<size_t>(r)];
    auto cpu = std::make_unique<runtime::CpuExecutor>(m, executor_config(*m, ec));
    cpu->set_comm(comms[static_cast<size_t>(r)].get());
    if (r == fail_rank)
      execs.push_back(std::make_unique<FailingExecutor>(std::move(cpu), fail_at));
    else
      execs.push_back(std::move(cpu));
  }
  GroupRun g;
  g.follower_errors.assign(static_cast<size_t>(n), "");
  g.follower_steps.assign(static_cast<size_t>(n), -1);
  std::vector<std::future<void>> done;
  // Every rank on a thread of its own with one OpenMP thread (the machine's cores are few; a caller's
  // spinning OpenMP team would starve the ranks).
  done.push_back(std::async(std::launch::async, [&] {
    omp_set_num_threads(1);
    lead(std::make_unique<runtime::LeaderExecutor>(*comms[0], std::move(execs[0])));
  }));
  for (int r = 1; r < n; ++r)
    done.push_back(std::async(std::launch::async, [&, r] {
      omp_set_num_threads(1);
      const auto i = static_cast<size_t>(r);
      try {
        g.follower_steps[i] = runtime::follow_steps(*comms[i], *execs[i]).steps;
      } catch (const Error& e) {
        g.follower_errors[i] = e.message();
      }
    }));
  const auto deadline = std::chrono::steady_clock::now() + 240s;
  for (auto& f : done)
    if (f.wait_until(deadline) == std::future_status::timeout && !g.timed_out) {
      g.timed_out = true;
      comms[0]->abort("the test timed out");  // every rank waiting in a collective throws
    }
  for (auto& f : done) f.get();  // rethrows what the leader's callback let escape
  return g;
}

::testing::AssertionResult has(const std::string& msg, const std::string& part) {
  if (msg.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << msg << "\" lacks \"" << part << "\"";
}

class LeaderFollow : public ::testing::TestWithParam<std::string> {};

// Plain routing, and OEA on the decode tokens (the plan carries the decode flags and the OEA settings).
void expect_ranks_match_one_rank(const test::Fixture& f, const std::string& name,
                                 const runtime::EngineConfig& ec) {
  const test::Fixture* fp = &f;
  const auto reqs = requests(f);
  Served want;
  {
    auto whole = std::make_shared<model::Model>(f.cfg, model::load_weights(f.cfg, *f.src));
    runtime::Engine e(whole, ec);
    want = serve(e, reqs);
  }
  ASSERT_TRUE(want.errors.empty());
  ASSERT_EQ(want.tokens.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    ASSERT_EQ(want.tokens[i].size(), static_cast<size_t>(reqs[i].max_tokens));

  struct Split {
    int tp, ep;
  };
  std::vector<Split> splits{{2, 1}, {1, 2}, {2, 2}};
  if (f.cfg.n_routed_experts % 4 == 0) splits.push_back({1, 4});
  for (const Split& s : splits) {
    SCOPED_TRACE(fmt::format("{} tp {} ep {} oea {}", name, s.tp, s.ep, ec.oea.enabled));
    const auto shards = model::load_model_shards(f.cfg, *f.src, s.tp, s.ep);
    Served got;
    int64_t leader_steps = -1;
    const GroupRun g = run_group(shards, ec, [&](std::unique_ptr<runtime::LeaderExecutor> leader) {
      const runtime::LeaderExecutor* l = leader.get();
      runtime::Engine e(std::move(leader), ec);  // its end broadcasts shutdown
      EXPECT_EQ(e.model().config().num_attention_heads, fp->cfg.num_attention_heads / s.tp);
      got = serve(e, reqs);
      leader_steps = l->steps();
    });
    ASSERT_FALSE(g.timed_out);
    EXPECT_TRUE(got.errors.empty()) << got.errors.begin()->second;
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.steps, want.steps);
    EXPECT_GT(leader_steps, 3);
    for (size_t r = 1; r < g.follower_errors.size(); ++r) {
      EXPECT_EQ(g.follower_errors[r], "") << "rank " << r;
      EXPECT_EQ(g.follower_steps[r], leader_steps) << "rank " << r;
    }
  }
}

TEST_P(LeaderFollow, EngineOverRanksMatchesOneRank) {
  auto f = test::load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  runtime::EngineConfig ec = engine_config();
  expect_ranks_match_one_rank(*f, GetParam(), ec);
  ec.oea.enabled = true;
  ec.oea.k0 = std::max(1, f->cfg.num_experts_per_tok / 2);
  expect_ranks_match_one_rank(*f, GetParam(), ec);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LeaderFollow, ::testing::Values("glm5_tiny", "deepseek_v3_tiny"));

// A rank whose step throws (a follower, or rank 0 itself) fails that step on every rank; rank 0's Engine
// reports it on the step's requests naming the rank, every later step fails too, and no rank waits.
TEST(LeaderFollowFailure, ARankThatThrowsIsNamed) {
  auto f = test::load_fixture("glm5_tiny");
  if (!f) GTEST_SKIP() << "fixture glm5_tiny is absent";
  const runtime::EngineConfig ec = engine_config();
  const auto reqs = requests(*f);
  for (int world : {2, 4}) {
    const auto shards = model::load_model_shards(f->cfg, *f->src, 1, world);
    for (int bad : {world - 1, 0}) {
      SCOPED_TRACE(fmt::format("ep {}, rank {} throws", world, bad));
      Served got;
      std::string later;
      const GroupRun g = run_group(
          shards, ec,
          [&](std::unique_ptr<runtime::LeaderExecutor> leader) {
            runtime::Engine e(std::move(leader), ec);
            got = serve(e, reqs);
            e.submit(reqs[0]);
            for (const auto& o : e.step()) later = o.error;
          },
          bad, 2);
      ASSERT_FALSE(g.timed_out);
      ASSERT_EQ(got.errors.size(), reqs.size());  // every request failed: in the step, or in a later one
      bool named = false;
      for (const auto& [i, why] : got.errors) {
        if (bad == 0)
          named |= has(why, "rank 0 of " + std::to_string(world) + ", step 2: planted failure in run 2");
        else
          named |= has(why, fmt::format("rank {} failed: step 2: planted failure in run 2", bad));
      }
      EXPECT_TRUE(named);
      EXPECT_TRUE(has(later, "the group failed in an earlier step"));
      for (int r = 1; r < world; ++r) {
        const std::string& err = g.follower_errors[static_cast<size_t>(r)];
        EXPECT_EQ(g.follower_steps[static_cast<size_t>(r)], -1);
        if (r == bad)
          EXPECT_TRUE(has(err, fmt::format("rank {} of {}, step 2: planted failure in run 2", r, world)));
        else
          EXPECT_TRUE(has(err, fmt::format("rank {} failed", bad))) << "rank " << r;
      }
    }
  }
}

// A batch rank 0 cannot run throws before it is broadcast; the group stays usable and shuts down cleanly.
TEST(LeaderFollowFailure, BadBatchIsRefusedBeforeTheBroadcast) {
  auto f = test::load_fixture("glm5_tiny");
  if (!f) GTEST_SKIP() << "fixture glm5_tiny is absent";
  const runtime::EngineConfig ec = engine_config();
  const auto shards = model::load_model_shards(f->cfg, *f->src, 2, 1);
  int64_t leader_steps = -1;
  const GroupRun g = run_group(shards, ec, [&](std::unique_ptr<runtime::LeaderExecutor> leader) {
    const int32_t far = leader->kv_capacity().num_pages + 5;
    kv::ForwardBatchBuilder bb(leader->kv_capacity().page_size);
    const int32_t tok = 3;
    bb.add_sequence({far}, 0, &tok, 1, true);
    EXPECT_THROW(leader->run(bb.finish()), Error);
    EXPECT_EQ(leader->steps(), 0);
    kv::ForwardBatchBuilder ok(leader->kv_capacity().page_size);
    ok.add_sequence({0}, 0, &tok, 1, true);
    EXPECT_EQ(leader->run(ok.finish()).size(0), 1);
    leader_steps = leader->steps();
    leader->shutdown();
    EXPECT_THROW(leader->run(ok.finish()), Error);
  });
  ASSERT_FALSE(g.timed_out);
  EXPECT_EQ(leader_steps, 1);
  EXPECT_EQ(g.follower_errors[1], "");
  EXPECT_EQ(g.follower_steps[1], 1);
}

// A follower that never comes: rank 0's first step throws naming it once the group's timeout passes.
TEST(LeaderFollowFailure, AbsentFollowerTimesOut) {
  auto f = test::load_fixture("glm5_tiny");
  if (!f) GTEST_SKIP() << "fixture glm5_tiny is absent";
  const runtime::EngineConfig ec = engine_config();
  const auto shards = model::load_model_shards(f->cfg, *f->src, 1, 2);
  auto comms = dist::LocalGroup::create(2, 1500ms);
  auto cpu = std::make_unique<runtime::CpuExecutor>(shards[0], executor_config(*shards[0], ec));
  cpu->set_comm(comms[0].get());
  runtime::LeaderExecutor leader(*comms[0], std::move(cpu));
  kv::ForwardBatchBuilder bb(ec.page_size);
  const int32_t tok = 3;
  bb.add_sequence({0}, 0, &tok, 1, true);
  std::string msg;
  try {
    leader.run(bb.finish());
  } catch (const Error& e) {
    msg = e.message();
  }
  EXPECT_TRUE(has(msg, "rank 0 of 2, step 0: local group: rank 1 did not reach broadcast within 1500 ms"));
}

}  // namespace
}  // namespace ms
