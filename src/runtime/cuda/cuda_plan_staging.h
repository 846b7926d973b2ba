// The step plan's words in device memory on the executor's stream, for broadcasting them over NCCL
// (runtime/leader_executor.h: PlanStaging).
#pragma once

#include <memory>

#include "runtime/leader_executor.h"

namespace ms::runtime::cuda {

// stream: the cudaStream_t the executor and its NcclComm run on. Throws without CUDA.
std::unique_ptr<PlanStaging> make_cuda_plan_staging(void* stream);

}  // namespace ms::runtime::cuda
