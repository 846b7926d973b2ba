// NcclComm on the GPU: every collective against the host's answer from all ranks' random inputs, outputs
// poisoned with NaN (0xff bytes) first; world 1 on one GPU (identities and copies) and 2 ranks as two threads
// on two GPUs with one unique id; a collective captured in a CUDA graph; a rank that never joins a collective
// is reported by the watchdog instead of hanging.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <random>
#include <thread>

#include "core/error.h"
#include "cuda_test_util.h"
#include "dist/nccl_comm.h"
#include "quant/float_formats.h"

namespace ms::dist {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using test::DeviceBuffer;

#if MOESERVE_HAVE_NCCL

constexpr int64_t kCount = 1000;  // not a multiple of NCCL's chunking

std::vector<float> rank_floats(int rank, int64_t n, uint32_t salt) {
  return test::random_floats(static_cast<size_t>(n), 1000u * salt + static_cast<uint32_t>(rank));
}
std::vector<int32_t> rank_ints(int rank, int64_t n, uint32_t salt) {
  std::mt19937 rng(7000u * salt + static_cast<uint32_t>(rank));
  std::uniform_int_distribution<int32_t> d(-1000000, 1000000);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = quant::f32_to_bf16(f[i]);
  return b;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, float tol,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": element " << i << " not written";
    ASSERT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i]))) << what << ": element " << i;
  }
}

