#include "kernels/cpu/logits_topc.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace ms::kernels::cpu {

void logits_topc(const LogitsTopCParams& p) {
  MS_CHECK(p.rows >= 0 && p.vocab >= 1, "logits_topc: rows {} and vocab {} (vocab must be >= 1)", p.rows,
           p.vocab);
  if (p.rows == 0) return;
  MS_CHECK(p.logits && p.temperature && p.out, "logits_topc: logits, temperature and out must be set");
  MS_CHECK(p.stride >= p.vocab, "logits_topc: row stride {} is smaller than the vocabulary {}", p.stride,
           p.vocab);
  const int count = static_cast<int>(std::min<int64_t>(kLogitsTopC, p.vocab));
#pragma omp parallel for schedule(dynamic, 1) if (p.rows > 1)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.logits + r * p.stride;
    LogitsTopC& o = p.out[r];
    float m = -std::numeric_limits<float>::infinity();
    int32_t nans = 0;
    for (int64_t i = 0; i < p.vocab; ++i) {
      if (std::isnan(x[i])) {
        ++nans;
      } else if (x[i] > m) {
        m = x[i];
      }
    }
    // The sampler's own sums: f32 terms, f64 accumulation, id order.
    double s1 = 0.0;
    for (int64_t i = 0; i < p.vocab; ++i) s1 += std::exp(x[i] - m);
    double st = 1.0;
    const float t = p.temperature[r];
    if (!(t < kLogitsTopCGreedyTemperature)) {
      const float inv_t = 1.0f / t;
      st = 0.0;
      for (int64_t i = 0; i < p.vocab; ++i) st += std::exp((x[i] - m) * inv_t);
    }
    std::vector<int32_t> ids(static_cast<size_t>(p.vocab));
    for (int64_t i = 0; i < p.vocab; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    auto better = [x](int32_t a, int32_t b) {
      const uint32_t ka = logits_topc_key(x[a]), kb = logits_topc_key(x[b]);
      return ka > kb || (ka == kb && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), better);
    o.sum_exp = s1;
    o.sum_exp_t = st;
    o.max = m;
    o.nan_count = nans;
    o.count = count;
    o.reserved = 0;
    for (int j = 0; j < kLogitsTopC; ++j) {
      o.token[j] = j < count ? ids[static_cast<size_t>(j)] : -1;
      o.logit[j] = j < count ? x[ids[static_cast<size_t>(j)]] : -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace ms::kernels::cpu
