// The profile for people (a fixed-width table, longest op first) and for programs (a JSON summary).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "profiler/summary.h"

namespace ms::profiler {

// Ceilings, step time against its floor, then one row per op:
//   op  calls  time/step  share  GB/s  GFLOP/s  roofline  moved/floor  flags
// and a last row for the time outside ops. Flagged ops carry "bytes" and/or "time" in the flags column.
std::string format_table(const Summary& s);

// The same figures as JSON (times in microseconds, rates in GB/s and GFLOP/s, shares and roofline in 0..1).
nlohmann::json summary_json(const Summary& s);

}  // namespace ms::profiler
