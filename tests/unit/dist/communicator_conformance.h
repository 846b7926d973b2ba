// What every dist::Communicator must do, as one suite any implementation runs through its factory: the local
// group here (tests/unit/dist), NCCL on GPUs with a harness whose buffers live on the device. Each check runs
// one thread per rank.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "dist/communicator.h"

namespace ms::test {

struct CommHarness {
  // n communicators of one group; a rank waiting longer than `timeout` for the others throws.
  std::function<std::vector<std::unique_ptr<dist::Communicator>>(int n, std::chrono::milliseconds timeout)>
      make;
  // Buffers the communicator works on (host memory by default; device memory for NCCL) and the copies in
  // and out of them, run on the rank's thread.
  std::function<void*(int rank, size_t bytes)> alloc = [](int, size_t b) { return ::operator new(b + 1); };
  std::function<void(int rank, void* p)> release = [](int, void* p) { ::operator delete(p); };
  std::function<void(int rank, void* dst, const void* src, size_t bytes)> upload =
      [](int, void* d, const void* s, size_t b) { std::memcpy(d, s, b); };
  std::function<void(int rank, void* dst, const void* src, size_t bytes)> download =
      [](int, void* d, const void* s, size_t b) { std::memcpy(d, s, b); };
  std::function<void*(int rank)> stream = [](int) -> void* { return nullptr; };
  // Sums are compared to the rank-order f32 sum within this relative bound (0: bit-exact, as the local
  // group promises; NCCL may sum in another order).
  double sum_rel_tol = 0;
};

namespace conformance {

inline float bf16_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// A value no two (rank, call, index) share, with low bits that make the order of a sum matter.
inline float value(int rank, int call, int64_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank) +
                  0.11f * static_cast<float>(call)) *
         (1.0f + 0.001f * static_cast<float>(rank));
}

// Runs fn(rank, comm) on one thread per rank; returns each rank's error message ("" when it returned).
inline std::vector<std::string> run_ranks(std::vector<std::unique_ptr<dist::Communicator>>& comms,
                                          const std::function<void(int, dist::Communicator&)>& fn) {
  std::vector<std::string> err(comms.size());
  std::vector<std::thread> th;
  for (size_t r = 0; r < comms.size(); ++r)
    th.emplace_back([&, r] {
      try {
        fn(static_cast<int>(r), *comms[r]);
      } catch (const std::exception& e) {
        err[r] = e.what();
        if (err[r].empty()) err[r] = "(empty message)";
      }
    });
  for (auto& t : th) t.join();
  return err;
}

