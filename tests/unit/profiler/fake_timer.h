// A deterministic TimerBackend: time moves only when the test says so.
#pragma once

#include <vector>

#include "profiler/timer.h"

namespace ms::profiler::testing {

class FakeTimer final : public TimerBackend {
 public:
  std::string_view name() const override { return "fake"; }
  void begin_step() override {
    marks_.clear();
    ++steps_begun;
  }
  int32_t mark() override {
    marks_.push_back(now_us_);
    return static_cast<int32_t>(marks_.size() - 1);
  }
  void resolve(std::vector<double>& times_us) override {
    ++resolves;
    times_us = marks_;
  }
  void advance(double us) { now_us_ += us; }
  int steps_begun = 0, resolves = 0;

 private:
  double now_us_ = 0;
  std::vector<double> marks_;
};

}  // namespace ms::profiler::testing
