#include "kernels/cuda/common/pdl.h"

#include <array>
#include <atomic>
#include <vector>

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

GraphEdgeCount graph_edge_count(cudaGraph_t g) {
  size_t n = 0;
#if CUDART_VERSION >= 13000
  CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
#else
  CUDA_CHECK(cudaGraphGetEdges_v2(g, nullptr, nullptr, nullptr, &n));
#endif
  if (n == 0) return {};
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
#if CUDART_VERSION >= 13000
  CUDA_CHECK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
#else
  CUDA_CHECK(cudaGraphGetEdges_v2(g, from.data(), to.data(), data.data(), &n));
#endif
  GraphEdgeCount c;
  c.all = n;
  for (size_t i = 0; i < n; ++i)
    c.programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
  return c;
}

}  // namespace ms::cuda
