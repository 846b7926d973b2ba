// Launch configurations of nvfp4_gemv, chosen on the host from the shape and the device's limits (no CUDA
// types: tested without a GPU in tests/unit/kernels/kernel_fit_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::cuda::nvfp4_gemv_config {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpK = 128;                                // k per warp per step: 4 lanes x 32 elements
constexpr size_t kLutBytes = 256 * 32 * sizeof(uint32_t);  // replicated byte -> bf16x2 table
constexpr int kMaxM = 8;

struct Config {
  int kw, rows_per_block, splits;
};

constexpr int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// Rows of x the kernel template for m rows is instantiated with (1, 2, 4 or 8).
constexpr int m_template(int m) {
  return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
}

constexpr size_t smem_bytes(int m_tmpl, int rows_per_block) {
  return kLutBytes + static_cast<size_t>(kWarps) * m_tmpl * rows_per_block * sizeof(float);
}

inline KernelNeed need(int m, const Config& c) {
  return {fmt::format("nvfp4_gemv m{} rows{} kw{}", m_template(m), c.rows_per_block, c.kw),
          smem_bytes(m_template(m), c.rows_per_block), 80, false};
}

// Largest tiles that still give every multiprocessor two blocks, preferring fewer k-slices (less partial
// traffic) over larger row blocks, among those whose shared memory fits the device.
inline Config choose(int m, int n, int k, const DeviceLimits& dev) {
  for (int kw : {2, 1})
    for (int rb : {128, 64, 32, 16}) {
      const Config c{kw, rb, ceil_div(k, kWarps * kWarpK * kw)};
      if (why_cannot_run(need(m, c), dev)) continue;
      if (static_cast<long>(ceil_div(n, rb)) * c.splits >= 2L * dev.multiprocessors) return c;
    }
  return {1, 16, ceil_div(k, kWarps * kWarpK)};
}

}  // namespace ms::cuda::nvfp4_gemv_config
