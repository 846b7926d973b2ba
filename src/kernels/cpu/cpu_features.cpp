#include "kernels/cpu/cpu_features.h"

#include <atomic>

namespace ms::kernels::cpu {

namespace {

LinearIsa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return LinearIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return LinearIsa::Avx2;
  return LinearIsa::Reference;
}

constexpr int kNotForced = -1;
std::atomic<int> g_forced{kNotForced};

}  // namespace

LinearIsa linear_isa() {
  const int f = g_forced.load(std::memory_order_relaxed);
  if (f != kNotForced) return static_cast<LinearIsa>(f);
  static const LinearIsa detected = detect();
  return detected;
}

const char* linear_isa_name(LinearIsa isa) {
  switch (isa) {
    case LinearIsa::Reference:
      return "reference";
    case LinearIsa::Avx2:
      return "avx2";
    case LinearIsa::Avx512:
      return "avx512";
  }
  return "?";
}

void force_linear_isa(LinearIsa isa) {
  g_forced.store(static_cast<int>(isa), std::memory_order_relaxed);
}
void clear_forced_linear_isa() {
  g_forced.store(kNotForced, std::memory_order_relaxed);
}

}  // namespace ms::kernels::cpu
