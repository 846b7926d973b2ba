#include "eval/executor_factory.h"

#include "runtime/cpu_executor.h"

namespace ms::eval {

std::unique_ptr<runtime::Executor> make_executor(const MakeExecutor& make, const model::Model& model,
                                                 const runtime::ExecutorConfig& cfg) {
  if (make) return make(model, cfg);
  return std::make_unique<runtime::CpuExecutor>(
      std::shared_ptr<const model::Model>(&model, [](const model::Model*) {}), cfg);
}

}  // namespace ms::eval
