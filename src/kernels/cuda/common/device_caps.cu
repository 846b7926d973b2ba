#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"

namespace ms::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

DeviceCaps query_device(int device) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceCaps c;
  c.device = device;
  c.name = p.name;
  c.sm_major = p.major;
  c.sm_minor = p.minor;
  c.multiprocessors = p.multiProcessorCount;
  c.smem_per_block_optin = p.sharedMemPerBlockOptin;
  c.smem_per_sm = p.sharedMemPerMultiprocessor;
  c.global_mem = p.totalGlobalMem;
  c.l2_bytes = p.l2CacheSize;
  return c;
}

DeviceCaps current_device_caps() {
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

void check_smem(const DeviceCaps& caps, const char* kernel, size_t smem_bytes) {
  if (smem_bytes > caps.smem_per_block_optin)
    MS_THROW(
        "kernel {} needs {} bytes of shared memory per block but {} (sm_{}) allows {}; choose a smaller tile "
        "configuration or another backend",
        kernel, smem_bytes, caps.name, caps.arch(), caps.smem_per_block_optin);
}

void check_fit(const DeviceCaps& caps, const KernelNeed& need) {
  if (auto why = why_cannot_run(need, limits_of(caps))) MS_THROW("{}", *why);
}

}  // namespace ms::cuda
