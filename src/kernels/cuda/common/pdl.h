// Programmatic dependent launch (PDL), the host side: the launchers under kernels/cuda launch through
// launch_kernel (all but moe/moe_experts_decode and gemm/'s direct and dequantising kernels, which launch
// plainly), which asks for cudaLaunchAttributeProgrammaticStreamSerialization when PDL is on (pdl_switch.h)
// and the current device is sm_90 or newer, else launches plainly. The kernel must follow pdl.cuh's rules
// (grid_dep_wait before its first global access). Launches stay capturable: stream capture (CUDA 12.3+)
// records programmatic edges between kernel nodes; the device's architecture is read once per device, never
// per launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/error.h"
#include "kernels/cuda/common/pdl_switch.h"

namespace ms::cuda {

// The current device's architecture (90 for sm_90), read once per device and cached.
int current_device_arch();

// Edges of a graph (e.g. one captured from a stream): all of them and the programmatic ones among them.
struct GraphEdgeCount {
  size_t all = 0, programmatic = 0;
};
GraphEdgeCount graph_edge_count(cudaGraph_t g);

// PDL is on (pdl_enabled) and the current device runs dependents early.
inline bool pdl_active() {
  return pdl_enabled() && pdl_supported_arch(current_device_arch());
}

// The launch configuration of one launch, with the PDL attribute when pdl_active(); `attr` must outlive the
// launch call.
inline cudaLaunchConfig_t pdl_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                            cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  if (pdl_active()) {
    attr = cudaLaunchAttribute{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  return cfg;
}

// Launches `kernel<<<grid, block, smem, stream>>>(args...)` (as a programmatic dependent when pdl_active());
// throws ms::Error naming `name` when the launch fails.
template <typename... Expected, typename... Actual>
void launch_kernel(const char* name, void (*kernel)(Expected...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Actual&&... args) {
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, block, smem, stream, attr);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Actual>(args)...);
  if (err != cudaSuccess) {
    cudaGetLastError();
    MS_THROW("launch of kernel {} (grid {}x{}x{}, block {}x{}x{}, {} bytes shared) failed: {}", name, grid.x,
             grid.y, grid.z, block.x, block.y, block.z, smem, cudaGetErrorString(err));
  }
}

// The same for a kernel given as a pointer with its arguments as an array (cudaLaunchKernel's form).
inline void launch_kernel_args(const char* name, const void* kernel, dim3 grid, dim3 block, void** args,
                               size_t smem, cudaStream_t stream) {
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, block, smem, stream, attr);
  const cudaError_t err = cudaLaunchKernelExC(&cfg, kernel, args);
  if (err != cudaSuccess) {
    cudaGetLastError();
    MS_THROW("launch of kernel {} (grid {}x{}x{}, block {}x{}x{}, {} bytes shared) failed: {}", name, grid.x,
             grid.y, grid.z, block.x, block.y, block.z, smem, cudaGetErrorString(err));
  }
}

}  // namespace ms::cuda
