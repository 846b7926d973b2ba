// A terminal progress bar for long work (loading, writing checkpoints, benchmarks). Draws on stderr only when
// it is a terminal or MOESERVE_PROGRESS=1, and only once the work has run for more than a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ms {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit = "");
  ~ProgressBar();
  void advance(int64_t n = 1);
  void set(int64_t done);
  void finish();

 private:
  void draw(bool final);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool enabled_, drawn_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace ms
