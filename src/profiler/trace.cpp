#include "profiler/trace.h"

#include <fstream>

#include "core/error.h"

namespace ms::profiler {

nlohmann::json trace_json(const Profiler& profiler, const TraceOptions& options) {
  using nlohmann::json;
  json events = json::array();
  const auto& steps = profiler.steps();
  const auto& ops = profiler.ops();
  const auto& ids = profiler.identities();
  const double t0 = steps.empty() ? 0 : steps.front().begin_us;
  for (size_t si = 0; si < steps.size(); ++si) {
    const StepRecord& st = steps[si];
    json args = {{"step", si}, {"ops", st.num_ops}};
    if (!st.label.empty()) args["label"] = st.label;
    events.push_back({{"name", st.label.empty() ? "step " + std::to_string(si) : st.label},
                      {"cat", "step"},
                      {"ph", "X"},
                      {"ts", st.begin_us - t0},
                      {"dur", st.dur_us()},
                      {"pid", options.pid},
                      {"tid", options.tid},
                      {"args", args}});
    for (int32_t i = st.first_op; i < st.first_op + st.num_ops; ++i) {
      const OpRecord& r = ops[i];
      events.push_back({{"name", ids[r.op].name},
                        {"cat", "op"},
                        {"ph", "X"},
                        {"ts", r.begin_us - t0},
                        {"dur", r.dur_us()},
                        {"pid", options.pid},
                        {"tid", options.tid},
                        {"args",
                         {{"kind", ids[r.op].kind},
                          {"step", si},
                          {"shapes", r.shapes},
                          {"bytes_floor", r.cost.bytes_floor},
                          {"bytes_moved", r.cost.moved()},
                          {"flops", r.cost.flops}}}});
    }
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"timer", std::string(profiler.timer_name())}, {"steps", steps.size()}}}};
}

void write_trace(const Profiler& profiler, const std::string& path, const TraceOptions& options) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  MS_CHECK(f.good(), "trace: cannot open '{}' for writing", path);
  f << trace_json(profiler, options).dump() << '\n';
  f.close();
  MS_CHECK(f.good(), "trace: writing '{}' failed", path);
}

}  // namespace ms::profiler
