#include "profiler/summary.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "profiler/floor.h"

namespace ms::profiler {

namespace {

struct Totals {
  std::string shapes;
  double calls = 0, time_us = 0, bytes_floor = 0, bytes_moved = 0, flops = 0, time_floor_us = 0;
};

double ratio(double num, double den) {
  return den > 0 ? num / den : 0;
}

}  // namespace

Summary summarize(const Profiler& profiler, const Ceilings& ceilings, GroupBy group, const FlagRules& rules) {
  MS_CHECK(profiler.steps_recorded() > 0, "profile: no step was recorded ({} seen, {} warm-up)",
           profiler.steps_seen(), profiler.options().warmup_steps);
  MS_CHECK(ceilings.mem_gbps > 0 && ceilings.matrix_gflops > 0,
           "profile: ceilings must be positive (memory {} GB/s, matrix {} GFLOP/s)", ceilings.mem_gbps,
           ceilings.matrix_gflops);

  Summary s;
  s.ceilings = ceilings;
  s.group = group;
  s.rules = rules;
  s.steps = profiler.steps_recorded();
  s.warmup_steps = std::min(profiler.options().warmup_steps, profiler.steps_seen());
  s.timer = std::string(profiler.timer_name());

  const auto& steps = profiler.steps();
  double step_total = 0;
  s.step_us_min = steps.front().dur_us();
  s.step_us_max = steps.front().dur_us();
  for (const auto& st : steps) {
    step_total += st.dur_us();
    s.step_us_min = std::min(s.step_us_min, st.dur_us());
    s.step_us_max = std::max(s.step_us_max, st.dur_us());
  }
  const double n = s.steps;
  s.step_us_mean = step_total / n;

  // Totals per key, in order of first appearance (stable order among equal times).
  const auto& ids = profiler.identities();
  std::vector<int32_t> slot_of_id(ids.size(), -1);
  std::unordered_map<std::string, int32_t> slot_of_key;
  std::vector<Totals> totals;
  std::vector<std::string> keys;
  for (const auto& r : profiler.ops()) {
    int32_t& slot = slot_of_id[r.op];
    if (slot < 0) {
      const std::string& key = group == GroupBy::Kind ? ids[r.op].kind : ids[r.op].name;
      auto [it, inserted] = slot_of_key.emplace(key, static_cast<int32_t>(totals.size()));
      if (inserted) {
        totals.push_back({r.shapes});
        keys.push_back(key);
      }
      slot = it->second;
    }
    Totals& t = totals[slot];
    t.calls += 1;
    t.time_us += r.dur_us();
    t.bytes_floor += r.cost.bytes_floor;
    t.bytes_moved += r.cost.moved();
    t.flops += r.cost.flops;
    t.time_floor_us += op_time_floor_us(r.cost, ceilings);
  }

  double ops_total = 0, floor_total = 0;
  for (const auto& t : totals) {
    ops_total += t.time_us;
    floor_total += t.time_floor_us;
  }
  s.ops_us_per_step = ops_total / n;
  s.outside_ops_us_per_step = std::max(0.0, s.step_us_mean - s.ops_us_per_step);
  s.floor_us_per_step = floor_total / n;
  s.roofline = ratio(s.floor_us_per_step, s.step_us_mean);

  s.ops.reserve(totals.size());
  for (size_t i = 0; i < totals.size(); ++i) {
    const Totals& t = totals[i];
    OpStats o;
    o.key = keys[i];
    o.shapes = t.shapes;
    o.calls_per_step = t.calls / n;
    o.time_us_per_step = t.time_us / n;
    o.bytes_floor_per_step = t.bytes_floor / n;
    o.bytes_moved_per_step = t.bytes_moved / n;
    o.flops_per_step = t.flops / n;
    o.time_floor_us_per_step = t.time_floor_us / n;
    o.share = ratio(t.time_us, step_total);
    o.floor_share = ratio(t.time_floor_us, floor_total);
    o.gbps = ratio(t.bytes_moved, t.time_us) * 1e-3;  // bytes/us -> GB/s
    o.gflops = ratio(t.flops, t.time_us) * 1e-3;
    o.roofline = ratio(t.time_floor_us, t.time_us);
    o.moved_over_floor = ratio(t.bytes_moved, t.bytes_floor);
    o.flag_bytes = t.bytes_floor > 0 && t.bytes_moved > rules.bytes_over_floor * t.bytes_floor;
    o.flag_time = o.share > rules.min_share && o.share > rules.time_over_floor_share * o.floor_share;
    s.ops.push_back(std::move(o));
  }
  std::stable_sort(s.ops.begin(), s.ops.end(), [](const OpStats& a, const OpStats& b) {
    return a.time_us_per_step > b.time_us_per_step;
  });
  return s;
}

}  // namespace ms::profiler
