#include "kernels/cpu/linear.h"

#include <cstddef>
#include <vector>

namespace ms::kernels::cpu {

namespace {

constexpr int kTile = 4;  // weight rows dequantised together; each x row is then read once per tile

// Per-thread f32 rows; grows only, so steady-state steps allocate nothing.
float* tile_buffer(int64_t floats) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

}  // namespace

void linear(const LinearParams& p) {
  const int64_t k = p.w.cols;
  const int64_t tiles = (p.n + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    float* wbuf = tile_buffer(kTile * k);
    const int64_t j0 = t * kTile;
    const int rows = static_cast<int>(p.n - j0 < kTile ? p.n - j0 : kTile);
    for (int r = 0; r < rows; ++r) dequantize_row(p.w, p.row0 + j0 + r, wbuf + r * k);
    for (int r = rows; r < kTile; ++r)
      for (int64_t c = 0; c < k; ++c) wbuf[r * k + c] = 0.0f;
    const float* w0 = wbuf;
    const float* w1 = wbuf + k;
    const float* w2 = wbuf + 2 * k;
    const float* w3 = wbuf + 3 * k;
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = p.x + i * p.x_stride;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t c = 0; c < k; ++c) {
        const float xv = x[c];
        s0 += w0[c] * xv;
        s1 += w1[c] * xv;
        s2 += w2[c] * xv;
        s3 += w3[c] * xv;
      }
      float* y = p.y + i * p.y_stride + j0;
      const float s[kTile] = {s0, s1, s2, s3};
      for (int r = 0; r < rows; ++r) y[r] = s[r];
    }
  }
}

}  // namespace ms::kernels::cpu
