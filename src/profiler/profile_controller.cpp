#include "profiler/profile_controller.h"

#include "core/error.h"
#include "profiler/report.h"
#include "profiler/trace.h"

namespace ms::profiler {

ProfileController::ProfileController(ProfileControllerOptions options) : options_(std::move(options)) {
  if (options_.ceilings) {
    ceilings_ = *options_.ceilings;
    have_ceilings_ = true;
  }
}

void ProfileController::start(const ProfileRequest& request) {
  MS_CHECK(request.steps >= 0, "profile: steps must be >= 0, got {}", request.steps);
  MS_CHECK(request.warmup_steps >= 0, "profile: warmup steps must be >= 0, got {}", request.warmup_steps);
  {
    std::lock_guard lock(mu_);
    MS_CHECK(!profiler_, "profile: a profile is already running (stop it first)");
  }
  // Measured outside the lock (about a second) so the engine loop never waits on it.
  std::optional<Ceilings> measured;
  {
    std::lock_guard lock(mu_);
    if (!have_ceilings_) measured.emplace();
  }
  if (measured) *measured = measure_ceilings(options_.measure);
  auto prof = std::make_unique<Profiler>(ProfilerOptions{request.warmup_steps, request.steps},
                                         options_.make_timer ? options_.make_timer() : nullptr);
  std::lock_guard lock(mu_);
  MS_CHECK(!profiler_, "profile: a profile is already running (stop it first)");
  if (measured && !have_ceilings_) {
    ceilings_ = *measured;
    have_ceilings_ = true;
  }
  request_ = request;
  step_error_.clear();
  profiler_ = std::move(prof);
}

bool ProfileController::started() const {
  std::lock_guard lock(mu_);
  return profiler_ != nullptr;
}

bool ProfileController::done() const {
  std::lock_guard lock(mu_);
  return profiler_ && !in_step_ && profiler_->done();
}

int ProfileController::steps_recorded() const {
  std::lock_guard lock(mu_);
  // While a step is in flight the engine thread may append to the records; the count is read between steps.
  return profiler_ && !in_step_ ? profiler_->steps_recorded() : 0;
}

bool ProfileController::wait_done(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return profiler_ && !in_step_ && profiler_->done(); });
}

OpSink* ProfileController::step_begin(std::string_view label) {
  std::lock_guard lock(mu_);
  if (!profiler_ || profiler_->done()) return nullptr;
  if (in_step_) profiler_->abort_step();  // a step_end went missing: drop that step
  profiler_->begin_step(label);
  in_step_ = true;
  return profiler_.get();
}

void ProfileController::step_end(bool ok) noexcept {
  {
    std::lock_guard lock(mu_);
    if (!in_step_ || !profiler_) return;
    if (ok) {
      try {
        profiler_->end_step();
      } catch (const std::exception& e) {
        step_error_ = e.what();  // end_step has dropped the step
      }
    } else {
      profiler_->abort_step();
    }
    in_step_ = false;
  }
  cv_.notify_all();
}

ProfileResult ProfileController::stop(std::chrono::milliseconds timeout) {
  std::unique_ptr<Profiler> prof;
  ProfileRequest req;
  Ceilings ceilings;
  ProfileResult out;
  {
    std::unique_lock lock(mu_);
    MS_CHECK(profiler_, "profile: no profile is running (start one first)");
    if (!cv_.wait_for(lock, timeout, [&] { return !in_step_; }))
      MS_THROW("profile: the step in flight did not end within {} ms; the profile keeps running",
               timeout.count());
    prof = std::move(profiler_);
    req = request_;
    ceilings = ceilings_;
    out.step_error = std::move(step_error_);
    step_error_.clear();
  }
  // The engine thread no longer sees the Profiler: summarise and write here.
  out.summary = summarize(*prof, ceilings, req.group, req.rules);
  out.table = format_table(out.summary);
  out.summary_json = summary_json(out.summary);
  out.trace = trace_json(*prof);
  if (!req.trace_path.empty()) {
    write_trace(*prof, req.trace_path);
    out.trace_path = req.trace_path;
  }
  return out;
}

}  // namespace ms::profiler
