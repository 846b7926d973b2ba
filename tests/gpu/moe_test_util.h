// What the grouped-expert GPU tests share (moe_stream_test.cpp, moe_decode_fp8_test.cpp): a device copy of a
// host vector, and the routings they run (top-k without repeats, uniform or skewed towards low expert ids,
// one hot expert set, empty slots).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"

namespace ms::test {

// A device copy of a host vector (or `count` unset elements); get() copies it back.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// [m, K] expert ids, K distinct per token, drawn with weight 1 (uniform) or 1 / (e + 1)^2 (skewed).
inline std::vector<int32_t> route(int m, int K, int E, bool skewed, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(m) * K);
  std::vector<double> pw(E);
  for (int e = 0; e < E; ++e) pw[e] = skewed ? 1.0 / ((e + 1.0) * (e + 1.0)) : 1.0;
  for (int t = 0; t < m; ++t) {
    std::vector<double> w = pw;
    for (int k = 0; k < K; ++k) {
      std::discrete_distribution<int> d(w.begin(), w.end());
      const int e = d(rng);
      w[e] = 0.0;
      ids[static_cast<size_t>(t) * K + k] = e;
    }
  }
  return ids;
}

enum class Routing { Uniform, Skewed, OneHot, EmptySlots };

// route() for a Routing: OneHot sends every token to experts 0..K-1 (one hot expert set, m positions each);
// EmptySlots leaves every third slot empty (-1) and token 0 with no expert at all.
inline std::vector<int32_t> route(int m, int K, int E, Routing routing, std::mt19937& rng) {
  auto ids = route(m, K, E, routing == Routing::Skewed, rng);
  if (routing == Routing::OneHot)
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % K);
  if (routing == Routing::EmptySlots)
    for (size_t i = 0; i < ids.size(); ++i)
      if (i % 3 == 1 || i < static_cast<size_t>(K)) ids[i] = -1;
  return ids;
}

}  // namespace ms::test
