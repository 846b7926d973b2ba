// The device limits the MoE launchers check before each launch, read through cheap attribute queries (no full
// property read per call, nothing that breaks stream capture).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"

namespace ms::cuda {

inline DeviceCaps moe_launch_caps() {
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

}  // namespace ms::cuda
