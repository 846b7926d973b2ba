#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ms {

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total) {
  const char* env = std::getenv("MOESERVE_PROGRESS");
  enabled_ = env ? std::string_view(env) == "1" : isatty(STDERR_FILENO) != 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::advance(int64_t n) {
  set(done_ + n);
}

void ProgressBar::set(int64_t done) {
  done_ = done;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - start_ < std::chrono::seconds(1)) return;
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_draw_ = now;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && drawn_) draw(true);
}

void ProgressBar::draw(bool final) {
  drawn_ = true;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 0.0;
  if (frac > 1) frac = 1;
  constexpr int width = 30;
  int fill = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(fill), '#');
  bar.resize(width, '.');
  double rate = secs > 0 ? static_cast<double>(done_) / secs : 0.0;
  double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0.0;
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %lld/%lld%s%s %.1fs elapsed, eta %.1fs   %s", label_.c_str(),
               bar.c_str(), frac * 100, static_cast<long long>(done_), static_cast<long long>(total_),
               unit_.empty() ? "" : " ", unit_.c_str(), secs, eta, final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace ms
