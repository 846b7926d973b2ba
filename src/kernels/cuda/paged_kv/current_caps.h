// The current device's limits for a launcher's last check (attribute queries only: cheap, no device sync,
// allowed while a stream is being captured into a graph).
#pragma once

#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"

namespace ms::cuda {

inline DeviceCaps current_device_caps() {
  DeviceCaps caps;
  CUDA_CHECK(cudaGetDevice(&caps.device));
  int v = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, caps.device));
  caps.smem_per_block_optin = static_cast<size_t>(v);
  CUDA_CHECK(cudaDeviceGetAttribute(&caps.multiprocessors, cudaDevAttrMultiProcessorCount, caps.device));
  CUDA_CHECK(cudaDeviceGetAttribute(&caps.sm_major, cudaDevAttrComputeCapabilityMajor, caps.device));
  CUDA_CHECK(cudaDeviceGetAttribute(&caps.sm_minor, cudaDevAttrComputeCapabilityMinor, caps.device));
  caps.name = "device " + std::to_string(caps.device);
  return caps;
}

// Checks `smem` against the device and lets `kernel` use it (the opt-in above 48 KB).
template <typename Kernel>
void prepare_smem(const DeviceCaps& caps, const char* name, Kernel kernel, size_t smem) {
  check_smem(caps, name, smem);
  if (smem > 48 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

}  // namespace ms::cuda
