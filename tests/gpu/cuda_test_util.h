// Helpers of the CUDA kernel tests: device buffers poisoned with NaN (0xff bytes) before each run, host
// random data, and comparisons that fail on any unwritten (NaN) element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"

namespace ms::test {

#define MS_REQUIRE_GPU() \
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    CUDA_CHECK(cudaMalloc(&ptr_, (count ? count : 1) * sizeof(T)));
    poison();
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  // 0xff in every byte: NaN for f32 and bf16, the NaN code for fp8 e4m3.
  void poison() { CUDA_CHECK(cudaMemset(ptr_, 0xff, (count_ ? count_ : 1) * sizeof(T))); }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(count_);
    CUDA_CHECK(cudaMemcpy(h.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Equal bits, or both NaN (GPU arithmetic canonicalises NaN payloads).
inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

// Every element of rows [0, rows) x cols [0, cols) of got (row stride got_stride) against ref (ref_stride):
// |got - ref| <= atol + rtol * |ref|; a NaN in got fails. Elements between cols and got_stride must still
// hold the poison (NaN): the kernel wrote nothing outside its output.
inline void expect_rows_close(const std::vector<float>& got, int64_t got_stride,
                              const std::vector<float>& ref, int64_t ref_stride, int64_t rows, int64_t cols,
                              double rtol, double atol, const std::string& what) {
  int bad = 0;
  for (int64_t r = 0; r < rows && bad < 5; ++r) {
    for (int64_t c = 0; c < got_stride && bad < 5; ++c) {
      const float g = got[static_cast<size_t>(r * got_stride + c)];
      if (c >= cols) {
        if (!std::isnan(g)) {
          ADD_FAILURE() << what << ": padding [" << r << ", " << c << "] was written (" << g << ")";
          ++bad;
        }
        continue;
      }
      const double e = ref[static_cast<size_t>(r * ref_stride + c)];
      if (!(std::fabs(g - e) <= atol + rtol * std::fabs(e))) {
        ADD_FAILURE() << what << ": [" << r << ", " << c << "] got " << g << " want " << e;
        ++bad;
      }
    }
  }
}

}  // namespace ms::test