template <typename T>
std::vector<T> as(const std::vector<unsigned char>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace conformance

// Sums, gathers, reduce-scatter, broadcast from every root, max; f32 and bf16; odd counts; `calls` rounds
// in a row. Every rank's result is checked against the rank-order reference and against rank 0's bits.
inline void check_communicator_conformance(const CommHarness& h, int n, int calls = 20) {
  using namespace conformance;
  auto comms = h.make(n, std::chrono::milliseconds(20000));
  ASSERT_EQ(static_cast<int>(comms.size()), n);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(comms[static_cast<size_t>(r)]->rank(), r);
    ASSERT_EQ(comms[static_cast<size_t>(r)]->size(), n);
    EXPECT_FALSE(comms[static_cast<size_t>(r)]->describe().empty());
  }
  // results[rank][check] = bytes as downloaded
  std::vector<std::vector<std::vector<unsigned char>>> results(static_cast<size_t>(n));
  const int64_t counts[] = {1, 7, 1001};
  // Every input value, computed once (recomputing could round differently where the compiler fuses).
  const size_t max_in = 1001 * static_cast<size_t>(n);
  std::vector<float> table(static_cast<size_t>(n) * static_cast<size_t>(calls) * max_in);
  for (int q = 0; q < n; ++q)
    for (int call = 0; call < calls; ++call)
      for (size_t i = 0; i < max_in; ++i)
        table[(static_cast<size_t>(q) * static_cast<size_t>(calls) + static_cast<size_t>(call)) * max_in +
              i] = value(q, call, static_cast<int64_t>(i));
  auto input = [&](int q, int call, size_t i) {
    return table[(static_cast<size_t>(q) * static_cast<size_t>(calls) + static_cast<size_t>(call)) * max_in +
                 i];
  };
  auto errs = run_ranks(comms, [&](int rank, dist::Communicator& c) {
    void* s = h.stream(rank);
    auto& out = results[static_cast<size_t>(rank)];
    auto round_trip = [&](size_t bytes, const void* host_in, const std::function<void(void*, void*)>& op,
                          size_t out_bytes) {
      void* a = h.alloc(rank, bytes);
      void* b = h.alloc(rank, out_bytes);
      h.upload(rank, a, host_in, bytes);
      op(a, b);
      std::vector<unsigned char> got(out_bytes);
      h.download(rank, got.data(), b == a ? a : b, out_bytes);
      h.release(rank, a);
      h.release(rank, b);
      out.push_back(std::move(got));
    };
    for (int call = 0; call < calls; ++call)
      for (int64_t cnt : counts) {
        const size_t un = static_cast<size_t>(cnt);
        std::vector<float> f(un * static_cast<size_t>(n));
        for (size_t i = 0; i < f.size(); ++i) f[i] = input(rank, call, i);
        std::vector<uint16_t> bf(f.size());
        for (size_t i = 0; i < f.size(); ++i) bf[i] = f32_bf16(f[i]);
        std::vector<int32_t> iv(un);
        for (size_t i = 0; i < un; ++i)
          iv[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(rank) * 13 + call) % 23) - 11;
        // all_reduce_sum in place: the result is written into the input buffer.
        {
          void* a = h.alloc(rank, un * 4);
          h.upload(rank, a, f.data(), un * 4);
          c.all_reduce_sum(a, cnt, DType::F32, s);
          std::vector<unsigned char> got(un * 4);
          h.download(rank, got.data(), a, un * 4);
          h.release(rank, a);
          out.push_back(std::move(got));
        }
        {
          void* a = h.alloc(rank, un * 2);
          h.upload(rank, a, bf.data(), un * 2);
          c.all_reduce_sum(a, cnt, DType::BF16, s);
          std::vector<unsigned char> got(un * 2);
          h.download(rank, got.data(), a, un * 2);
          h.release(rank, a);
          out.push_back(std::move(got));
        }
        round_trip(
            un * 4, f.data(), [&](void* a, void* b) { c.all_gather(a, b, cnt, DType::F32, s); },
            un * 4 * static_cast<size_t>(n));
        round_trip(
            un * 2, bf.data(), [&](void* a, void* b) { c.all_gather(a, b, cnt, DType::BF16, s); },
            un * 2 * static_cast<size_t>(n));
        round_trip(
            un * 4 * static_cast<size_t>(n), f.data(),
            [&](void* a, void* b) { c.reduce_scatter_sum(a, b, cnt, DType::F32, s); }, un * 4);
        round_trip(
            un * 2 * static_cast<size_t>(n), bf.data(),
            [&](void* a, void* b) { c.reduce_scatter_sum(a, b, cnt, DType::BF16, s); }, un * 2);
        const int root = call % n;
        {
          void* a = h.alloc(rank, un * 4);
          h.upload(rank, a, f.data(), un * 4);
          c.broadcast(a, cnt, DType::F32, root, s);
          std::vector<unsigned char> got(un * 4);
          h.download(rank, got.data(), a, un * 4);
          h.release(rank, a);
          out.push_back(std::move(got));
        }
        {
          void* a = h.alloc(rank, un * 4);
          h.upload(rank, a, iv.data(), un * 4);
          c.all_reduce_max(a, cnt, DType::I32, s);
          std::vector<unsigned char> got(un * 4);
          h.download(rank, got.data(), a, un * 4);
          h.release(rank, a);
          out.push_back(std::move(got));
        }
        {
          void* a = h.alloc(rank, un * 4);
          h.upload(rank, a, f.data(), un * 4);
          c.all_reduce_max(a, cnt, DType::F32, s);
          std::vector<unsigned char> got(un * 4);
          h.download(rank, got.data(), a, un * 4);
          h.release(rank, a);
          out.push_back(std::move(got));
        }
        c.barrier();
      }
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errs[static_cast<size_t>(r)], "") << "rank " << r;

  auto close = [&](double got, double want) {
    return h.sum_rel_tol == 0 ? got == want
                              : std::fabs(got - want) <= h.sum_rel_tol * (std::fabs(want) + 1e-6);
  };
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    size_t k = 0;
    for (int call = 0; call < calls; ++call)
      for (int64_t cnt : counts) {
        const size_t un = static_cast<size_t>(cnt);
        const std::string at = fmt::format("rank {} of {}, call {}, count {}", r, n, call, cnt);
        // every rank's inputs, as the ranks made them
        auto fin = [&](int q, size_t i) { return input(q, call, i); };
        auto bin = [&](int q, size_t i) { return bf16_f32(f32_bf16(fin(q, i))); };
        {
          auto got = as<float>(res[k++]);
          for (size_t i = 0; i < un; ++i) {
            float want = fin(0, i);
            for (int q = 1; q < n; ++q) want += fin(q, i);
            ASSERT_TRUE(close(got[i], want))
                << at << " all_reduce_sum f32 [" << i << "] " << got[i] << " vs " << want;
          }
          ASSERT_EQ(res[k - 1], results[0][k - 1]) << at << " all_reduce_sum f32 differs from rank 0's bits";
        }
        {
          auto got = as<uint16_t>(res[k++]);
          for (size_t i = 0; i < un; ++i) {
            float want = bin(0, i);
            for (int q = 1; q < n; ++q) want += bin(q, i);
            const float g = bf16_f32(got[i]), w = bf16_f32(f32_bf16(want));
            ASSERT_TRUE(h.sum_rel_tol == 0 ? g == w : std::fabs(g - w) <= 1e-2 * (std::fabs(w) + 1e-3))
                << at << " all_reduce_sum bf16 [" << i << "] " << g << " vs " << w;
          }
          ASSERT_EQ(res[k - 1], results[0][k - 1]) << at << " all_reduce_sum bf16 differs from rank 0's bits";
        }
        {
          auto got = as<float>(res[k++]);
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < un; ++i)
              ASSERT_EQ(got[static_cast<size_t>(q) * un + i], fin(q, i)) << at << " all_gather f32";
        }
        {
          auto got = as<uint16_t>(res[k++]);
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < un; ++i)
              ASSERT_EQ(got[static_cast<size_t>(q) * un + i], f32_bf16(fin(q, i)))
                  << at << " all_gather bf16";
        }
        {
          auto got = as<float>(res[k++]);
          for (size_t i = 0; i < un; ++i) {
            const size_t j = static_cast<size_t>(r) * un + i;
            float want = fin(0, j);
            for (int q = 1; q < n; ++q) want += fin(q, j);
            ASSERT_TRUE(close(got[i], want)) << at << " reduce_scatter f32 [" << i << "]";
          }
        }
        {
          auto got = as<uint16_t>(res[k++]);
          for (size_t i = 0; i < un; ++i) {
            const size_t j = static_cast<size_t>(r) * un + i;
            float want = bin(0, j);
            for (int q = 1; q < n; ++q) want += bin(q, j);
            const float g = bf16_f32(got[i]), w = bf16_f32(f32_bf16(want));
            ASSERT_TRUE(h.sum_rel_tol == 0 ? g == w : std::fabs(g - w) <= 1e-2 * (std::fabs(w) + 1e-3))
                << at << " reduce_scatter bf16 [" << i << "]";
          }
        }
        {
          auto got = as<float>(res[k++]);
          for (size_t i = 0; i < un; ++i)
            ASSERT_EQ(got[i], fin(call % n, i)) << at << " broadcast root " << call % n;
        }
        {
          auto got = as<int32_t>(res[k++]);
          for (size_t i = 0; i < un; ++i) {
            int32_t want = INT32_MIN;
            for (int q = 0; q < n; ++q)
              want = std::max(want,
                              static_cast<int32_t>((i * 7 + static_cast<size_t>(q) * 13 + call) % 23) - 11);
            ASSERT_EQ(got[i], want) << at << " all_reduce_max i32 [" << i << "]";
          }
        }
        {
          auto got = as<float>(res[k++]);
          for (size_t i = 0; i < un; ++i) {
            float want = fin(0, i);
            for (int q = 1; q < n; ++q) want = std::max(want, fin(q, i));
            ASSERT_EQ(got[i], want) << at << " all_reduce_max f32 [" << i << "]";
          }
        }
      }
    ASSERT_EQ(k, res.size());
  }
}

