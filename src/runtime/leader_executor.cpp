#include "runtime/leader_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "core/log.h"

namespace ms::runtime {

namespace {

std::string message_of(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e)) return err->message();
  return e.what();
}

}  // namespace

int32_t* HostPlanStaging::reserve(size_t words) {
  if (buf_.size() < words) buf_.resize(words);
  return buf_.data();
}

void HostPlanStaging::upload(int32_t* buffer, std::span<const int32_t> words) {
  if (!words.empty() && buffer != words.data()) std::memcpy(buffer, words.data(), words.size_bytes());
}

void HostPlanStaging::download(std::span<int32_t> words, const int32_t* buffer) {
  if (!words.empty() && buffer != words.data()) std::memcpy(words.data(), buffer, words.size_bytes());
}

LeaderExecutor::LeaderExecutor(dist::Communicator& comm, std::unique_ptr<Executor> local,
                               std::unique_ptr<PlanStaging> staging)
    : comm_(comm), local_(std::move(local)), staging_(std::move(staging)) {
  MS_CHECK(local_ != nullptr, "leader executor: no local executor");
  MS_CHECK(comm_.rank() == 0, "leader executor on rank {} of {}: the leader is rank 0", comm_.rank(),
           comm_.size());
  if (!staging_) staging_ = std::make_unique<HostPlanStaging>();
}

LeaderExecutor::~LeaderExecutor() {
  {
    std::lock_guard lk(mu_);
    keepalive_stop_ = true;
  }
  cv_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
  if (failed_ || stopped_) return;
  try {
    shutdown();
  } catch (const std::exception& e) {
    MS_LOG_ERROR("rank 0 of {}: telling the other ranks to stop failed: {}", comm_.size(), message_of(e));
  }
}

void LeaderExecutor::broadcast(StepOp op, const kv::ForwardBatch* b, const model::StepRouting* routing) {
  encode_step_plan(op, step_, b, routing, words_);
  int32_t* buf = staging_->reserve(std::max<size_t>(words_.size(), 1));
  const int32_t n = static_cast<int32_t>(words_.size());
  staging_->upload(buf, std::span<const int32_t>(&n, 1));
  comm_.broadcast(buf, 1, DType::I32, 0, staging_->stream());
  staging_->upload(buf, words_);
  comm_.broadcast(buf, n, DType::I32, 0, staging_->stream());
}

void LeaderExecutor::fail_group(const std::string& what, const std::string& why) {
  failed_ = true;
  failure_ = fmt::format("rank 0 of {}, {}: {}", comm_.size(), what, why);
  comm_.abort(fmt::format("{}: {}", what, why));
  if (on_group_failure_) on_group_failure_(failure_);
}

void LeaderExecutor::start_keepalive(std::chrono::milliseconds interval) {
  MS_CHECK(interval.count() > 0, "leader executor: keepalive interval must be positive");
  MS_CHECK(!keepalive_.joinable(), "leader executor: keepalives already started");
  keepalive_ = std::thread(&LeaderExecutor::keepalive_loop, this, interval);
}

int64_t LeaderExecutor::keepalives() const {
  std::lock_guard lk(mu_);
  return keepalives_;
}

void LeaderExecutor::keepalive_loop(std::chrono::milliseconds interval) {
  try {
    staging_->bind_thread();
  } catch (const std::exception& e) {
    MS_LOG_ERROR("rank 0 of {}: keepalives cannot use the plan's buffer: {}", comm_.size(), message_of(e));
    return;
  }
  std::unique_lock lk(mu_);
  for (;;) {
    if (cv_.wait_until(lk, last_plan_ + interval, [&] { return keepalive_stop_ || failed_ || stopped_; }))
      return;
    if (std::chrono::steady_clock::now() < last_plan_ + interval) continue;  // a step came meanwhile
    try {
      broadcast(StepOp::Keepalive, nullptr, nullptr);
      ++keepalives_;
    } catch (const std::exception& e) {
      fail_group(fmt::format("keepalive before step {}", step_), message_of(e));
      return;
    }
    last_plan_ = std::chrono::steady_clock::now();
  }
}

template <typename F>
void LeaderExecutor::step(const kv::ForwardBatch& b, const model::StepRouting& routing, F&& local_step) {
  std::lock_guard lk(mu_);
  if (failed_) MS_THROW("the group failed in an earlier step: {}", failure_);
  if (stopped_) MS_THROW("rank 0 of {}: the group was shut down", comm_.size());
  // A batch that cannot run throws before any rank sees it; the group stays usable.
  local_->check_batch(b, routing);
  try {
    broadcast(StepOp::Run, &b, &routing);
    local_step();
    ++step_;
    last_plan_ = std::chrono::steady_clock::now();
  } catch (const std::exception& e) {
    // This rank's own failure, or the group's report of another rank's: either way the others must not
    // wait for rank 0 (abort is a no-op on a group that already failed).
    fail_group(fmt::format("step {}", step_), message_of(e));
    throw Error(failure_, __FILE__, __LINE__);
  }
}

Tensor LeaderExecutor::run(const kv::ForwardBatch& b, const model::StepRouting& routing,
                           profiler::OpSink* sink) {
  Tensor out;
  step(b, routing, [&] { out = local_->run(b, routing, sink); });
  return out;
}

void LeaderExecutor::run_rows(const kv::ForwardBatch& b, const LogitsRequest& req, StepLogits& out,
                              const model::StepRouting& routing, profiler::OpSink* sink) {
  step(b, routing, [&] { local_->run_rows(b, req, out, routing, sink); });
}

void LeaderExecutor::shutdown() {
  std::lock_guard lk(mu_);
  cv_.notify_all();
  if (stopped_) return;
  if (failed_) MS_THROW("the group failed in an earlier step: {}", failure_);
  stopped_ = true;
  broadcast(StepOp::Shutdown, nullptr, nullptr);
}

FollowStats follow_steps(dist::Communicator& comm, Executor& local, PlanStaging* staging,
                         const FollowHook& before_step) {
  HostPlanStaging host;
  PlanStaging& st = staging ? *staging : host;
  const int rank = comm.rank(), n = comm.size();
  MS_CHECK(rank != 0, "follow_steps on rank 0: rank 0 leads (LeaderExecutor)");
  FollowStats stats;
  std::vector<int32_t> words;
  try {
    for (;;) {
      int32_t count = 0;
      int32_t* buf = st.reserve(1);
      comm.broadcast(buf, 1, DType::I32, 0, st.stream());
      st.download(std::span<int32_t>(&count, 1), buf);
      if (count <= 0) MS_THROW("rank 0 announced a step plan of {} words", count);
      buf = st.reserve(static_cast<size_t>(count));
      comm.broadcast(buf, count, DType::I32, 0, st.stream());
      words.resize(static_cast<size_t>(count));
      st.download(words, buf);
      const StepPlan plan = decode_step_plan(words);
      MS_CHECK(plan.step == stats.steps, "step plan {} arrived where step {} was due", plan.step,
               stats.steps);
      if (plan.op == StepOp::Shutdown) return stats;
      if (plan.op == StepOp::Keepalive) continue;
      if (before_step) before_step(stats.steps);
      (void)local.run(plan.batch, plan.routing, nullptr);
      ++stats.steps;
    }
  } catch (const std::exception& e) {
    const std::string why = message_of(e);
    comm.abort(fmt::format("step {}: {}", stats.steps, why));
    throw Error(fmt::format("rank {} of {}, step {}: {}", rank, n, stats.steps, why), __FILE__, __LINE__);
  }
}

}  // namespace ms::runtime
