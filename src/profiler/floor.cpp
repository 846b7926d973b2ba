#include "profiler/floor.h"

#include <algorithm>

#include "core/error.h"

namespace ms::profiler {

double op_time_floor_us(const OpCost& cost, const Ceilings& ceilings) {
  return std::max(cost.bytes_floor / (ceilings.mem_gbps * 1e3), cost.flops / (ceilings.matrix_gflops * 1e3));
}

FloorSink::FloorSink(const Ceilings& ceilings) : ceilings_(ceilings) {
  MS_CHECK(ceilings.mem_gbps > 0 && ceilings.matrix_gflops > 0,
           "step floor: ceilings must be positive (memory {} GB/s, matrix {} GFLOP/s)", ceilings.mem_gbps,
           ceilings.matrix_gflops);
}

void FloorSink::op_begin(const OpInfo& info) {
  floor_us_ += op_time_floor_us(info.cost, ceilings_);
  bytes_floor_ += info.cost.bytes_floor;
  ++ops_;
}

}  // namespace ms::profiler
