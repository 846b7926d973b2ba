// What the GPU at hand can do, read once before any kernel is chosen: a kernel or tile configuration that
// needs more than this is refused at start with a message, never launched to crash.
#pragma once

#include <string>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::cuda {

struct DeviceCaps {
  int device = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t smem_per_block_optin = 0;  // bytes a block may use after opting in
  size_t smem_per_sm = 0;
  size_t global_mem = 0;
  int l2_bytes = 0;
  int arch() const { return sm_major * 10 + sm_minor; }
};

inline DeviceLimits limits_of(const DeviceCaps& c) {
  return {c.name, c.arch(), c.smem_per_block_optin, c.multiprocessors};
}

// Number of visible CUDA devices; 0 when there is no driver or device (never throws).
int device_count();
DeviceCaps query_device(int device);
// The current device's limits for a launcher's last check, through attribute queries only (cheap, no device
// sync, allowed while a stream is being captured into a graph).
DeviceCaps current_device_caps();
// Throws ms::Error naming the kernel and the limit when `smem_bytes` exceeds what `caps` allows.
void check_smem(const DeviceCaps& caps, const char* kernel, size_t smem_bytes);
// Throws ms::Error with why_cannot_run's message when `need` does not fit the device.
void check_fit(const DeviceCaps& caps, const KernelNeed& need);

}  // namespace ms::cuda
