// Programmatic dependent launch (kernels/cuda/common/pdl.h, pdl.cuh): chains of a few hundred dependent
// launches where each kernel reads what its predecessor wrote (an element written by another block) and
// writes what its predecessor read (ping-pong buffers), eagerly and inside a captured graph, with plain
// launches and copies interleaved; results checked exactly against the same recurrence on the host. Also
// that capture records programmatic edges when PDL is on and none when it is off.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"

namespace {

using ms::cuda::launch_kernel;

struct ChainParams {
  const uint32_t* __restrict__ in;  // [n]: what the previous step wrote
  uint32_t* __restrict__ out;       // [n]: what the step before the previous one read
  int n;
  uint32_t step;
};

__host__ __device__ inline uint32_t chain_value(uint32_t far, uint32_t self, uint32_t step) {
  return far * 2654435761u + (self ^ (self >> 13)) + step * 40503u + 1u;
}

__host__ __device__ inline int far_index(int i, int n) {
  return static_cast<int>((static_cast<int64_t>(i) * 7919 + 4099) % n);
}

__global__ void chain_step_kernel(ChainParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // index arithmetic only before the wait
  ms::cuda::dev::grid_dep_wait();
  ms::cuda::dev::grid_dep_launch_dependents();
  if (i >= p.n) return;
  p.out[i] = chain_value(p.in[far_index(i, p.n)], p.in[i], p.step);
}

constexpr int kThreads = 128;

// A step through the PDL launcher, or a plain launch.
void chain_step(const uint32_t* in, uint32_t* out, int n, uint32_t step, bool plain, cudaStream_t s) {
  const ChainParams p{in, out, n, step};
  const dim3 grid((n + kThreads - 1) / kThreads);
  if (plain) {
    chain_step_kernel<<<grid, kThreads, 0, s>>>(p);
    CUDA_CHECK(cudaGetLastError());
  } else {
    launch_kernel("chain_step", chain_step_kernel, grid, dim3(kThreads), 0, s, p);
  }
}

std::vector<uint32_t> initial(int n) {
  std::vector<uint32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i) * 2246822519u + 374761393u;
  return v;
}

// The host's chain: `steps` steps from `x`; snapshot after step `snap_after` (when >= 0).
std::vector<uint32_t> host_chain(std::vector<uint32_t> x, int steps, int snap_after,
                                 std::vector<uint32_t>* snap) {
  const int n = static_cast<int>(x.size());
  std::vector<uint32_t> y(n);
  for (int k = 0; k < steps; ++k) {
    for (int i = 0; i < n; ++i) y[i] = chain_value(x[far_index(i, n)], x[i], static_cast<uint32_t>(k));
    x.swap(y);
    if (k == snap_after && snap) *snap = x;
  }
  return x;
}

struct Buffers {
  uint32_t* init = nullptr;  // [n] the initial values
  uint32_t* buf[2] = {nullptr, nullptr};
  uint32_t* snap = nullptr;
  int n = 0;
  explicit Buffers(int n_) : n(n_) {
    const size_t bytes = static_cast<size_t>(n) * 4;
    CUDA_CHECK(cudaMalloc(&init, bytes));
    CUDA_CHECK(cudaMalloc(&buf[0], bytes));
    CUDA_CHECK(cudaMalloc(&buf[1], bytes));
    CUDA_CHECK(cudaMalloc(&snap, bytes));
    const auto h = initial(n);
    CUDA_CHECK(cudaMemcpy(init, h.data(), bytes, cudaMemcpyHostToDevice));
    poison();
  }
  ~Buffers() {
    cudaFree(init);
    cudaFree(buf[0]);
    cudaFree(buf[1]);
    cudaFree(snap);
  }
  void poison() {
    const size_t bytes = static_cast<size_t>(n) * 4;
    CUDA_CHECK(cudaMemset(buf[0], 0xff, bytes));
    CUDA_CHECK(cudaMemset(buf[1], 0xff, bytes));
    CUDA_CHECK(cudaMemset(snap, 0xff, bytes));
  }
  std::vector<uint32_t> get(const uint32_t* p) const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost));
    return h;
  }
};

// The chain on stream `s`: a copy of the initial values, then `steps` steps (every `plain_every`-th one
// launched plainly, 0: none), a copy of the buffer after step `snap_after`. Returns the final buffer.
const uint32_t* enqueue_chain(Buffers& b, int steps, int plain_every, int snap_after, cudaStream_t s) {
  const size_t bytes = static_cast<size_t>(b.n) * 4;
  CUDA_CHECK(cudaMemcpyAsync(b.buf[0], b.init, bytes, cudaMemcpyDeviceToDevice, s));
  for (int k = 0; k < steps; ++k) {
    const bool plain = plain_every > 0 && k % plain_every == plain_every - 1;
    chain_step(b.buf[k % 2], b.buf[(k + 1) % 2], b.n, static_cast<uint32_t>(k), plain, s);
    if (k == snap_after)
      CUDA_CHECK(cudaMemcpyAsync(b.snap, b.buf[(k + 1) % 2], bytes, cudaMemcpyDeviceToDevice, s));
  }
  return b.buf[steps % 2];
}

