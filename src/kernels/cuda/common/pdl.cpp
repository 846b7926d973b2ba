#include "kernels/cuda/common/pdl.h"

#include <array>
#include <atomic>

#include "kernels/cuda/common/cuda_check.h"

namespace ms::cuda {

int current_device_arch() {
  // 0: not read yet. Devices past the table are asked every time (cheap attribute queries).
  static std::array<std::atomic<int>, 64> cache{};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    const int arch = cache[static_cast<size_t>(device)].load(std::memory_order_relaxed);
    if (arch > 0) return arch;
  }
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int arch = major * 10 + minor;
  if (cached) cache[static_cast<size_t>(device)].store(arch, std::memory_order_relaxed);
  return arch;
}

}  // namespace ms::cuda
