// Op timers. A TimerBackend records markers while a step runs and turns them into times only after the step,
// so a device backend never waits inside the step: on the CPU a marker is a steady-clock reading; a CUDA
// backend records an event on the stream per marker and, in resolve(), waits on the last one and reads
// cudaEventElapsedTime against its epoch event.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace ms::profiler {

class TimerBackend {
 public:
  virtual ~TimerBackend() = default;
  virtual std::string_view name() const = 0;  // "steady_clock", "cuda_events"
  // Forgets the markers of the previous step.
  virtual void begin_step() = 0;
  // Records a marker at this point of the work and returns its index within the step (0, 1, ...). Must not
  // wait for a device.
  virtual int32_t mark() = 0;
  // After the step (may wait for the device): the time of every marker of the step, in microseconds since
  // the backend's epoch (its creation), in marker order. times_us is resized to the number of markers.
  virtual void resolve(std::vector<double>& times_us) = 0;
};

// std::chrono::steady_clock readings: the CPU backend, where the work is done when mark() returns.
class SteadyClockTimer final : public TimerBackend {
 public:
  SteadyClockTimer();
  std::string_view name() const override { return "steady_clock"; }
  void begin_step() override { marks_.clear(); }
  int32_t mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int32_t>(marks_.size() - 1);
  }
  void resolve(std::vector<double>& times_us) override;

 private:
  std::chrono::steady_clock::time_point epoch_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

std::unique_ptr<TimerBackend> make_steady_clock_timer();

}  // namespace ms::profiler
