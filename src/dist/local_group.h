// Ranks as threads of one process over host memory: the Communicator of the CPU executor's tensor / expert
// parallel runs and of the tests that prove a sharded forward equals the whole one.
//
// Every collective is two meetings of a reusable barrier over a shared slot table: each rank publishes its
// buffers and call (op, count, dtype) and waits for all; each reads every rank's input and computes its own
// result into private scratch (sums in rank order, in f32, so every rank gets bit-identical results); a
// second meeting says every rank has finished reading, and only then does each write its output (so in-place
// calls are safe). A rank that does not arrive within the timeout, or whose call differs from the others', or
// that aborts the group (LocalComm::abort, what an executor does when a rank's step throws), makes the others
// throw ms::Error naming it; the group then stays failed (every later call throws the first reason).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace ms::dist {

struct LocalGroupState;

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalGroupState> group, int rank);
  int rank() const override { return rank_; }
  int size() const override;
  std::string describe() const override;

  void all_reduce_sum(void* data, int64_t count, DType dtype, void* stream) override;
  void all_gather(const void* in, void* out, int64_t count, DType dtype, void* stream) override;
  void reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype, void* stream) override;
  void broadcast(void* data, int64_t count, DType dtype, int root, void* stream) override;
  void all_reduce_max(void* data, int64_t count, DType dtype, void* stream) override;
  void barrier() override;

  // Fails the group: ranks waiting in (or later entering) a collective throw "rank R failed: reason".
  void abort(const std::string& reason) override;

 private:
  enum class Op { AllReduceSum, AllGather, ReduceScatterSum, Broadcast, AllReduceMax, Barrier };
  // Publishes this rank's call, meets the others, checks every rank made the same call.
  void enter(Op op, const void* in, int64_t count, DType dtype, int root);
  // The second meeting: every rank has read every input; outputs may now be written.
  void leave(Op op);
  static const char* op_name(Op op);

  std::shared_ptr<LocalGroupState> g_;
  int rank_;
  std::vector<float> acc_;            // f32 scratch (sums, bf16 widened)
  std::vector<unsigned char> bytes_;  // result bytes before the write-out
};

class LocalGroup {
 public:
  // n communicators of one group, rank i at index i. A rank waiting longer than `timeout` for the others
  // throws naming the ranks that did not arrive.
  static std::vector<std::unique_ptr<LocalComm>> create(
      int n, std::chrono::milliseconds timeout = std::chrono::milliseconds(300000));
};

}  // namespace ms::dist
