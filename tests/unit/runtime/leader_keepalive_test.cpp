// Keepalives of an idle leader: the followers' wait for the next plan is bounded by the communicator's
// timeout, so a server without requests must still send something; and a rank lost while idle is found.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/local_group.h"
#include "runtime/leader_executor.h"

namespace ms {
namespace {

using namespace std::chrono_literals;

// Keepalives and shutdown never run a forward: every step-running call fails the test.
class NoStepExecutor final : public runtime::Executor {
 public:
  std::string_view name() const override { return "no-step"; }
  Device device() const override { return Device::CPU; }
  runtime::KvCapacity kv_capacity() const override { return {}; }
  const model::Model& model() const override { MS_THROW("no model here"); }
  const runtime::ExecutorConfig& config() const override { return cfg_; }
  Tensor run(const kv::ForwardBatch&, const model::StepRouting&, profiler::OpSink*) override {
    ADD_FAILURE() << "a keepalive ran a forward";
    MS_THROW("no forward here");
  }

 private:
  runtime::ExecutorConfig cfg_;
};

TEST(LeaderKeepalive, AnIdleGroupOutlivesTheCommunicatorsTimeout) {
  auto comms = dist::LocalGroup::create(2, 300ms);
  std::string follower_error = "not finished";
  int64_t followed = -1;
  std::thread follower([&] {
    NoStepExecutor local;
    try {
      followed = runtime::follow_steps(*comms[1], local).steps;
      follower_error.clear();
    } catch (const Error& e) {
      follower_error = e.message();
    }
  });
  int64_t keepalives = 0;
  {
    runtime::LeaderExecutor leader(*comms[0], std::make_unique<NoStepExecutor>());
    leader.start_keepalive(60ms);
    std::this_thread::sleep_for(1200ms);  // four times the group's timeout, no step
    keepalives = leader.keepalives();
  }  // shutdown
  follower.join();
  EXPECT_EQ(follower_error, "");
  EXPECT_EQ(followed, 0);
  EXPECT_GE(keepalives, 5);
}

TEST(LeaderKeepalive, ARankLostWhileIdleFailsTheGroupNamingIt) {
  auto comms = dist::LocalGroup::create(2, 5000ms);
  runtime::LeaderExecutor leader(*comms[0], std::make_unique<NoStepExecutor>());
  std::mutex mu;
  std::string failure;
  leader.set_on_group_failure([&](const std::string& m) {
    std::lock_guard lk(mu);
    failure = m;
  });
  comms[1]->abort("its process ended");
  leader.start_keepalive(20ms);
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard lk(mu);
      if (!failure.empty()) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard lk(mu);
  EXPECT_EQ(failure, "rank 0 of 2, keepalive before step 0: local group: rank 1 failed: its process ended");
}

}  // namespace
}  // namespace ms
