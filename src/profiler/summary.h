// The profile of the recorded steps, op by op, against the roofline. Per op (by kind, summed over layers, or
// per name): calls and time per step, share of the step, achieved GB/s and GFLOP/s, % of the roofline, and
// bytes moved over the floor. Each op's time floor is max(bytes_floor / memory bandwidth, flops / matrix
// rate) summed over its calls; the step's floor is the sum over its ops.
#pragma once

#include <string>
#include <vector>

#include "profiler/ceilings.h"
#include "profiler/profiler.h"

namespace ms::profiler {

enum class GroupBy { Kind, Name };  // Kind: "attn.mla_decode" over all layers; Name: per layer (--per-layer)

// An op is flagged when it moves more than bytes_over_floor x its floor ("bytes"), or when its share of the
// step time is above time_over_floor_share x its share of the step's floor time and above min_share of the
// step ("time"): the op that eats the step while the roofline says it should be small.
struct FlagRules {
  double bytes_over_floor = 1.5;
  double time_over_floor_share = 2.0;
  double min_share = 0.05;
};

struct OpStats {
  std::string key;     // the kind or the name
  std::string shapes;  // of its first call, for reference
  double calls_per_step = 0;
  double time_us_per_step = 0;
  double bytes_floor_per_step = 0, bytes_moved_per_step = 0, flops_per_step = 0;
  double time_floor_us_per_step = 0;
  double share = 0;        // of the mean step time
  double floor_share = 0;  // of the step's floor time
  double gbps = 0;         // bytes moved / time
  double gflops = 0;
  double roofline = 0;          // time floor / time (1 = at the roofline)
  double moved_over_floor = 0;  // bytes moved / bytes floor; 0 when the op has no byte floor
  bool flag_bytes = false, flag_time = false;
  bool flagged() const { return flag_bytes || flag_time; }
};

struct Summary {
  Ceilings ceilings;
  GroupBy group = GroupBy::Kind;
  FlagRules rules;
  int steps = 0, warmup_steps = 0;
  std::string timer;
  double step_us_mean = 0, step_us_min = 0, step_us_max = 0;
  double ops_us_per_step = 0;          // time inside ops
  double outside_ops_us_per_step = 0;  // step time not in any op (host overhead, gaps between launches)
  double floor_us_per_step = 0;        // sum of the ops' time floors
  double roofline = 0;                 // floor / mean step time
  std::vector<OpStats> ops;            // by time per step, longest first
};

// Throws ms::Error when no step was recorded or a ceiling is not positive.
Summary summarize(const Profiler& profiler, const Ceilings& ceilings, GroupBy group = GroupBy::Kind,
                  const FlagRules& rules = {});

}  // namespace ms::profiler
