// Tensor / expert parallelism on the CPU: N ranks as threads of this process, each a CpuExecutor over its
// shard of the model (model::load_model_shards) and its dist::LocalComm of one LocalGroup. A step runs every
// rank on its own thread over the same batch; rank 0's logits are returned (every
// rank computes the same ones). Each rank holds a full KV pool for the latent cache (MLA's latent is shared
// by all heads), so the capacity is the smallest rank's. A rank that throws aborts the group: the others stop
// at their next collective and the step throws naming the rank; the executor is then unusable.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "dist/local_group.h"
#include "runtime/cpu_executor.h"

namespace ms::runtime {

class LocalParallelExecutor final : public Executor {
 public:
  // ranks[r]: rank r's model (shard() says its place in the group, which must be max(tp, ep) ranks).
  LocalParallelExecutor(std::vector<std::shared_ptr<const model::Model>> ranks, ExecutorConfig cfg,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(300000));

  std::string_view name() const override { return "cpu-parallel"; }
  Device device() const override { return Device::CPU; }
  KvCapacity kv_capacity() const override;
  const model::Model& model() const override { return ranks_.front()->model(); }
  const ExecutorConfig& config() const override { return ranks_.front()->config(); }
  // The profiler's sink and the expert stats go to rank 0 only.
  Tensor run(const kv::ForwardBatch& b, const model::StepRouting& routing = {},
             profiler::OpSink* sink = nullptr) override;
  void check_batch(const kv::ForwardBatch& b, const model::StepRouting& routing = {}) const override {
    ranks_.front()->check_batch(b, routing);
  }

  int world_size() const { return static_cast<int>(ranks_.size()); }
  const CpuExecutor& rank(int r) const { return *ranks_.at(static_cast<size_t>(r)); }

 private:
  std::vector<std::unique_ptr<dist::LocalComm>> comms_;
  std::vector<std::unique_ptr<CpuExecutor>> ranks_;
  int omp_threads_ = 1;  // OpenMP threads per rank: the machine's split over the ranks
  bool failed_ = false;
};

}  // namespace ms::runtime
