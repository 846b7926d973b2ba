// The process-wide switch for programmatic dependent launch (kernels/cuda/common/pdl.h): on unless the
// environment says MOESERVE_DISABLE_PDL=1 (tests, benchmarks) or the engine turned it off (--disable-pdl,
// runtime::cuda::CudaExecutorOptions::pdl), so the two can be compared. Header-only and free of CUDA types:
// the host logic is tested without the toolkit (tests/unit/kernels/pdl_switch_test.cpp).
#pragma once

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace ms::cuda {

// Whether a value of MOESERVE_DISABLE_PDL turns PDL off: any value but unset, empty, "0", "false", "off" or
// "no" (case as written) does.
inline bool pdl_disabled_by_env_value(const char* value) {
  if (value == nullptr) return false;
  const std::string_view v(value);
  return !(v.empty() || v == "0" || v == "false" || v == "off" || v == "no" || v == "FALSE" || v == "OFF" ||
           v == "NO");
}

namespace detail {
// -1: the environment not read yet; 0: off by the environment; 1: the environment allows it.
inline std::atomic<int>& pdl_env_state() {
  static std::atomic<int> s{-1};
  return s;
}
// What set_pdl_enabled last said (on by default).
inline std::atomic<bool>& pdl_api_state() {
  static std::atomic<bool> s{true};
  return s;
}
}  // namespace detail

// The engine's choice (--disable-pdl); MOESERVE_DISABLE_PDL, when it disables, wins over `on`. Graphs
// already captured keep the launches they were captured with.
inline void set_pdl_enabled(bool on) {
  detail::pdl_api_state().store(on, std::memory_order_relaxed);
}

// Whether launchers may launch kernels as programmatic dependents (before the device's architecture is
// asked: pdl.h's pdl_active adds that). The environment is read once, at the first call.
inline bool pdl_enabled() {
  int env = detail::pdl_env_state().load(std::memory_order_relaxed);
  if (env < 0) {
    env = pdl_disabled_by_env_value(std::getenv("MOESERVE_DISABLE_PDL")) ? 0 : 1;
    detail::pdl_env_state().store(env, std::memory_order_relaxed);
  }
  return env == 1 && detail::pdl_api_state().load(std::memory_order_relaxed);
}

// For tests: forget what the environment said, so the next pdl_enabled reads it again.
inline void reset_pdl_env_for_test() {
  detail::pdl_env_state().store(-1, std::memory_order_relaxed);
}

// Whether a device of architecture `arch` (90 for sm_90) runs dependents early: sm_90 and newer.
inline bool pdl_supported_arch(int arch) {
  return arch >= 90;
}

}  // namespace ms::cuda
