// The step boundary seen from the loop that runs forward passes (the Engine): before each forward pass it
// asks the hook for the op sink of that step (null: this step is not profiled), and after the step it says
// whether the step completed. A profile that is armed from another thread starts at the next step_begin.
#pragma once

#include <string_view>

#include "profiler/op_record.h"

namespace ms::profiler {

class StepHook {
 public:
  virtual ~StepHook() = default;
  // `label` describes the step ("decode tokens=8 seqs=8 ctx=1031"). Returns the sink the step's ops report
  // to, or null.
  virtual OpSink* step_begin(std::string_view label) = 0;
  // ok = false: the forward pass threw and the step is dropped. Called after every step_begin, once.
  virtual void step_end(bool ok) noexcept = 0;
};

}  // namespace ms::profiler
