#include "profiler/ceilings.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/error.h"

namespace ms::profiler {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Register tile of the GEMM micro-kernel: kMR rows x kNR columns of C stay in vector registers
// (6 x 2 zmm with AVX-512, 6 x 2 ymm with AVX2).
#if defined(__AVX512F__)
constexpr int kNR = 32;
#else
constexpr int kNR = 16;
#endif
constexpr int kMR = 6;

// ap: [kc][kMR] packed rows of A; bp: [kc][kNR] packed columns of B; c: the tile's top-left in C (ld ldc),
// of which rows x cols are inside the matrix.
void micro_kernel(int kc, const float* __restrict__ ap, const float* __restrict__ bp, float* __restrict__ c,
                  int ldc, int rows, int cols) {
  float acc[kMR][kNR] = {};
  for (int kk = 0; kk < kc; ++kk) {
    const float* b = bp + static_cast<size_t>(kk) * kNR;
    for (int r = 0; r < kMR; ++r) {
      const float a = ap[static_cast<size_t>(kk) * kMR + r];
#pragma omp simd
      for (int j = 0; j < kNR; ++j) acc[r][j] += a * b[j];
    }
  }
  if (rows == kMR && cols == kNR) {
    for (int r = 0; r < kMR; ++r) {
#pragma omp simd
      for (int j = 0; j < kNR; ++j) c[static_cast<size_t>(r) * ldc + j] += acc[r][j];
    }
  } else {
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j) c[static_cast<size_t>(r) * ldc + j] += acc[r][j];
  }
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using AlignedPtr = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
AlignedPtr<T> aligned_array(size_t count, size_t alignment) {
  size_t bytes = (count * sizeof(T) + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, bytes);
  MS_CHECK(p != nullptr, "ceilings: cannot allocate {} bytes", bytes);
  return AlignedPtr<T>(static_cast<T*>(p));
}

// Sum of x[0, n): a read of every byte, vectorised and split over the threads.
float read_pass(const float* __restrict__ x, size_t n) {
  float sum = 0;
#pragma omp parallel for simd reduction(+ : sum) schedule(static)
  for (size_t i = 0; i < n; ++i) sum += x[i];
  return sum;
}

void copy_pass(const float* __restrict__ src, float* __restrict__ dst, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}

volatile float g_sink;  // keeps the reads from being optimised away

void measure_memory(const CeilingOptions& opt, Ceilings& out) {
  const auto start = Clock::now();
  size_t bytes = opt.buffer_bytes;
  if (bytes == 0) {
    constexpr size_t kMiB = size_t{1} << 20;
    bytes = std::clamp<size_t>(4 * detail::last_level_cache_bytes(), 64 * kMiB, 512 * kMiB);
  }
  constexpr size_t kChunk = 64;  // floats; keeps both halves whole cache lines
  size_t n = std::max<size_t>(bytes / sizeof(float) / (2 * kChunk), 1) * 2 * kChunk;
  // No MADV_HUGEPAGE: compacting memory for huge pages made the first touch several times slower on
  // virtual machines, and the first touch is most of the start-up time.
  auto buf = aligned_array<float>(n, 4096);
  float* x = buf.get();
  // First touch with the same static schedule as the passes, so pages sit near the threads that read them.
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i & 1023);

  out.mem_buffer_bytes = n * sizeof(float);
  double best_read = 0, best_copy = 0;
  for (int rep = 0;
       rep < std::max(opt.mem_repeats, 1) && (rep == 0 || seconds_since(start) < opt.mem_seconds); ++rep) {
    auto t0 = Clock::now();
    g_sink = read_pass(x, n);
    best_read = std::max(best_read, static_cast<double>(n * sizeof(float)) / seconds_since(t0) / 1e9);
    t0 = Clock::now();
    copy_pass(x, x + n / 2, n / 2);
    best_copy = std::max(best_copy, static_cast<double>(n * sizeof(float)) / seconds_since(t0) / 1e9);
  }
  out.mem_read_gbps = best_read;
  out.mem_copy_gbps = best_copy;
  out.mem_gbps = std::max(best_read, best_copy);
}

// Every thread runs its own single-threaded GEMM on its own matrices, with no barrier between them, and the
// ceiling is the sum of the threads' best passes: the rate the cores reach together, and a figure that a
// thread losing its core for a while on a shared machine cannot drag down for the others.
void measure_matrix(const CeilingOptions& opt, Ceilings& out) {
  const int n = opt.gemm_n;
  MS_CHECK(n >= 32 && n % 32 == 0, "ceilings: gemm_n must be a positive multiple of 32, got {}", n);
  const size_t nn = static_cast<size_t>(n) * n;
  const int threads = std::max(omp_get_max_threads(), 1);
  std::vector<AlignedPtr<float>> mats;  // per thread: A, B, C, each [n, n]
  for (int t = 0; t < 3 * threads; ++t) mats.push_back(aligned_array<float>(nn, 64));
  std::vector<double> best(threads, 0.0);
  const double flops = 2.0 * n * n * static_cast<double>(n);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    float *a = mats[3 * t].get(), *b = mats[3 * t + 1].get(), *c = mats[3 * t + 2].get();
    for (size_t i = 0; i < nn; ++i) {
      a[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
      b[i] = static_cast<float>(i % 5) * 0.125f - 0.25f;
      c[i] = 0;
    }
    auto start = Clock::now();
    // Pass 0 warms the caches; it counts too, the best pass wins.
    for (int pass = 0; pass < 2 || (seconds_since(start) < opt.gemm_seconds && pass < 100000); ++pass) {
      auto t0 = Clock::now();
      detail::gemm_f32(n, n, n, a, b, c, /*parallel=*/false);
      best[t] = std::max(best[t], flops / seconds_since(t0) / 1e9);
    }
    if (t == 0) g_sink = c[nn / 2];
  }
  out.gemm_n = n;
  out.matrix_gflops = 0;
  for (double r : best) out.matrix_gflops += r;
}

