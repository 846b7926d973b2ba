// Where an evaluation runs: the command passes a factory for executors on the device it was asked for; an
// empty one means a CpuExecutor (the reference).
#pragma once

#include <functional>
#include <memory>

#include "model/model.h"
#include "runtime/executor.h"

namespace ms::eval {

// `model` outlives the executor.
using MakeExecutor = std::function<std::unique_ptr<runtime::Executor>(const model::Model& model,
                                                                      const runtime::ExecutorConfig&)>;

// `make(model, cfg)`, or a CpuExecutor over `model` when `make` is empty.
std::unique_ptr<runtime::Executor> make_executor(const MakeExecutor& make, const model::Model& model,
                                                 const runtime::ExecutorConfig& cfg);

}  // namespace ms::eval
