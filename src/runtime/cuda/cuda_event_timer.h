// The profiler's timer on a GPU: a CUDA event recorded on the executor's stream per marker, resolved after
// the step against an epoch event (profiled steps run without graphs, so every op's launches sit between its
// two markers).
#pragma once

#include <memory>

#include "profiler/timer.h"

namespace ms::runtime::cuda {

// stream: the cudaStream_t the executor launches on (null: the default stream). Throws without CUDA.
std::unique_ptr<profiler::TimerBackend> make_cuda_event_timer(void* stream);

}  // namespace ms::runtime::cuda
