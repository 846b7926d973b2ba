// What every GPU kernel benchmark shares: timing with CUDA events, timing from a replayed CUDA graph (how
// decode steps run), and the two ceilings each run measures for its rooflines, the same way in every
// benchmark: device-to-device copy bandwidth and the dense BF16 tensor-core rate.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/blaslt.h"

namespace ms::bench {

// Milliseconds per call of f() after `warmup` untimed calls, events recorded on `stream` (f must launch
// there, or on the legacy stream when `stream` is null).
template <typename F>
float time_ms(F&& f, int iters, cudaStream_t stream = nullptr, int warmup = 2) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < iters; ++i) f();
  CUDA_CHECK(cudaEventRecord(b, stream));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / static_cast<float>(iters);
}

// Milliseconds per call of f(stream) replayed from a CUDA graph of `calls` captured calls, `replays` timed
// replays after one untimed. When capture is refused: with `graphed` null, an error; otherwise *graphed =
// false and plain launches on the legacy stream are timed instead.
template <typename F>
float time_graph_ms(F&& f, int calls, int replays = 3, bool* graphed = nullptr) {
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) f(s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool ok = false;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
    try {
      for (int i = 0; i < calls; ++i) f(s);
    } catch (const ms::Error&) {
      if (!graphed) {
        cudaStreamEndCapture(s, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaStreamDestroy(s);
        throw;
      }
    }
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && graph &&
         cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  }
  if (!ok) cudaGetLastError();  // clear the refused capture's error
  if (graphed) *graphed = ok;
  MS_CHECK(ok || graphed, "time_graph_ms: the calls could not be captured into a CUDA graph");
  float ms = 0;
  if (ok) {
    CUDA_CHECK(cudaGraphLaunch(exec, s));
    ms = time_ms([&] { CUDA_CHECK(cudaGraphLaunch(exec, s)); }, replays, s, 0) / static_cast<float>(calls);
    cudaGraphExecDestroy(exec);
  } else {
    ms = time_ms([&] { f(nullptr); }, calls);
  }
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return ms;
}

// Device-to-device copy bandwidth in GB/s (read + write) of 2 GiB, best of 5 plain stream launches: a copy
// captured into a graph becomes a memcpy node that ran at 2776 GB/s on an H200 where cudaMemcpyAsync on a
// stream reaches 4270.
inline double measure_copy_gbs() {
  const size_t bytes = size_t{2} << 30;
  void *src = nullptr, *dst = nullptr;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&dst, bytes));
  CUDA_CHECK(cudaMemset(src, 1, bytes));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
  float ms = 1e30f;
  for (int r = 0; r < 5; ++r)
    ms = std::min(ms, time_ms([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); },
                              1, nullptr, 0));
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

// Dense BF16 tensor-core rate in TFLOP/s: an 8192^3 GEMM through cuBLASLt (bf16 in, f32 accumulate and out).
inline double measure_bf16_tflops(cuda::BlasLtHandle& lt) {
  const int64_t n = 8192;
  void *a = nullptr, *w = nullptr, *y = nullptr;
  CUDA_CHECK(cudaMalloc(&a, n * n * 2));
  CUDA_CHECK(cudaMalloc(&w, n * n * 2));
  CUDA_CHECK(cudaMalloc(&y, n * n * 4));
  CUDA_CHECK(cudaMemset(a, 0x3c, n * n * 2));
  CUDA_CHECK(cudaMemset(w, 0x3c, n * n * 2));
  cuda::GemmBf16Params g;
  g.x_bf16 = static_cast<__nv_bfloat16*>(a);
  g.x_bf16_stride = n;
  g.w = static_cast<const __nv_bfloat16*>(w);
  g.w_stride = n;
  g.y = static_cast<float*>(y);
  g.y_stride = n;
  g.m = g.n = g.k = n;
  const float ms = time_ms([&] { cuda::gemm_bf16(g, lt, nullptr); }, 10);
  cudaFree(a);
  cudaFree(w);
  cudaFree(y);
  return 2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace ms::bench
