#include "kernels/cpu/dsa_indexer.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace ms::kernels::cpu {

int64_t dsa_indexer_scratch_floats(int64_t max_keys, int64_t dim, int threads) {
  // scores [max_keys] f32, order [max_keys] i32, row [dim] f32.
  return static_cast<int64_t>(threads) * (2 * std::max<int64_t>(max_keys, 1) + dim);
}

void dsa_indexer(const DsaIndexerParams& p) {
  const int64_t per_thread = 2 * std::max<int64_t>(p.max_keys, 1) + p.dim;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < p.m; ++i) {
    float* base = p.scratch + static_cast<int64_t>(omp_get_thread_num()) * per_thread;
    float* scores = base;
    int32_t* order = reinterpret_cast<int32_t*>(base + std::max<int64_t>(p.max_keys, 1));
    float* row = base + 2 * std::max<int64_t>(p.max_keys, 1);
    const int64_t seq = p.token_seq[i], n_keys = p.positions[i] + 1;
    int32_t* out = p.out + i * p.topk;
    if (n_keys <= p.topk) {
      for (int64_t j = 0; j < p.topk; ++j) out[j] = j < n_keys ? static_cast<int32_t>(j) : -1;
      continue;
    }
    const float* qi = p.q + i * p.heads * p.dim;
    const float* wi = p.w + i * p.heads;
    for (int64_t j = 0; j < n_keys; ++j) {
      cache_read_row(p.keys, cache_slot(p.block_table, p.max_blocks, seq, j, p.keys.page_size), row);
      float total = 0.0f;
      for (int64_t h = 0; h < p.heads; ++h) {
        const float* q = qi + h * p.dim;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < p.dim; ++c) s += q[c] * row[c];
        s *= p.softmax_scale;
        total += wi[h] * (s > 0.0f ? s : 0.0f);
      }
      scores[j] = total;
      order[j] = static_cast<int32_t>(j);
    }
    std::partial_sort(order, order + p.topk, order + n_keys, [scores](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
    std::sort(order, order + p.topk);
    std::memcpy(out, order, static_cast<size_t>(p.topk) * sizeof(int32_t));
  }
}

}  // namespace ms::kernels::cpu
