// Whether a kernel configuration fits a device, decided on the host from the device's limits alone, so that
// every configuration chooser can be tested without the hardware (tests/unit/kernels/kernel_fit_test.cpp runs
// them against the limits of sm_90, sm_100 and sm_120 parts). Header-only and free of CUDA types: it builds
// and runs where no CUDA toolkit is installed.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ms::cuda {

// What a kernel choice depends on, read once from the device (DeviceCaps) or taken from a preset.
struct DeviceLimits {
  std::string name;
  int arch = 0;                     // 90 for sm_90, 100 for sm_100, 120 for sm_120
  size_t smem_per_block_optin = 0;  // bytes a block may use after opting in
  int multiprocessors = 0;
};

// Published limits of the parts moeserve targets (shared memory per block after opt-in, multiprocessors).
inline DeviceLimits limits_h200() {
  return {"H200 (sm_90)", 90, 232448, 132};
}
inline DeviceLimits limits_b200() {
  return {"B200 (sm_100)", 100, 232448, 148};
}
inline DeviceLimits limits_rtx_pro_6000() {
  return {"RTX PRO 6000 Blackwell (sm_120)", 120, 101376, 188};
}
inline std::vector<DeviceLimits> target_device_presets() {
  return {limits_h200(), limits_b200(), limits_rtx_pro_6000()};
}

// What one launch configuration of a kernel needs.
struct KernelNeed {
  std::string kernel;       // "mla_decode", "nvfp4_gemv m8 rows128"
  size_t smem_bytes = 0;    // dynamic + static shared memory per block
  int arch_min = 0;         // lowest architecture the code runs on (0: any)
  bool arch_exact = false;  // architecture-specific code (sm_90a wgmma/setmaxnreg): runs on arch_min only
};

// Why `need` cannot run on `dev`, naming the kernel, the need and the limit; nullopt when it fits.
inline std::optional<std::string> why_cannot_run(const KernelNeed& need, const DeviceLimits& dev) {
  if (need.arch_exact && dev.arch != need.arch_min)
    return fmt::format("kernel {} is built for sm_{}a only and cannot run on {}; use another backend",
                       need.kernel, need.arch_min, dev.name);
  if (dev.arch < need.arch_min)
    return fmt::format("kernel {} needs sm_{} or newer, {} is sm_{}", need.kernel, need.arch_min, dev.name,
                       dev.arch);
  if (need.smem_bytes > dev.smem_per_block_optin)
    return fmt::format(
        "kernel {} needs {} bytes of shared memory per block but {} allows {}; choose a smaller tile "
        "configuration or another backend",
        need.kernel, need.smem_bytes, dev.name, dev.smem_per_block_optin);
  return std::nullopt;
}

}  // namespace ms::cuda
