// Helpers shared by the model tests: run a prompt through the engine's model, whole or token by token.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kv/forward_batch.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "test_executor.h"

namespace ms::test {

// max |a - b| / max |b|.
inline double rel_error(const float* a, const double* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / std::max(den, 1e-30);
}

struct Runner {
  model::Model& model;
  ExecPool pool;
  Runner(model::Model& m, kv::KvCacheDType dt, int32_t page_size = 16, int32_t pages = 64)
      : model(m), pool(m, pages, page_size, dt) {}

  // Logits [ids.size(), vocab] of one prompt, prefilled in chunks of `chunk` tokens (0: all at once).
  std::vector<float> run(const std::vector<int32_t>& ids, int32_t chunk = 0) {
    std::vector<int32_t> pages;
    EXPECT_TRUE(pool.allocator().allocate(pool.pages_for(static_cast<int64_t>(ids.size())), pages));
    const int64_t V = model.config().vocab_size;
    std::vector<float> out;
    const int32_t n = static_cast<int32_t>(ids.size());
    if (chunk <= 0) chunk = n;
    for (int32_t start = 0; start < n; start += chunk) {
      const int32_t len = std::min(chunk, n - start);
      kv::ForwardBatchBuilder bb(pool.page_size());
      bb.add_sequence(pages, start, ids.data() + start, len, false);
      kv::ForwardBatch b = bb.finish();
      for (int32_t i = 0; i < len; ++i) b.logit_rows.push_back(i);
      Tensor lg = pool.forward(b);
      out.insert(out.end(), lg.data<float>(), lg.data<float>() + len * V);
    }
    pool.allocator().release_all(pages);
    return out;
  }
};

}  // namespace ms::test
