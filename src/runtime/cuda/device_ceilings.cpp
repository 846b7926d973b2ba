#include "runtime/cuda/device_ceilings.h"

#include "core/error.h"

#if MOESERVE_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/blaslt.h"
#endif

namespace ms::runtime::cuda {

#if MOESERVE_HAVE_CUDA

namespace {

// Random bf16 values in [-1, 1) from a counter hash (never zeros: a product of zeros runs faster).
void fill_random_bf16(std::vector<uint16_t>& v, uint32_t seed) {
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    const float f = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v[i] = static_cast<uint16_t>(bits >> 16);
  }
}

template <typename F>
double best_ms(cudaStream_t s, int reps, F&& f) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  f();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaEventRecord(a, s));
    f();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, static_cast<double>(ms));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

}  // namespace

profiler::Ceilings measure_device_ceilings() {
  const auto t0 = std::chrono::steady_clock::now();
  profiler::Ceilings c;
  c.source = "measured";
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Copy: 2 GiB each way.
  const size_t bytes = size_t{1} << 31;
  void *src = nullptr, *dst = nullptr;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&dst, bytes));
  CUDA_CHECK(cudaMemsetAsync(src, 1, bytes, s));
  const double copy_ms =
      best_ms(s, 5, [&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
  c.mem_copy_gbps = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e-3) / 1e9;
  c.mem_gbps = c.mem_copy_gbps;
  c.mem_buffer_bytes = bytes;
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));
  // BF16 matrix rate: 8192^3 on random data through cuBLASLt.
  const int n = 8192;
  const size_t elems = static_cast<size_t>(n) * n;
  __nv_bfloat16 *a = nullptr, *w = nullptr;
  float* y = nullptr;
  CUDA_CHECK(cudaMalloc(&a, elems * 2));
  CUDA_CHECK(cudaMalloc(&w, elems * 2));
  CUDA_CHECK(cudaMalloc(&y, elems * 4));
  {
    std::vector<uint16_t> h(elems);
    fill_random_bf16(h, 1u);
    CUDA_CHECK(cudaMemcpy(a, h.data(), elems * 2, cudaMemcpyHostToDevice));
    fill_random_bf16(h, 2u);
    CUDA_CHECK(cudaMemcpy(w, h.data(), elems * 2, cudaMemcpyHostToDevice));
  }
  {
    ms::cuda::BlasLtHandle lt;
    ms::cuda::GemmBf16Params p;
    p.x_bf16 = a;
    p.x_bf16_stride = n;
    p.w = w;
    p.w_stride = n;
    p.y = y;
    p.y_stride = n;
    p.m = p.n = p.k = n;
    const double mm_ms = best_ms(s, 5, [&] { ms::cuda::gemm_bf16(p, lt, s); });
    c.matrix_gflops = 2.0 * n * static_cast<double>(n) * n / (mm_ms * 1e-3) / 1e9;
    c.gemm_n = n;
    c.matrix_kind = "bf16 cuBLASLt";
    // FP8 e4m3 rate of the same product (sm_89+): random finite bytes in the bf16 buffers' memory.
    int dev = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major * 10 + minor >= 89) {
      std::vector<uint8_t> h(elems);
      for (size_t i = 0; i < elems; ++i) {
        uint32_t x = static_cast<uint32_t>(i) * 2246822519u ^ 0x9e3779b9u;
        x ^= x >> 13;
        x *= 0x85ebca6bu;
        x ^= x >> 16;
        h[i] = static_cast<uint8_t>(x & 0xB7u);  // exponent <= 6 of 15: finite, no NaN, mostly non-zero
      }
      CUDA_CHECK(cudaMemcpy(a, h.data(), elems, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(w, h.data(), elems, cudaMemcpyHostToDevice));
      ms::cuda::GemmFp8Params q;
      q.x = reinterpret_cast<const uint8_t*>(a);
      q.x_stride = n;
      q.w = reinterpret_cast<const uint8_t*>(w);
      q.w_stride = n;
      q.y = y;
      q.y_stride = n;
      q.m = q.n = q.k = n;
      try {
        const double fp8_ms = best_ms(s, 5, [&] { ms::cuda::gemm_fp8(q, lt, s); });
        c.fp8_matrix_gflops = 2.0 * n * static_cast<double>(n) * n / (fp8_ms * 1e-3) / 1e9;
      } catch (const ms::Error& e) {
        // (printf, not the logger: fmt's float formatting trips a g++ 13 array-bounds false positive here)
        std::fprintf(stderr, "warning: no FP8 matrix-rate ceiling: %s\n", e.message().c_str());
      }
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  cudaFree(a);
  cudaFree(w);
  cudaFree(y);
  cudaStreamDestroy(s);
  c.threads = 0;
  c.measure_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

#else

profiler::Ceilings measure_device_ceilings() {
  MS_THROW("GPU ceilings need a build with the CUDA backend");
}

#endif

}  // namespace ms::runtime::cuda
