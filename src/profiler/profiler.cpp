#include "profiler/profiler.h"

#include "core/error.h"

namespace ms::profiler {

Profiler::Profiler(ProfilerOptions options, std::unique_ptr<TimerBackend> timer)
    : options_(options), timer_(timer ? std::move(timer) : make_steady_clock_timer()) {
  MS_CHECK(options_.warmup_steps >= 0, "profiler warmup_steps must be >= 0, got {}", options_.warmup_steps);
  MS_CHECK(options_.max_steps >= 0, "profiler max_steps must be >= 0, got {}", options_.max_steps);
}

int32_t Profiler::intern(const OpInfo& info) {
  auto it = ids_.find(info.name);
  if (it != ids_.end()) return it->second;
  MS_CHECK(!info.name.empty(), "profiler: an op without a name (kind '{}', shapes '{}')", info.kind,
           info.shapes);
  auto id = static_cast<int32_t>(identities_.size());
  std::string_view kind = info.kind.empty() ? op_kind_of(info.name) : info.kind;
  identities_.push_back({std::string(info.name), std::string(kind)});
  ids_.emplace(std::string(info.name), id);
  return id;
}

void Profiler::begin_step(std::string_view label) {
  MS_CHECK(!in_step_, "profiler: begin_step while step {} is still open (call end_step or abort_step)",
           steps_seen_);
  in_step_ = true;
  recording_step_ = steps_seen_ >= options_.warmup_steps && !done();
  ++steps_seen_;
  pending_count_ = 0;
  open_op_ = -1;
  step_error_.clear();
  if (!recording_step_) return;
  step_label_.assign(label);
  timer_->begin_step();
  step_mark_begin_ = timer_->mark();
}

void Profiler::op_begin(const OpInfo& info) {
  if (!recording_step_ || !in_step_) {
    MS_CHECK(in_step_, "profiler: op '{}' began outside a step (call begin_step first)", info.name);
    return;
  }
  if (open_op_ >= 0) {
    MS_THROW("profiler: op '{}' began inside op '{}'; ops do not nest", info.name,
             identities_[pending_[open_op_].op].name);
  }
  int32_t id = intern(info);
  if (pending_count_ == pending_.size()) pending_.emplace_back();
  Pending& p = pending_[pending_count_];
  p.op = id;
  p.shapes.assign(info.shapes);
  p.cost = info.cost;
  p.mark_end = -1;
  open_op_ = static_cast<int32_t>(pending_count_++);
  p.mark_begin = timer_->mark();  // last, so the bookkeeping above is not charged to the op
}

void Profiler::op_end() noexcept {
  if (!recording_step_ || !in_step_) return;
  if (open_op_ < 0) {
    if (step_error_.empty()) step_error_ = "op_end without op_begin";
    return;
  }
  pending_[open_op_].mark_end = timer_->mark();
  open_op_ = -1;
}

void Profiler::end_step() {
  MS_CHECK(in_step_, "profiler: end_step without begin_step");
  if (!recording_step_) {
    in_step_ = false;
    return;
  }
  if (open_op_ >= 0) {
    std::string name = identities_[pending_[open_op_].op].name;
    abort_step();
    MS_THROW("profiler: step ended while op '{}' is still open", name);
  }
  if (!step_error_.empty()) {
    std::string err = step_error_;
    abort_step();
    MS_THROW("profiler: {} in step {}", err, steps_seen_ - 1);
  }
  int32_t mark_end = timer_->mark();
  timer_->resolve(times_us_);
  MS_CHECK(times_us_.size() == static_cast<size_t>(mark_end) + 1,
           "profiler: timer '{}' resolved {} markers, expected {}", timer_->name(), times_us_.size(),
           mark_end + 1);

  StepRecord step;
  step.label = std::move(step_label_);
  step.begin_us = times_us_[step_mark_begin_];
  step.end_us = times_us_[mark_end];
  step.first_op = static_cast<int32_t>(records_.size());
  step.num_ops = static_cast<int32_t>(pending_count_);
  auto step_index = static_cast<int32_t>(steps_.size());
  for (size_t i = 0; i < pending_count_; ++i) {
    Pending& p = pending_[i];
    OpRecord r;
    r.op = p.op;
    r.step = step_index;
    r.begin_us = times_us_[p.mark_begin];
    r.end_us = times_us_[p.mark_end];
    r.shapes = p.shapes;
    r.cost = p.cost;
    records_.push_back(std::move(r));
  }
  steps_.push_back(std::move(step));
  in_step_ = false;
  recording_step_ = false;
}

void Profiler::abort_step() {
  in_step_ = false;
  recording_step_ = false;
  pending_count_ = 0;
  open_op_ = -1;
  step_error_.clear();
}

void Profiler::clear() {
  abort_step();
  records_.clear();
  steps_.clear();
  steps_seen_ = 0;
}

}  // namespace ms::profiler
