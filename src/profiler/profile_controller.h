// Profiling a running engine from another thread (the server's HTTP handlers): start() arms a profile that
// begins at the engine's next step boundary; the engine loop drives the Profiler through the StepHook
// interface; stop() (or the requested number of steps) ends it and returns the table, the JSON summary and
// the trace. Only the engine thread touches the Profiler while a step is in flight; the other threads see
// only the state below the mutex, and stop() waits for the step in flight to end before it takes the
// Profiler away.
//
//   ProfileController prof;         // one per engine, outliving it
//   engine.set_step_hook(&prof);    // before the engine loop starts
//   ProfileRequest req;             // HTTP thread: POST /start_profile
//   req.steps = 20;
//   req.trace_path = "trace.json";
//   prof.start(req);
//   ProfileResult r = prof.stop();  // HTTP thread: POST /stop_profile -> r.table, r.summary_json, r.trace
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "profiler/ceilings.h"
#include "profiler/profiler.h"
#include "profiler/step_hook.h"
#include "profiler/summary.h"

namespace ms::profiler {

struct ProfileRequest {
  int steps = 0;           // steps to record; 0 = until stop()
  int warmup_steps = 0;    // steps run before recording starts
  std::string trace_path;  // where stop() writes the Perfetto trace; empty = no file
  GroupBy group = GroupBy::Kind;
  FlagRules rules;
};

struct ProfileResult {
  Summary summary;
  std::string table;            // format_table(summary)
  nlohmann::json summary_json;  // summary_json(summary)
  nlohmann::json trace;         // trace_json of the recorded steps
  std::string trace_path;       // the file written, empty when none was asked for
  std::string step_error;       // the last step that failed to record (unbalanced ops), if any
};

struct ProfileControllerOptions {
  std::optional<Ceilings> ceilings;  // unset: measured once, by the first start()
  CeilingOptions measure;
  std::function<std::unique_ptr<TimerBackend>()> make_timer;  // unset: a steady clock
};

class ProfileController final : public StepHook {
 public:
  explicit ProfileController(ProfileControllerOptions options = {});

  // Any thread. Throws ms::Error when a profile is already started (and not yet stopped) or the request is
  // invalid. Measures the ceilings on first use unless they were given.
  void start(const ProfileRequest& request);
  // True from start() until stop().
  bool started() const;
  // True once the requested steps are recorded (never for steps = 0).
  bool done() const;
  int steps_recorded() const;
  // Blocks until done() or the timeout; returns done().
  bool wait_done(std::chrono::milliseconds timeout);
  // Any thread. Waits (up to `timeout`) for the step in flight to end, ends the profile, summarises it and
  // writes the trace. Throws ms::Error when nothing was started, the timeout passed with a step still in
  // flight (the profile then stays started), or no step was recorded (the profile is then ended).
  ProfileResult stop(std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // StepHook: the engine thread.
  OpSink* step_begin(std::string_view label) override;
  void step_end(bool ok) noexcept override;

 private:
  ProfileControllerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Profiler> profiler_;  // set from start() to stop()
  ProfileRequest request_;
  Ceilings ceilings_;
  bool have_ceilings_ = false;
  bool in_step_ = false;  // the engine thread holds profiler_ between step_begin and step_end
  std::string step_error_;
};

}  // namespace ms::profiler
