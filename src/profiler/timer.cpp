#include "profiler/timer.h"

namespace ms::profiler {

SteadyClockTimer::SteadyClockTimer() : epoch_(std::chrono::steady_clock::now()) {
  marks_.reserve(4096);
}

void SteadyClockTimer::resolve(std::vector<double>& times_us) {
  times_us.resize(marks_.size());
  for (size_t i = 0; i < marks_.size(); ++i) {
    times_us[i] = std::chrono::duration<double, std::micro>(marks_[i] - epoch_).count();
  }
}

std::unique_ptr<TimerBackend> make_steady_clock_timer() {
  return std::make_unique<SteadyClockTimer>();
}

}  // namespace ms::profiler
