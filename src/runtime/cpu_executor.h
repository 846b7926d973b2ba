// The CPU executor, the reference: weights stay where the loader put them (mmap'ed or owned host memory),
// KV pages, step buffers and the Workspace are host tensors allocated once at construction, and the ops run
// their CPU kernels. Logits come back as a view of the workspace (already host memory).
#pragma once

#include <memory>

#include "model/step_inputs.h"
#include "model/workspace.h"
#include "ops/ctx.h"
#include "runtime/executor.h"

namespace ms::runtime {

class CpuExecutor final : public Executor {
 public:
  CpuExecutor(std::shared_ptr<const model::Model> model, ExecutorConfig cfg);

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }
  KvCapacity kv_capacity() const override;
  const model::Model& model() const override { return *model_; }
  const ExecutorConfig& config() const override { return cfg_; }
  Tensor run(const kv::ForwardBatch& b, const model::StepRouting& routing = {},
             profiler::OpSink* sink = nullptr) override;
  void check_batch(const kv::ForwardBatch& b, const model::StepRouting& routing = {}) const override;

  const kv::KvPool& kv_pool() const { return pool_; }
  const model::Workspace& workspace() const { return ws_; }
  // The group of a sharded model's ranks (not owned; must outlive the executor's runs).
  void set_comm(dist::Communicator* comm) { ws_.comm = comm; }

 private:
  std::shared_ptr<const model::Model> model_;
  ExecutorConfig cfg_;
  ops::Ctx ctx_;
  kv::KvPool pool_;
  model::StepBuffers steps_;
  model::Workspace ws_;
};

// An executor config for steps up to what an engine's scheduler plans: max_running sequences, each a decode
// or a prefill chunk within max_prefill_tokens, on a pool of kv_cache_tokens.
ExecutorConfig executor_config_for(const model::Model& model, int32_t page_size, int64_t kv_cache_tokens,
                                   kv::KvCacheDType dtype, int max_running, int32_t max_prefill_tokens,
                                   int64_t max_context);

}  // namespace ms::runtime
