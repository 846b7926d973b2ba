// Host-side launch arithmetic and argument checks shared by the kernels: grids for row-wise grid-stride
// loops, alignment tests, matrix argument checks. No device queries, so launchers stay cheap and capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"

namespace ms::cuda {

constexpr int kElementwiseThreads = 256;

// Grid for a [rows, cols] loop: x strides over columns (kElementwiseThreads per block), y over rows; both
// capped (kernels loop), so any shape launches within the grid limits.
inline dim3 rows_grid(int64_t rows, int64_t cols) {
  const int64_t bx = (cols + kElementwiseThreads - 1) / kElementwiseThreads;
  const int64_t x = bx < 1 ? 1 : (bx > 1024 ? 1024 : bx);
  const int64_t y = rows < 1 ? 1 : (rows > 65535 ? 65535 : rows);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y), 1);
}

inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// A [rows, cols] matrix argument: set (unless empty) with a row stride of at least cols.
inline void check_matrix(const void* p, int64_t rows, int64_t cols, int64_t stride, const char* kernel,
                         const char* field) {
  MS_CHECK(rows >= 0 && cols >= 0, "{}: {} shape [{}, {}] must not be negative", kernel, field, rows, cols);
  if (rows == 0 || cols == 0) return;
  MS_CHECK(p != nullptr, "{}: {} is null", kernel, field);
  MS_CHECK(stride >= cols, "{}: {} row stride {} is smaller than its {} columns", kernel, field, stride,
           cols);
}

}  // namespace ms::cuda