double parse_positive(std::string_view s, std::string_view what, std::string_view spec) {
  double v = 0;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !(v > 0) || v > 1e9) {
    MS_THROW("--ceilings '{}': {} '{}' is not a positive number", spec, what, s);
  }
  return v;
}

}  // namespace

namespace detail {

void gemm_f32(int m, int n, int k, const float* a, const float* b, float* c, bool parallel) {
  MS_CHECK(m > 0 && n > 0 && k > 0, "gemm_f32: sizes must be positive, got m={} n={} k={}", m, n, k);
  const int mb = (m + kMR - 1) / kMR, nb = (n + kNR - 1) / kNR;
  // ap: [mb][k][kMR], bp: [nb][k][kNR], zero-padded past the edges of A and B.
  auto ap = aligned_array<float>(static_cast<size_t>(mb) * k * kMR, 64);
  auto bp = aligned_array<float>(static_cast<size_t>(nb) * k * kNR, 64);
  // Dynamic schedules throughout: on a shared machine a thread that loses its core for a while must not hold
  // the others at the barrier with its static share of the work.
#pragma omp parallel if (parallel)
  {
#pragma omp for schedule(dynamic, 4) nowait
    for (int ib = 0; ib < mb; ++ib) {
      float* dst = ap.get() + static_cast<size_t>(ib) * k * kMR;
      for (int kk = 0; kk < k; ++kk)
        for (int r = 0; r < kMR; ++r) {
          int row = ib * kMR + r;
          dst[static_cast<size_t>(kk) * kMR + r] = row < m ? a[static_cast<size_t>(row) * k + kk] : 0.0f;
        }
    }
#pragma omp for schedule(dynamic, 1)
    for (int jb = 0; jb < nb; ++jb) {
      float* dst = bp.get() + static_cast<size_t>(jb) * k * kNR;
      for (int kk = 0; kk < k; ++kk)
        for (int j = 0; j < kNR; ++j) {
          int col = jb * kNR + j;
          dst[static_cast<size_t>(kk) * kNR + j] = col < n ? b[static_cast<size_t>(kk) * n + col] : 0.0f;
        }
    }
    // One C tile per iteration, all of k at once: the tile's accumulators stay in registers while the A
    // strip (k x kMR) and the B panel (k x kNR) stream from L1/L2. jb outer so threads share B panels.
#pragma omp for collapse(2) schedule(dynamic, 8)
    for (int jb = 0; jb < nb; ++jb) {
      for (int ib = 0; ib < mb; ++ib) {
        const float* astrip = ap.get() + static_cast<size_t>(ib) * k * kMR;
        const float* bpanel = bp.get() + static_cast<size_t>(jb) * k * kNR;
        float* ctile = c + static_cast<size_t>(ib) * kMR * n + static_cast<size_t>(jb) * kNR;
        micro_kernel(k, astrip, bpanel, ctile, n, std::min(kMR, m - ib * kMR), std::min(kNR, n - jb * kNR));
      }
    }
  }
}

size_t last_level_cache_bytes() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return static_cast<size_t>(l3);
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? static_cast<size_t>(l2) : 0;
}

}  // namespace detail

Ceilings measure_ceilings(const CeilingOptions& options) {
  auto t0 = Clock::now();
  Ceilings c;
  c.source = "measured";
  c.threads = omp_get_max_threads();
  measure_memory(options, c);
  measure_matrix(options, c);
  c.measure_seconds = seconds_since(t0);
  return c;
}

Ceilings parse_ceilings(std::string_view spec) {
  auto comma = spec.find(',');
  if (comma == std::string_view::npos || spec.find(',', comma + 1) != std::string_view::npos) {
    MS_THROW("--ceilings '{}': expected MEM_GBPS,GFLOPS (e.g. 200,1000)", spec);
  }
  Ceilings c;
  c.source = "given";
  c.mem_gbps = parse_positive(spec.substr(0, comma), "memory GB/s", spec);
  c.matrix_gflops = parse_positive(spec.substr(comma + 1), "matrix GFLOP/s", spec);
  return c;
}

std::string describe(const Ceilings& c) {
  if (c.source != "measured") {
    return fmt::format("memory {:.1f} GB/s, matrix {:.1f} GFLOP/s ({})", c.mem_gbps, c.matrix_gflops,
                       c.source.empty() ? "given" : c.source);
  }
  if (!c.matrix_kind.empty()) {
    const std::string fp8 = c.fp8_matrix_gflops > 0
                                ? fmt::format(", fp8 e4m3 {:.1f} GFLOP/s", c.fp8_matrix_gflops)
                                : std::string();
    return fmt::format(
        "memory {:.1f} GB/s (device copy, {} MiB each way), matrix {:.1f} GFLOP/s ({} {}^3){}, "
        "measured in {:.2f} s",
        c.mem_gbps, c.mem_buffer_bytes >> 20, c.matrix_gflops, c.matrix_kind, c.gemm_n, fp8,
        c.measure_seconds);
  }
  return fmt::format(
      "memory {:.1f} GB/s (read {:.1f}, copy {:.1f}, {} MiB buffer), matrix {:.1f} GFLOP/s (fp32 GEMM {} per "
      "thread), "
      "{} threads, measured in {:.2f} s",
      c.mem_gbps, c.mem_read_gbps, c.mem_copy_gbps, c.mem_buffer_bytes >> 20, c.matrix_gflops, c.gemm_n,
      c.threads, c.measure_seconds);
}

}  // namespace ms::profiler
