#include "quant/fp8_block.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "quant/float_formats.h"

namespace ms::quant {

Fp8BlockWeight fp8_block_quantize(const float* w, int64_t rows, int64_t cols, int block) {
  MS_CHECK(block > 0, "fp8 block size must be positive, got {}", block);
  Fp8BlockWeight q;
  q.rows = rows;
  q.cols = cols;
  const int64_t br = (rows + block - 1) / block, bc = (cols + block - 1) / block;
  q.data.assign(static_cast<size_t>(rows * cols), 0);
  q.scale_inv.assign(static_cast<size_t>(br * bc), 0.0f);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < br; ++i) {
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r1 = std::min<int64_t>(rows, (i + 1) * block),
                    c1 = std::min<int64_t>(cols, (j + 1) * block);
      float amax = 0.0f;
      for (int64_t r = i * block; r < r1; ++r)
        for (int64_t c = j * block; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      float s = amax / kFp8E4M3Max;
      q.scale_inv[static_cast<size_t>(i * bc + j)] = s;
      float inv = s > 0 ? 1.0f / s : 0.0f;
      for (int64_t r = i * block; r < r1; ++r)
        for (int64_t c = j * block; c < c1; ++c)
          q.data[static_cast<size_t>(r * cols + c)] = f32_to_fp8_e4m3(w[r * cols + c] * inv, true);
    }
  }
  return q;
}

void fp8_block_dequantize_row(const uint8_t* data_row, const float* scale_row, int64_t cols, float* out,
                              int block) {
  const float* t = fp8_e4m3_table();
  for (int64_t c = 0; c < cols; ++c) out[c] = t[data_row[c]] * scale_row[c / block];
}

}  // namespace ms::quant