// One rank's share of the collectives; every rank runs it with the same counts in the same order.
void run_collectives(NcclComm& c, cudaStream_t s) {
  const int world = c.size(), rank = c.rank();
  SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(world));

  {  // all_reduce_sum f32
    DeviceBuffer<float> d(rank_floats(rank, kCount, 1));
    c.all_reduce_sum(d.get(), kCount, DType::F32, s);
    std::vector<float> want(kCount, 0.0f);
    for (int r = 0; r < world; ++r) {
      auto in = rank_floats(r, kCount, 1);
      for (int64_t i = 0; i < kCount; ++i) want[i] += in[i];
    }
    expect_near_all(d.download(), want, 1e-5f, "all_reduce_sum f32");
  }
  {  // all_reduce_sum bf16: inputs rounded to bf16, sums compared at bf16 precision
    DeviceBuffer<uint16_t> d(to_bf16(rank_floats(rank, kCount, 2)));
    c.all_reduce_sum(d.get(), kCount, DType::BF16, s);
    std::vector<float> want(kCount, 0.0f);
    for (int r = 0; r < world; ++r) {
      auto in = to_bf16(rank_floats(r, kCount, 2));
      for (int64_t i = 0; i < kCount; ++i) want[i] += quant::bf16_to_f32(in[i]);
    }
    auto got_b = d.download();
    std::vector<float> got(kCount);
    for (int64_t i = 0; i < kCount; ++i) got[i] = quant::bf16_to_f32(got_b[i]);
    expect_near_all(got, want, world == 1 ? 0.0f : 1e-2f, "all_reduce_sum bf16");
  }
  {  // all_gather f32: exact copies in rank order
    DeviceBuffer<float> in(rank_floats(rank, kCount, 3));
    DeviceBuffer<float> out(static_cast<size_t>(world * kCount));
    c.all_gather(in.get(), out.get(), kCount, DType::F32, s);
    std::vector<float> want;
    for (int r = 0; r < world; ++r) {
      auto v = rank_floats(r, kCount, 3);
      want.insert(want.end(), v.begin(), v.end());
    }
    expect_near_all(out.download(), want, 0.0f, "all_gather f32");
  }
  {  // reduce_scatter_sum f32
    DeviceBuffer<float> in(rank_floats(rank, world * kCount, 4));
    DeviceBuffer<float> out(static_cast<size_t>(kCount));
    c.reduce_scatter_sum(in.get(), out.get(), kCount, DType::F32, s);
    std::vector<float> want(kCount, 0.0f);
    for (int r = 0; r < world; ++r) {
      auto v = rank_floats(r, world * kCount, 4);
      for (int64_t i = 0; i < kCount; ++i) want[i] += v[rank * kCount + i];
    }
    expect_near_all(out.download(), want, 1e-5f, "reduce_scatter_sum f32");
  }
  {  // broadcast f32 and i32 from the last rank
    int root = world - 1;
    DeviceBuffer<float> d(rank_floats(rank, kCount, 5));
    c.broadcast(d.get(), kCount, DType::F32, root, s);
    expect_near_all(d.download(), rank_floats(root, kCount, 5), 0.0f, "broadcast f32");
    DeviceBuffer<int32_t> di(rank_ints(rank, kCount, 6));
    c.broadcast(di.get(), kCount, DType::I32, root, s);
    EXPECT_EQ(di.download(), rank_ints(root, kCount, 6)) << "broadcast i32";
  }
  {  // all_reduce_max i32 and f32
    DeviceBuffer<int32_t> di(rank_ints(rank, kCount, 7));
    c.all_reduce_max(di.get(), kCount, DType::I32, s);
    std::vector<int32_t> want = rank_ints(0, kCount, 7);
    for (int r = 1; r < world; ++r) {
      auto v = rank_ints(r, kCount, 7);
      for (int64_t i = 0; i < kCount; ++i) want[i] = std::max(want[i], v[i]);
    }
    EXPECT_EQ(di.download(), want) << "all_reduce_max i32";
    DeviceBuffer<float> df(rank_floats(rank, kCount, 8));
    c.all_reduce_max(df.get(), kCount, DType::F32, s);
    std::vector<float> wantf = rank_floats(0, kCount, 8);
    for (int r = 1; r < world; ++r) {
      auto v = rank_floats(r, kCount, 8);
      for (int64_t i = 0; i < kCount; ++i) wantf[i] = std::max(wantf[i], v[i]);
    }
    expect_near_all(df.download(), wantf, 0.0f, "all_reduce_max f32");
  }
  c.barrier();
  {  // captured in a CUDA graph, replayed twice with fresh inputs and poisoned outputs
    DeviceBuffer<float> in(static_cast<size_t>(kCount));
    DeviceBuffer<float> out(static_cast<size_t>(world * kCount));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    c.all_gather(in.get(), out.get(), kCount, DType::F32, s);
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (uint32_t replay = 0; replay < 2; ++replay) {
      in.upload(rank_floats(rank, kCount, 10 + replay));
      out.poison();
      CUDA_CHECK(cudaGraphLaunch(exec, s));
      c.watch(s);
      std::vector<float> want;
      for (int r = 0; r < world; ++r) {
        auto v = rank_floats(r, kCount, 10 + replay);
        want.insert(want.end(), v.begin(), v.end());
      }
      expect_near_all(out.download(), want, 0.0f, "all_gather in a graph");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  c.check();
  EXPECT_THAT(
      [&] {
        try {
          c.all_reduce_sum(nullptr, 1, DType::I32, s);
        } catch (const Error& e) {
          return e.message();
        }
        return std::string("no error");
      }(),
      HasSubstr("all_reduce_sum: dtype i32 is not supported"));
}

TEST(NcclComm, OneRankOnOneGpu) {
  MS_REQUIRE_GPU();
  CUDA_CHECK(cudaSetDevice(0));
  NcclComm c(nccl_unique_id(), 0, 1);
  EXPECT_THAT(c.describe(), HasSubstr("rank 0 of 1 on cuda:0"));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  run_collectives(c, s);
  CUDA_CHECK(cudaStreamDestroy(s));
}

// Two ranks as threads of this process, one GPU each, created from one unique id.
void two_ranks(const std::function<void(NcclComm&, cudaStream_t)>& body, NcclOptions opt = {}) {
  auto id = nccl_unique_id();
  auto rank = [&](int r) {
    CUDA_CHECK(cudaSetDevice(r));
    NcclComm c(id, r, 2, opt);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    body(c, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaStreamDestroy(s));
  };
  auto r1 = std::async(std::launch::async, rank, 1);
  rank(0);
  r1.get();
}

TEST(NcclComm, TwoRanksOnTwoGpus) {
  MS_REQUIRE_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  NcclOptions opt;
  opt.op_timeout = 60s;  // a rank that fails an ASSERT and leaves ends the other's wait in a minute
  two_ranks(run_collectives, opt);
}

TEST(NcclComm, ARankThatNeverJoinsIsReportedNotWaitedFor) {
  MS_REQUIRE_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  NcclOptions opt;
  opt.op_timeout = 2s;
  std::string error = "no error";
  two_ranks(
      [&](NcclComm& c, cudaStream_t s) {
        if (c.rank() == 1) {
          std::this_thread::sleep_for(4s);  // never joins; then leaves without waiting for rank 0
          c.abort("test: rank 1 leaves");
          return;
        }
        DeviceBuffer<float> d(rank_floats(0, kCount, 1));
        auto start = std::chrono::steady_clock::now();
        try {
          // Either the enqueue itself waits on rank 1 (NCCL connects peers at the first collective) and
          // gives up after op_timeout, or the kernel spins until the watchdog aborts the communicator,
          // which ends the kernel: the stream drains and check() throws.
          c.all_reduce_sum(d.get(), kCount, DType::F32, s);
        } catch (const Error& e) {
          error = e.message();
        }
        cudaStreamSynchronize(s);
        cudaGetLastError();
        for (int i = 0; i < 100 && error == "no error"; ++i) {
          try {
            c.check();
          } catch (const Error& e) {
            error = e.message();
            break;
          }
          std::this_thread::sleep_for(50ms);
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
      },
      opt);
  EXPECT_THAT(error, HasSubstr("NCCL rank 0 of 2 (cuda:0): all_reduce_sum of 1000 f32 "));
  EXPECT_THAT(error, HasSubstr(" after 2 s: a rank died or hung"));
}

#else

TEST(NcclComm, BuiltWithoutNcclSaysSo) {
  RankInfo info;
  info.world_size = 2;
  try {
    connect_nccl(info);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("NCCL is missing"));
  }
  EXPECT_FALSE(nccl_available());
}

#endif

}  // namespace
}  // namespace ms::dist
