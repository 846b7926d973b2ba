// Chrome / Perfetto trace export in the Trace Event Format (JSON object form): one complete ("X") event per
// op per recorded step, nested under one "X" event per step on the same track, ts and dur in microseconds
// from the first recorded step. Op events carry the op's kind, shapes, bytes (floor and moved) and FLOPs as
// args. Open the file in ui.perfetto.dev or chrome://tracing.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "profiler/profiler.h"

namespace ms::profiler {

struct TraceOptions {
  int pid = 0;  // one process per rank when ranks' traces are merged
  int tid = 0;  // the track: 0 = the host stream; a device backend may use its stream id
};

nlohmann::json trace_json(const Profiler& profiler, const TraceOptions& options = {});
// Writes trace_json to `path`; throws ms::Error naming the path when it cannot be written.
void write_trace(const Profiler& profiler, const std::string& path, const TraceOptions& options = {});

}  // namespace ms::profiler
