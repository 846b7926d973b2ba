// Random weights for the GPU tests, drawn on every core of the host: a full-width expert set (GLM-5: 256
// experts x 3 matrices of 6144 x 2048) holds about 10^10 weights, which one thread with one engine draws in
// minutes. Each matrix (and each chunk of rows within one) takes its own engine, seeded from (seed, stream,
// chunk), so the values depend neither on the number of threads nor on the order they run in.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "quant/float_formats.h"
#include "quant/nvfp4.h"

namespace ms::test {

// fn(i) for every i in [0, n), spread over the host's cores (no fixed order); the first exception thrown by
// fn is rethrown here once every thread has stopped.
template <typename Fn>
void parallel_for(int64_t n, Fn&& fn) {
  const int64_t threads =
      std::min<int64_t>(n, std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency())));
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// The engine of (seed, stream, chunk).
template <typename Engine = std::mt19937>
Engine seeded_engine(uint32_t seed, uint64_t stream, uint64_t chunk = 0) {
  std::seed_seq s{seed, static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                  static_cast<uint32_t>(chunk), static_cast<uint32_t>(chunk >> 32)};
  return Engine(s);
}

// w [rows, cols] row-major, row r written by row_fn(engine, r, w + r * cols); rows go in chunks of
// kRowsPerChunk, chunk c drawn in row order by seeded_engine(seed, stream, c), the chunks on all cores.
inline constexpr int64_t kRowsPerChunk = 32;
template <typename RowFn>
void draw_rows(float* w, int64_t rows, int64_t cols, uint32_t seed, uint64_t stream, RowFn&& row_fn) {
  parallel_for((rows + kRowsPerChunk - 1) / kRowsPerChunk, [&](int64_t c) {
    auto rng = seeded_engine(seed, stream, static_cast<uint64_t>(c));
    const int64_t r1 = std::min(rows, (c + 1) * kRowsPerChunk);
    for (int64_t r = c * kRowsPerChunk; r < r1; ++r) row_fn(rng, r, w + r * cols);
  });
}

// [rows, cols] row-major with every element sd * N(0, 1).
inline std::vector<float> normal_matrix(int64_t rows, int64_t cols, float sd, uint32_t seed,
                                        uint64_t stream) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  draw_rows(w.data(), rows, cols, seed, stream, [&](std::mt19937& rng, int64_t, float* row) {
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int64_t c = 0; c < cols; ++c) row[c] = sd * nd(rng);
  });
  return w;
}

// Block scales of random_nvfp4: normal e4m3 values 2^-1 .. 2^2 x (1 + m / 8), a spread of 15x between blocks.
inline constexpr int kNvfp4ScaleExpMin = 6, kNvfp4ScaleExps = 4;  // biased exponents 6 .. 9 (bias 7)

// An NVFP4 matrix [rows, cols] drawn in its stored format instead of quantized from floats, on one thread
// (callers spread matrices over the cores): every E2M1 code equally likely (+-0, +-0.5 .. +-6: both zeros,
// the half and every negative), one normal e4m3 scale per 16 elements from kNvfp4Scale*, and scale2 such
// that the weights' standard deviation is sd. The engine is seeded_engine<mt19937_64>(seed, stream).
inline quant::Nvfp4Weight random_nvfp4(int64_t rows, int64_t cols, float sd, uint32_t seed, uint64_t stream) {
  quant::Nvfp4Weight q;
  q.rows = rows;
  q.cols = cols;
  q.packed.resize(static_cast<size_t>(rows * cols / 2));   // a multiple of 8 bytes: cols % 16 == 0
  q.scales.resize(static_cast<size_t>(rows * cols / 16));  // one byte per block
  auto rng = seeded_engine<std::mt19937_64>(seed, stream);
  for (size_t i = 0; i < q.packed.size(); i += 8) {  // 16 codes per draw
    const uint64_t bits = rng();
    for (int b = 0; b < 8; ++b) q.packed[i + b] = static_cast<uint8_t>(bits >> (8 * b));
  }
  for (size_t i = 0; i < q.scales.size(); i += 8) {  // 8 scales per draw: 2 exponent bits, 3 mantissa bits
    const uint64_t bits = rng();
    for (size_t b = 0; b < 8 && i + b < q.scales.size(); ++b) {
      const auto byte = static_cast<uint32_t>(bits >> (8 * b));
      q.scales[i + b] = static_cast<uint8_t>(((kNvfp4ScaleExpMin + (byte & 3u)) << 3) | ((byte >> 2) & 7u));
    }
  }
  // E[w^2] = E[code^2] * E[scale^2] * scale2^2 (code and scale drawn independently, uniformly).
  double c2 = 0, s2 = 0;
  for (float v : quant::kE2M1Values) c2 += static_cast<double>(v) * v / 8;
  for (uint32_t e = 0; e < kNvfp4ScaleExps; ++e)
    for (uint32_t m = 0; m < 8; ++m) {
      const double s = quant::fp8_e4m3_to_f32(static_cast<uint8_t>(((kNvfp4ScaleExpMin + e) << 3) | m));
      s2 += s * s / (8 * kNvfp4ScaleExps);
    }
  q.scale2 = static_cast<float>(sd / std::sqrt(c2 * s2));
  return q;
}

}  // namespace ms::test
