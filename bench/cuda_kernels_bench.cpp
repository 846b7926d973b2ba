// Kernel benchmarks on the GPU at hand: measured ceilings first (device-to-device copy bandwidth), then each
// kernel's time against its floor (bytes it must move / measured bandwidth). One table on stdout.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv.h"

namespace {

template <typename F>
float time_ms(F&& f, int iters) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / static_cast<float>(iters);
}

double measure_copy_gbs() {
  const size_t bytes = size_t{2} << 30;
  void *src, *dst;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&dst, bytes));
  CUDA_CHECK(cudaMemset(src, 1, bytes));
  float ms = time_ms([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;  // read + write
}

}  // namespace

int main() {
  if (ms::cuda::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  auto caps = ms::cuda::query_device(0);
  double bw = measure_copy_gbs();
  std::printf("device: %s (sm_%d, %d SMs, %zu KiB smem/block opt-in)\n", caps.name.c_str(), caps.arch(),
              caps.multiprocessors, caps.smem_per_block_optin / 1024);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n\n", bw);
  std::printf("%-34s %8s %10s %10s %10s %8s\n", "kernel", "MB", "floor us", "time us", "GB/s", "% floor");

  struct Shape {
    const char* name;
    int m, n, k, reps;  // reps: independent weight copies cycled so the working set exceeds L2
  };
  const Shape shapes[] = {
      {"nvfp4_gemv glm5 expert gate_up m1", 1, 4096, 6144, 16},
      {"nvfp4_gemv glm5 expert down m1", 1, 6144, 2048, 32},
      {"nvfp4_gemv glm5 9 experts gate_up m1", 1, 9 * 4096, 6144, 4},
      {"nvfp4_gemv 16384x16384 m1", 1, 16384, 16384, 2},
      {"nvfp4_gemv 16384x16384 m4", 4, 16384, 16384, 2},
      {"nvfp4_gemv 16384x16384 m8", 8, 16384, 16384, 2},
  };
  std::mt19937 rng(7);
  for (const auto& s : shapes) {
    const size_t wbytes = static_cast<size_t>(s.n) * s.k / 2, sbytes = static_cast<size_t>(s.n) * s.k / 16;
    std::vector<uint8_t> hw(wbytes), hs(sbytes);
    for (auto& b : hw) b = static_cast<uint8_t>(rng());
    for (auto& b : hs) b = static_cast<uint8_t>(0x30 + rng() % 8);  // small positive e4m3 scales
    std::vector<uint8_t*> dw(s.reps), ds(s.reps);
    for (int r = 0; r < s.reps; ++r) {
      CUDA_CHECK(cudaMalloc(&dw[r], wbytes));
      CUDA_CHECK(cudaMalloc(&ds[r], sbytes));
      CUDA_CHECK(cudaMemcpy(dw[r], hw.data(), wbytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(ds[r], hs.data(), sbytes, cudaMemcpyHostToDevice));
    }
    __nv_bfloat16* x;
    float* y;
    CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(s.m) * s.k * 2));
    CUDA_CHECK(cudaMemset(x, 0, static_cast<size_t>(s.m) * s.k * 2));
    CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(s.m) * s.n * 4));
    int which = 0;
    float t = time_ms(
        [&] {
          ms::cuda::Nvfp4GemvParams p{dw[which], ds[which], 1.f, x, y, s.m, s.n, s.k};
          ms::cuda::nvfp4_gemv(p, nullptr);
          which = (which + 1) % s.reps;
        },
        50);
    double bytes = static_cast<double>(wbytes + sbytes) + s.m * s.k * 2.0 + s.m * s.n * 4.0;
    double floor_us = bytes / (bw * 1e9) * 1e6;
    std::printf("%-34s %8.1f %10.2f %10.2f %10.0f %7.0f%%\n", s.name, bytes / 1e6, floor_us, t * 1e3,
                bytes / (t * 1e-3) / 1e9, 100.0 * floor_us / (t * 1e3));
    for (int r = 0; r < s.reps; ++r) {
      cudaFree(dw[r]);
      cudaFree(ds[r]);
    }
    cudaFree(x);
    cudaFree(y);
  }
  return 0;
}
