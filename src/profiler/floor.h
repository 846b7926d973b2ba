// The roofline floor of an op from its cost model alone: what profiler::summarize charges each recorded call,
// and what a benchmark sums over one forward pass it does not otherwise time.
#pragma once

#include <cstdint>

#include "profiler/ceilings.h"
#include "profiler/op_record.h"

namespace ms::profiler {

// One call's time floor in microseconds: max(bytes_floor / memory bandwidth, flops / matrix rate).
double op_time_floor_us(const OpCost& cost, const Ceilings& ceilings);

// Sums the time floors of the ops it is given (their cost models only, nothing timed): the floor of a step
// that a benchmark times without a profiler, from one forward pass with this sink attached.
class FloorSink final : public OpSink {
 public:
  // Throws ms::Error when a ceiling is not positive.
  explicit FloorSink(const Ceilings& ceilings);
  void op_begin(const OpInfo& info) override;
  void op_end() noexcept override {}
  double floor_us() const { return floor_us_; }
  double bytes_floor() const { return bytes_floor_; }
  int64_t ops() const { return ops_; }

 private:
  Ceilings ceilings_;
  double floor_us_ = 0, bytes_floor_ = 0;
  int64_t ops_ = 0;
};

}  // namespace ms::profiler
