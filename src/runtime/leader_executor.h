// One process per rank of a sharded model: the Engine (scheduler, sampler) lives only in rank 0, and every
// step it runs must run on every rank. rank 0's Engine runs over a LeaderExecutor, which broadcasts each
// run() as a step plan (runtime/step_plan.h) and then runs rank 0's own executor; ranks 1..N-1 call
// follow_steps, which receives each plan and runs it on theirs, until the leader says shutdown.
//
// Per step: two broadcasts from rank 0 (the plan's word count, then its words, I32), then the forward with
// its own collectives. A rank whose step throws aborts the group (Communicator::abort) and rethrows, so the
// others stop at their next collective: over a LocalGroup rank 0's step throws naming that rank; over NCCL
// rank 0 sees the collective fail (the launcher names the rank whose process exited).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "runtime/executor.h"
#include "runtime/step_plan.h"

namespace ms::runtime {

// Where the plan's words sit while the communicator broadcasts them: host memory for a host transport
// (LocalComm), device memory on the executor's stream for NCCL.
class PlanStaging {
 public:
  virtual ~PlanStaging() = default;
  // A buffer of at least `words` int32 the communicator can broadcast; valid until the next reserve.
  virtual int32_t* reserve(size_t words) = 0;
  // Host words into the buffer, before the broadcast.
  virtual void upload(int32_t* buffer, std::span<const int32_t> words) = 0;
  // The buffer's words to the host, after the broadcast (waits for it to finish).
  virtual void download(std::span<int32_t> words, const int32_t* buffer) = 0;
  // The stream passed to the communicator (a cudaStream_t; null for host transports).
  virtual void* stream() const { return nullptr; }
  // Makes the buffer's device current on the calling thread (the leader's keepalives come from their own).
  virtual void bind_thread() {}
};

// Host memory; upload and download copy (the words are not broadcast in place, so the caller's stay intact).
class HostPlanStaging final : public PlanStaging {
 public:
  int32_t* reserve(size_t words) override;
  void upload(int32_t* buffer, std::span<const int32_t> words) override;
  void download(std::span<int32_t> words, const int32_t* buffer) override;

 private:
  std::vector<int32_t> buf_;
};

class LeaderExecutor final : public Executor {
 public:
  // comm: the group (rank 0 of it; not owned, must outlive this executor). local: rank 0's executor over its
  // shard, with comm already given to it (CpuExecutor::set_comm). staging: null = host memory.
  LeaderExecutor(dist::Communicator& comm, std::unique_ptr<Executor> local,
                 std::unique_ptr<PlanStaging> staging = nullptr);
  // Stops the keepalives, then broadcasts shutdown unless the group failed or shutdown() was called; logs
  // (never throws) on failure.
  ~LeaderExecutor() override;

  std::string_view name() const override { return "leader"; }
  Device device() const override { return local_->device(); }
  // rank 0's pages; every rank is sized alike (each caches the full latent), so they run the same batches.
  KvCapacity kv_capacity() const override { return local_->kv_capacity(); }
  const model::Model& model() const override { return local_->model(); }
  const ExecutorConfig& config() const override { return local_->config(); }
  // Checks the batch on rank 0 (a batch that cannot run throws here, before any rank sees it, and the group
  // stays usable), broadcasts it, runs rank 0's shard and returns its logits. The sink and expert stats see
  // rank 0 only. A failure after the broadcast (any rank's) aborts the group: this and every later run
  // throws "rank R of N: ...".
  Tensor run(const kv::ForwardBatch& b, const model::StepRouting& routing = {},
             profiler::OpSink* sink = nullptr) override;
  void check_batch(const kv::ForwardBatch& b, const model::StepRouting& routing = {}) const override {
    local_->check_batch(b, routing);
  }
  // As run(), with rank 0's executor choosing how its rows come back (summaries where it can make them).
  void run_rows(const kv::ForwardBatch& b, const LogitsRequest& req, StepLogits& out,
                const model::StepRouting& routing = {}, profiler::OpSink* sink = nullptr) override;
  bool supports_summaries() const override { return local_->supports_summaries(); }
  Tensor fetch_rows(std::span<const int32_t> rows) override { return local_->fetch_rows(rows); }
  std::unique_ptr<profiler::TimerBackend> make_timer() const override { return local_->make_timer(); }

  // Tells the followers to return from follow_steps; later runs throw. Throws when the broadcast fails.
  void shutdown();

  // Called once, with the step's error ("rank 0 of N, step S: ..."), when a step fails after its
  // broadcast: the group cannot run another step. Rank processes end rank 0 there (one process per rank
  // has no other way to go on); empty: run() throws and the Engine fails the step's requests.
  void set_on_group_failure(std::function<void(const std::string& message)> f) {
    on_group_failure_ = std::move(f);
  }

  // A server may sit idle longer than the communicator's timeout, which bounds the followers' wait for the
  // next plan: from now on a thread broadcasts a keepalive plan whenever `interval` passes without a step
  // (choose it well below that timeout). A keepalive that fails fails the group as a step would (so a rank
  // that died while idle is found within `interval`). Call once, before the Engine runs steps.
  void start_keepalive(std::chrono::milliseconds interval);
  int64_t keepalives() const;

  const Executor& local() const { return *local_; }
  int64_t steps() const { return step_; }

 private:
  void broadcast(StepOp op, const kv::ForwardBatch* b, const model::StepRouting* routing);
  // Checks, broadcasts and runs `local_step` on rank 0; a failure after the broadcast fails the group.
  template <typename F>
  void step(const kv::ForwardBatch& b, const model::StepRouting& routing, F&& local_step);
  // mu_ held: marks the group failed, tells the others, calls on_group_failure_.
  void fail_group(const std::string& what, const std::string& why);
  void keepalive_loop(std::chrono::milliseconds interval);

  dist::Communicator& comm_;
  std::unique_ptr<Executor> local_;
  std::unique_ptr<PlanStaging> staging_;
  std::vector<int32_t> words_;
  int64_t step_ = 0;
  bool failed_ = false, stopped_ = false;
  std::string failure_;
  std::function<void(const std::string&)> on_group_failure_;
  // Steps, shutdown and keepalives take turns on the communicator.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread keepalive_;
  bool keepalive_stop_ = false;
  int64_t keepalives_ = 0;
  std::chrono::steady_clock::time_point last_plan_ = std::chrono::steady_clock::now();
};

// What a follower did before shutdown.
struct FollowStats {
  int64_t steps = 0;
};

// before_step(s) runs before the follower runs step s (a test hook: a rank that dies mid-run).
using FollowHook = std::function<void(int64_t step)>;

// The loop of ranks 1..N-1: receives each plan from rank 0 and runs it on `local` (this rank's shard, given
// `comm`), discarding the logits, until the leader broadcasts shutdown. A plan that cannot be decoded, a step
// out of order, or a step that throws aborts the group with the reason and rethrows it as
// "rank R of N: ..." (the process should then exit non-zero). staging: null = host memory.
FollowStats follow_steps(dist::Communicator& comm, Executor& local, PlanStaging* staging = nullptr,
                         const FollowHook& before_step = {});

}  // namespace ms::runtime