// Restores the process-wide switch after a test changes it.
struct PdlSwitchGuard {
  bool was = ms::cuda::pdl_enabled();
  ~PdlSwitchGuard() { ms::cuda::set_pdl_enabled(was); }
};

class PdlChain : public ::testing::TestWithParam<bool> {};  // PDL on (true) or off

TEST_P(PdlChain, EagerChainMatchesHost) {
  MS_REQUIRE_GPU();
  PdlSwitchGuard guard;
  ms::cuda::set_pdl_enabled(GetParam());
  // 300 blocks: more than one wave on any part, so a dependent's blocks meet the predecessor's still running.
  const int n = 300 * kThreads, steps = 400;
  Buffers b(n);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const uint32_t* out = enqueue_chain(b, steps, 0, 199, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<uint32_t> snap;
  const auto want = host_chain(initial(n), steps, 199, &snap);
  EXPECT_EQ(b.get(out), want);
  EXPECT_EQ(b.get(b.snap), snap);
  CUDA_CHECK(cudaStreamDestroy(s));
}

TEST_P(PdlChain, CapturedGraphMatchesHostAndKeepsProgrammaticEdges) {
  MS_REQUIRE_GPU();
  PdlSwitchGuard guard;
  ms::cuda::set_pdl_enabled(GetParam());
  const int n = 64 * kThreads, steps = 300, plain_every = 37, snap_after = 150;
  Buffers b(n);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const uint32_t* out = enqueue_chain(b, steps, plain_every, snap_after, s);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));

  // Steps through the launcher whose predecessor is a kernel (not the initial copy, not the snapshot copy).
  size_t pdl_steps = 0, pdl_after_kernel = 0;
  for (int k = 0; k < steps; ++k) {
    if (k % plain_every == plain_every - 1) continue;
    ++pdl_steps;
    if (k > 0 && k - 1 != snap_after) ++pdl_after_kernel;
  }
  const auto [edges, prog] = ms::cuda::graph_edge_count(g);
  EXPECT_GE(edges, static_cast<size_t>(steps));
  if (ms::cuda::pdl_active()) {
    EXPECT_GE(prog, pdl_after_kernel);
    EXPECT_LE(prog, pdl_steps);
  } else {
    EXPECT_EQ(prog, 0u);
  }

  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  std::vector<uint32_t> snap;
  const auto want = host_chain(initial(n), steps, snap_after, &snap);
  for (int replay = 0; replay < 3; ++replay) {
    b.poison();
    CUDA_CHECK(cudaGraphLaunch(exec, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(b.get(out), want) << "replay " << replay;
    EXPECT_EQ(b.get(b.snap), snap) << "replay " << replay;
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(g));
  CUDA_CHECK(cudaStreamDestroy(s));
}

INSTANTIATE_TEST_SUITE_P(Pdl, PdlChain, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "on" : "off"; });

TEST(Pdl, ArgsArrayLauncherChains) {
  MS_REQUIRE_GPU();
  const int n = 40 * kThreads, steps = 200;
  Buffers b(n);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMemcpyAsync(b.buf[0], b.init, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, s));
  for (int k = 0; k < steps; ++k) {
    ChainParams p{b.buf[k % 2], b.buf[(k + 1) % 2], n, static_cast<uint32_t>(k)};
    void* args[] = {&p};
    ms::cuda::launch_kernel_args("chain_step", reinterpret_cast<const void*>(chain_step_kernel),
                                 dim3((n + kThreads - 1) / kThreads), dim3(kThreads), args, 0, s);
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(b.get(b.buf[steps % 2]), host_chain(initial(n), steps, -1, nullptr));
  CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(Pdl, ActiveOnlyFromSm90) {
  MS_REQUIRE_GPU();
  PdlSwitchGuard guard;
  ms::cuda::set_pdl_enabled(true);
  const int arch = ms::cuda::current_device_arch();
  int major = 0, minor = 0, dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  EXPECT_EQ(arch, major * 10 + minor);
  EXPECT_EQ(ms::cuda::pdl_active(), arch >= 90 && ms::cuda::pdl_enabled());
  ms::cuda::set_pdl_enabled(false);
  EXPECT_FALSE(ms::cuda::pdl_active());
}

}  // namespace