// One rank throws instead of joining a collective: every other rank gets ms::Error naming it, within the
// group's timeout, and none hangs.
inline void check_communicator_failure(const CommHarness& h, int n) {
  using namespace conformance;
  ASSERT_GE(n, 2);
  auto comms = h.make(n, std::chrono::milliseconds(300));
  const int bad = n - 1;
  const auto t0 = std::chrono::steady_clock::now();
  auto errs = run_ranks(comms, [&](int rank, dist::Communicator& c) {
    void* a = h.alloc(rank, 64);
    std::vector<float> v(16, 1.0f);
    h.upload(rank, a, v.data(), 64);
    c.all_reduce_sum(a, 16, DType::F32, h.stream(rank));  // one good round first
    h.release(rank, a);
    if (rank == bad) throw std::runtime_error("the planted failure");
    a = h.alloc(rank, 64);
    h.upload(rank, a, v.data(), 64);
    try {
      c.all_reduce_sum(a, 16, DType::F32, h.stream(rank));
    } catch (...) {
      h.release(rank, a);
      throw;
    }
    h.release(rank, a);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0) << "the ranks took too long to give up";
  EXPECT_EQ(errs[static_cast<size_t>(bad)], "the planted failure");
  for (int r = 0; r < n; ++r) {
    if (r == bad) continue;
    EXPECT_NE(errs[static_cast<size_t>(r)].find(fmt::format("rank {}", bad)), std::string::npos)
        << "rank " << r << " of " << n << ": '" << errs[static_cast<size_t>(r)] << "'";
  }
}

}  // namespace ms::test
