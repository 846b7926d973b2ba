// The Profiler: an OpSink that times every op of the steps it records. Steps are bracketed by
// begin_step/end_step; the first `warmup_steps` are run but not recorded, and after `max_steps` recorded
// steps it stops recording (ops then cost a branch). Ops must not nest (in a recorded step, op_begin while an
// op is open throws): every microsecond of a step is charged to exactly one op or to the gaps between ops.
// One thread drives a Profiler (the executor's); it is not safe to share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profiler/op_record.h"
#include "profiler/timer.h"

namespace ms::profiler {

struct ProfilerOptions {
  int warmup_steps = 0;  // steps run before recording starts, not recorded
  int max_steps = 0;     // recorded steps at most; 0 = no limit
};

// One op of the ops seen, by name; records point at it by index.
struct OpIdentity {
  std::string name;  // "layer.12.attn.mla_decode"
  std::string kind;  // "attn.mla_decode"
};

// One op in one recorded step.
struct OpRecord {
  int32_t op = 0;                   // index into Profiler::identities()
  int32_t step = 0;                 // index into Profiler::steps()
  double begin_us = 0, end_us = 0;  // since the timer's epoch
  std::string shapes;
  OpCost cost;
  double dur_us() const { return end_us - begin_us; }
};

struct StepRecord {
  std::string label;  // "decode bs=4 ctx=1024", may be empty
  double begin_us = 0, end_us = 0;
  int32_t first_op = 0, num_ops = 0;  // its records: ops()[first_op, first_op + num_ops)
  double dur_us() const { return end_us - begin_us; }
};

class Profiler final : public OpSink {
 public:
  // timer null = a steady clock.
  explicit Profiler(ProfilerOptions options = {}, std::unique_ptr<TimerBackend> timer = nullptr);

  void begin_step(std::string_view label = {});
  // Throws ms::Error when an op is still open or op_end came without op_begin during the step.
  void end_step();
  // Drops the step in progress (e.g. after an exception in the forward pass).
  void abort_step();

  void op_begin(const OpInfo& info) override;
  void op_end() noexcept override;

  bool in_step() const { return in_step_; }
  bool recording() const { return in_step_ && recording_step_; }
  // True once max_steps steps are recorded.
  bool done() const { return options_.max_steps > 0 && steps_recorded() >= options_.max_steps; }
  int steps_seen() const { return steps_seen_; }  // warm-up included
  int steps_recorded() const { return static_cast<int>(steps_.size()); }
  const ProfilerOptions& options() const { return options_; }
  std::string_view timer_name() const { return timer_->name(); }

  const std::vector<OpIdentity>& identities() const { return identities_; }
  const std::vector<OpRecord>& ops() const { return records_; }
  const std::vector<StepRecord>& steps() const { return steps_; }

  // Forgets every recorded step (the warm-up count starts again).
  void clear();

 private:
  struct Pending {
    int32_t op;
    int32_t mark_begin, mark_end;
    std::string shapes;
    OpCost cost;
  };
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  int32_t intern(const OpInfo& info);

  ProfilerOptions options_;
  std::unique_ptr<TimerBackend> timer_;
  std::unordered_map<std::string, int32_t, NameHash, std::equal_to<>> ids_;
  std::vector<OpIdentity> identities_;
  std::vector<OpRecord> records_;
  std::vector<StepRecord> steps_;

  bool in_step_ = false, recording_step_ = false;
  int steps_seen_ = 0;
  std::string step_label_;
  int32_t step_mark_begin_ = 0;
  std::vector<Pending> pending_;  // ops of the step in progress; reused across steps
  size_t pending_count_ = 0;
  int32_t open_op_ = -1;          // index into pending_ of the op in progress, -1 when none
  std::string step_error_;        // an unbalanced op_end seen during the step
  std::vector<double> times_us_;  // scratch for resolve()
};

}  // namespace ms::profiler
