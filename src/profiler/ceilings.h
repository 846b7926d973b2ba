// The ceilings of the roofline, measured at start on the machine at hand (not taken from datasheets):
// memory bandwidth from multi-threaded reads and copies of a buffer far larger than the last-level cache,
// and a matrix rate from a blocked fp32 GEMM on every thread. Both are best-of-several figures: what this
// machine can do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ms::profiler {

struct Ceilings {
  double mem_gbps = 0;       // 1e9 bytes/s the roofline uses: the better of read and copy
  double matrix_gflops = 0;  // 1e9 FLOP/s
  std::string source;        // "measured" or "given"
  // How the measured figures came about (0 when given).
  double mem_read_gbps = 0, mem_copy_gbps = 0;  // copy counts bytes read + bytes written
  size_t mem_buffer_bytes = 0;
  int gemm_n = 0;  // square fp32 GEMM size, one per thread
  int threads = 0;
  // A GPU's ceilings: what the matrix rate is of ("bf16 cuBLASLt", empty on the CPU) and the FP8 (e4m3)
  // matrix rate of the same square product (0: not measured, or the device has no FP8 tensor cores).
  std::string matrix_kind;
  double fp8_matrix_gflops = 0;
  double measure_seconds = 0;
};

struct CeilingOptions {
  // 0 = 4x the last-level cache, clamped to [64 MiB, 512 MiB]: the cap bounds the start-up time (first
  // touch of the pages costs more than the passes), and a cyclic scan over twice a cache's size already
  // gets next to no hits from it.
  size_t buffer_bytes = 0;
  int mem_repeats = 3;         // passes of each of read and copy; the best counts
  double mem_seconds = 1.0;    // fewer passes (at least one of each) when the first ones take this long
  int gemm_n = 512;            // multiple of 32
  double gemm_seconds = 0.15;  // GEMM passes repeat until this much time is spent; the best pass counts
};

Ceilings measure_ceilings(const CeilingOptions& options = {});

// "--ceilings MEM_GBPS,GFLOPS", e.g. "200,1000": given ceilings for tests and for comparing machines.
Ceilings parse_ceilings(std::string_view spec);

// "memory 14.2 GB/s (read 14.2, copy 11.0, 1024 MiB buffer), matrix 85.3 GFLOP/s (fp32 GEMM 512), 2 threads,
// measured in 0.93 s"
std::string describe(const Ceilings& c);

namespace detail {
// C[m,n] += A[m,k] * B[k,n], all row-major fp32 with leading dimensions k, n, n; on all OpenMP threads or
// on the calling one. The GEMM the matrix ceiling is measured with; exposed so tests can check it computes
// what it claims to.
void gemm_f32(int m, int n, int k, const float* a, const float* b, float* c, bool parallel = true);
// Bytes of the last-level cache (L3, else L2), 0 when unknown.
size_t last_level_cache_bytes();
}  // namespace detail

}  // namespace ms::profiler
