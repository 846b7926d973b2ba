// y = x W^T for a weight in any stored format: the reference CPU GEMM/GEMV. Weight rows are dequantised a
// tile at a time into a per-thread f32 buffer and reused across all m input rows.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_view.h"

namespace ms::kernels::cpu {

struct LinearParams {
  const float* __restrict__ x = nullptr;  // [m, k] rows x_stride apart (k = w.cols)
  int64_t x_stride = 0;
  WeightView w;                     // [w.rows, k]; rows [row0, row0 + n) are used
  int64_t row0 = 0, n = 0;          // output features computed
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0;
};

void linear(const LinearParams& p);

// The same work cut into tiles of output rows, for callers that split several matrices' tiles over one
// parallel region of their own: linear_tiles(p) tiles, each computed on the calling thread by
// linear_tile(p, t). Tile t covers rows [t * R, min((t + 1) * R, n)) for all m tokens, with the kernels and
// summation order linear(p) uses, so results equal linear(p)'s bit for bit.
int64_t linear_tiles(const LinearParams& p);
int linear_tile_rows(const LinearParams& p);  // R
void linear_tile(const LinearParams& p, int64_t t);

// Requests tile t's weight bytes into L2 (a hint, no effect on results): for callers about to move from one
// matrix to another, whose first tile would otherwise start on cold memory (the kernels prefetch only
// within a matrix).
void linear_prefetch_tile(const LinearParams& p, int64_t t);

}  // namespace ms::kernels::cpu
