// A launcher's last step before a launch: the kernel's shared memory checked against the current device
// (current_device_caps, device_caps.h) and its opt-in above 48 KB set.
#pragma once

#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"

namespace ms::cuda {

// Checks `smem` against the device and lets `kernel` use it (the opt-in above 48 KB).
template <typename Kernel>
void prepare_smem(const DeviceCaps& caps, const char* name, Kernel kernel, size_t smem) {
  check_smem(caps, name, smem);
  if (smem > 48 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

}  // namespace ms::cuda
