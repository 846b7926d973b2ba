#include "kernels/cpu/elementwise.h"

#include <algorithm>

#include <cmath>

namespace ms::kernels::cpu {

void embedding(const EmbeddingParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < p.m; ++i) dequantize_row(p.table, p.ids[i], p.out + i * p.table.cols);
}

void rms_norm(const NormParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.m; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* o = p.out + r * p.out_stride;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < p.n; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(p.n) + p.eps);
    for (int64_t i = 0; i < p.n; ++i) o[i] = p.weight[i] * (x[i] * inv);
  }
}

void layer_norm(const NormParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.m; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* o = p.out + r * p.out_stride;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < p.n; ++i) sum += x[i];
    const float mean = sum / static_cast<float>(p.n);
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int64_t i = 0; i < p.n; ++i) var += (x[i] - mean) * (x[i] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(p.n) + p.eps);
    for (int64_t i = 0; i < p.n; ++i) o[i] = (x[i] - mean) * inv * p.weight[i] + (p.bias ? p.bias[i] : 0.0f);
  }
}

void rope(const RopeParams& p) {
  const int64_t half = p.dim / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.m; ++r) {
    // fp32 angle and fp32 cos/sin, as the reference computes its tables.
    const float pos = static_cast<float>(p.positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * p.inv_freq[i];
      const float c = std::cos(angle) * p.attention_scaling;
      const float s = std::sin(angle) * p.attention_scaling;
      for (int64_t h = 0; h < p.heads; ++h) {
        float* x = p.x + r * p.row_stride + h * p.head_stride + p.offset;
        const int64_t a = p.interleaved ? 2 * i : i;
        const int64_t b = p.interleaved ? 2 * i + 1 : i + half;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x1 * c + x0 * s;
      }
    }
  }
}

void silu_mul(const SiluMulParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.m; ++r) {
    const float* g = p.x + r * p.x_stride;
    const float* u = g + p.n;
    float* o = p.out + r * p.out_stride;
    for (int64_t i = 0; i < p.n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void add_inplace(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* __restrict__ x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void gather_rows(const GatherRowsParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < p.n; ++i) {
    const float* src = p.x + static_cast<int64_t>(p.rows[i]) * p.cols;
    std::copy(src, src + p.cols, p.out + i * p.cols);
  }
}

}  // namespace ms::kernels::cpu
