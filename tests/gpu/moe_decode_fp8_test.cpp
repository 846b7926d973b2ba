// The register-streamed FP8-block decode path of the routed experts (moe_experts_decode_fp8.h) against
// ops::moe_experts on the CPU, with experts made by the project's quantizer (quant/fp8_block.h): scaled-down
// and odd shapes (every expert distinct), DeepSeek-V3 widths (hidden 7168, inter 2048, 256 experts, top-8)
// and GLM-5 widths (6144 / 2048), m in {1, 3, 8, 32, 64, 100, 128}, uniform / skewed / one-hot / empty-slot
// routing. The act workspace is poisoned with NaN first; out starts from random values (the kernel adds into
// it), so an element it skips keeps a value far off the reference. Untouched experts point at NaN-filled
// weights and scales: one read would make the output NaN. Every case runs twice and must give the same bits.
//
// Weights: every 128x128 block is scaled by its own power of two (1/8 .. 8) before quantizing, so the block
// scales differ by up to 64x and a scale taken from the wrong block shows. The full-width sets hold 16
// distinct experts of each width and let expert e use the weights of e % 16 (host time and memory of 256
// distinct DeepSeek experts: 11 GB); the scaled-down sets, with every expert distinct, are the ones that
// show a wrong expert.
//
// Tolerance: both sides use the same dequantised weights (e4m3 x block scale); the GPU rounds x and act to
// f16 once (2^-11 relative each) and sums in another order with the block scale applied per 128-k partial
// sum. Per element |gpu - cpu| <= 1e-2 * rms(contribution) + 1e-2 * |contribution|, relative RMS error <=
// 2e-3 (f16 rounding alone is ~5e-4).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_decode_fp8.h"
#include "kernels/cuda/moe/moe_plan.h"
#include "moe_test_util.h"
#include "ops/moe_experts.h"
#include "quant/fp8_block.h"
#include "random_weights.h"

namespace {

using ms::test::Dev;
using ms::test::route;
using ms::test::Routing;

bool have_gpu() {
  return ms::cuda::device_count() > 0;
}

// E experts over P distinct quantized ones (expert e uses pool entry e % P), on the host and the device.
// Device copies: one allocation per pool matrix (16-byte aligned starts) and one NaN-filled data / scale pair
// per matrix kind that poisoned experts point at.
struct Fp8Experts {
  int E, P, H, I;
  std::vector<ms::quant::Fp8BlockWeight> q;  // [P][gate, up, down]
  std::vector<ms::ops::ExpertWeights> cpu;   // [E]
  std::vector<void*> bufs;
  std::vector<const void*> dev;  // [P][gate, up, down][data, scale]
  const void* nan_data = nullptr;
  const void* nan_scale = nullptr;

  Fp8Experts(int e, int h, int i, uint32_t seed, int distinct = 0)
      : E(e), P(distinct > 0 ? distinct : e), H(h), I(i) {
    static constexpr float kBlockFactor[7] = {0.125f, 0.25f, 0.5f, 1.f, 2.f, 4.f, 8.f};
    // Pool matrix k (entry k / 3; gate, up, down) drawn by its own engines, on all cores (random_weights.h).
    auto make = [&](int rows, int cols, int k) {
      std::vector<float> w(static_cast<size_t>(rows) * cols);
      const float a = std::sqrt(3.0f / static_cast<float>(cols));  // unit variance per output
      // Each 128x128 block times its own power of two (2^-3 .. 2^3), varying along rows and columns.
      ms::test::draw_rows(w.data(), rows, cols, seed, static_cast<uint64_t>(k),
                          [&](std::mt19937& rng, int64_t r, float* row) {
                            std::uniform_real_distribution<float> u(-1.f, 1.f);
                            for (int c = 0; c < cols; ++c)
                              row[c] = a * u(rng) * kBlockFactor[(3 * (r / 128) + 5 * (c / 128)) % 7];
                          });
      return ms::quant::fp8_block_quantize(w.data(), rows, cols);
    };
    for (int x = 0; x < P; ++x) {
      q.push_back(make(I, H, 3 * x));
      q.push_back(make(I, H, 3 * x + 1));
      q.push_back(make(H, I, 3 * x + 2));
    }
    auto lw = [](ms::quant::Fp8BlockWeight& m) {
      ms::ops::LinearWeight l;
      l.format = ms::ops::WeightFormat::FP8Block;
      l.out = m.rows;
      l.in = m.cols;
      l.block = 128;
      l.weight = ms::Tensor::borrow(m.data.data(), {m.rows, m.cols}, ms::DType::F8_E4M3);
      l.scale =
          ms::Tensor::borrow(m.scale_inv.data(), {(m.rows + 127) / 128, m.scale_cols()}, ms::DType::F32);
      return l;
    };
    for (int x = 0; x < E; ++x) {
      ms::ops::ExpertWeights w;
      const int s = x % P;
      w.gate = lw(q[3 * s]);
      w.up = lw(q[3 * s + 1]);
      w.down = lw(q[3 * s + 2]);
      cpu.push_back(std::move(w));
    }
    for (const auto& m : q) {
      for (int part = 0; part < 2; ++part) {
        const void* h = part == 0 ? static_cast<const void*>(m.data.data()) : m.scale_inv.data();
        const size_t bytes = part == 0 ? m.data.size() : m.scale_inv.size() * sizeof(float);
        void* d = nullptr;
        CUDA_CHECK(cudaMalloc(&d, bytes));
        CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
        bufs.push_back(d);
        dev.push_back(d);
      }
    }
    // 0xff: e4m3 NaN, f32 NaN; as large as the largest matrix (all three hold H * I values).
    const size_t nd = static_cast<size_t>(H) * I, ns = static_cast<size_t>(H / 128 + 1) * (I / 128 + 1) * 4;
    for (size_t bytes : {nd, ns}) {
      void* d = nullptr;
      CUDA_CHECK(cudaMalloc(&d, bytes));
      CUDA_CHECK(cudaMemset(d, 0xff, bytes));
      bufs.push_back(d);
      (bytes == nd ? nan_data : nan_scale) = d;
    }
  }
  ~Fp8Experts() {
    for (void* b : bufs) cudaFree(b);
  }
  Fp8Experts(const Fp8Experts&) = delete;
  Fp8Experts& operator=(const Fp8Experts&) = delete;

  std::vector<ms::cuda::MoeExpertWeights> table(const std::vector<uint8_t>& poisoned) const {
    std::vector<ms::cuda::MoeExpertWeights> t(E);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int e = 0; e < E; ++e) {
      if (poisoned[e]) {
        t[e] = {nan_data, nan_scale, nan_data, nan_scale, nan_data, nan_scale, nan, nan, nan, 0.f};
      } else {
        const void* const* d = dev.data() + 6 * (e % P);
        t[e] = {d[0], d[1], d[2], d[3], d[4], d[5], 1.f, 1.f, 1.f, 0.f};
      }
    }
    return t;
  }
};

ms::cuda::MoeExpertsParams base_params(int m, int K, int E, int H, int I) {
  ms::cuda::MoeExpertsParams p;
  p.ldx = H;
  p.ldo = H;
  p.format = ms::cuda::MoeWeightFormat::FP8Block;
  p.fp8_block = 128;
  p.m = m;
  p.top_k = K;
  p.n_experts = E;
  p.hidden = H;
  p.inter = I;
  p.experts_aligned16 = true;
  return p;
}

// Plan + experts on the device through moe_experts(), checked on the host to take the FP8 decode path.
std::vector<float> run_gpu(const Fp8Experts& xs, const std::vector<uint8_t>& poisoned,
                           const std::vector<float>& x, const std::vector<int32_t>& ids,
                           const std::vector<float>& wts, const std::vector<float>& out0, int m, int K) {
  const int E = xs.E, H = xs.H, I = xs.I;
  Dev<ms::cuda::MoeExpertWeights> d_table(xs.table(poisoned));
  Dev<float> d_x(x), d_w(wts), d_out(out0);
  Dev<int32_t> d_ids(ids), d_counts(E), d_offsets(E + 1), d_sorted(ids.size());
  Dev<float> d_act(ms::cuda::moe_experts_act_bytes(m, K, I) / sizeof(float));
  Dev<float> d_slot(ms::cuda::moe_experts_slot_out_bytes(m, K, H) / sizeof(float));
  CUDA_CHECK(cudaMemset(d_act.p, 0xff, d_act.n * sizeof(float)));
  CUDA_CHECK(cudaMemset(d_slot.p, 0xff, d_slot.n * sizeof(float)));
  CUDA_CHECK(cudaMemset(d_sorted.p, 0x7f, d_sorted.n * sizeof(int32_t)));
  ms::cuda::moe_plan({d_ids.p, d_counts.p, d_offsets.p, d_sorted.p, m, K, E}, nullptr);
  ms::cuda::MoeExpertsParams p = base_params(m, K, E, H, I);
  p.x = d_x.p;
  p.topk_ids = d_ids.p;
  p.topk_weights = d_w.p;
  p.expert_counts = d_counts.p;
  p.expert_offsets = d_offsets.p;
  p.sorted_slots = d_sorted.p;
  p.experts = d_table.p;
  p.act = d_act.p;
  p.slot_out = d_slot.p;
  p.out = d_out.p;
  EXPECT_TRUE(ms::cuda::moe_experts_decode_fp8_applies(p));
  ms::cuda::moe_experts(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return d_out.get();
}

void run_case(const Fp8Experts& xs, int m, int K, Routing routing, uint32_t seed, bool poison_untouched) {
  SCOPED_TRACE("routing " + std::to_string(static_cast<int>(routing)) + " E=" + std::to_string(xs.E) +
               " H=" + std::to_string(xs.H) + " I=" + std::to_string(xs.I) + " m=" + std::to_string(m) +
               " K=" + std::to_string(K) + (poison_untouched ? " poisoned" : ""));
  const int H = xs.H;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> uw(0.05f, 1.0f);
  const auto ids = route(m, K, xs.E, routing, rng);
  std::vector<float> wts(ids.size()), x(static_cast<size_t>(m) * H), out0(x.size());
  for (auto& v : wts) v = uw(rng);
  for (auto& v : x) v = nd(rng);
  for (auto& v : out0) v = nd(rng);
  std::vector<uint8_t> touched(xs.E, 0), poisoned(xs.E, 0);
  for (int32_t e : ids)
    if (e >= 0 && e < xs.E) touched[e] = 1;
  for (int e = 0; e < xs.E; ++e) poisoned[e] = poison_untouched && !touched[e];

  std::vector<float> ref = out0;
  {
    const auto scratch = ms::ops::MoeScratch::make(ms::ops::cpu_alloc(), m, K, xs.E, H, xs.I);
    std::vector<int32_t> ids_c = ids;
    std::vector<float> w_c = wts;
    ms::ops::moe_experts(ms::ops::Ctx::cpu(), ms::Tensor::borrow(x.data(), {m, H}, ms::DType::F32),
                         ms::Tensor::borrow(ids_c.data(), {m, K}, ms::DType::I32),
                         ms::Tensor::borrow(w_c.data(), {m, K}, ms::DType::F32), xs.cpu,
                         ms::Tensor::borrow(ref.data(), {m, H}, ms::DType::F32), scratch);
  }
  const auto got = run_gpu(xs, poisoned, x, ids, wts, out0, m, K);
  double ss = 0, se = 0;
  for (size_t i = 0; i < ref.size(); ++i) ss += (ref[i] - out0[i]) * (ref[i] - out0[i]);
  const double rms = std::sqrt(ss / ref.size());
  if (rms == 0.0) {  // no slot routed (empty-slot routing at m = 1): out must come back untouched
    EXPECT_EQ(got, out0);
    return;
  }
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    se += d * d;
    const double tol = 1e-2 * rms + 1e-2 * std::fabs(ref[i] - out0[i]);
    if (!std::isfinite(got[i]) || std::fabs(d) > tol) {
      if (bad++ < 5)
        ADD_FAILURE() << "token " << i / H << " col " << i % H << " (down block " << (i % H) / 16 << "): gpu "
                      << got[i] << " cpu " << ref[i] << " (out before " << out0[i] << ", rms contribution "
                      << rms << ")";
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LE(std::sqrt(se / ref.size()), 2e-3 * rms) << "relative RMS error";
  // A token without any expert keeps its row bit for bit.
  if (routing == Routing::EmptySlots) {
    EXPECT_EQ(0, std::memcmp(got.data(), out0.data(), static_cast<size_t>(H) * sizeof(float)));
  }
  // Deterministic: the same bits again.
  EXPECT_EQ(run_gpu(xs, poisoned, x, ids, wts, out0, m, K), got);
}

constexpr Routing kAll[] = {Routing::Uniform, Routing::Skewed, Routing::OneHot, Routing::EmptySlots};

TEST(CudaMoeDecodeFp8, ScaledDownMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Fp8Experts xs(32, 1024, 512, 600);  // hidden 1024: one 128-k step per warp
  for (int m : {1, 3, 8, 32, 64, 100, 128})
    for (Routing r : kAll) run_case(xs, m, 8, r, 601u + m + 100u * static_cast<uint32_t>(r), false);
}

TEST(CudaMoeDecodeFp8, OddShapesMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // hidden 384: three 128-k blocks over eight warps (five add nothing); inter 1408: 11 down pieces per chunk,
  // not a multiple of the pieces in flight; 88 gate_up tiles, tile rows crossing no 128-row block.
  const Fp8Experts odd(16, 384, 1408, 610);
  for (int m : {1, 5, 17, 64, 100}) run_case(odd, m, 6, Routing::Uniform, 611u + m, false);
  run_case(odd, 9, 6, Routing::OneHot, 612, false);
  // hidden 7168: seven steps per warp, not a multiple of the steps in flight; inter 256.
  const Fp8Experts deep(12, 7168, 256, 613);
  for (int m : {1, 3, 8, 33}) run_case(deep, m, 4, Routing::Skewed, 614u + m, false);
}

TEST(CudaMoeDecodeFp8, DeepSeekV3WidthsMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Fp8Experts xs(256, 7168, 2048, 620, 16);
  for (int m : {1, 3, 8, 32, 64, 100, 128}) {
    run_case(xs, m, 8, Routing::Uniform, 621u + m, false);
    run_case(xs, m, 8, Routing::Skewed, 622u + m, false);
  }
  run_case(xs, 64, 8, Routing::OneHot, 623, false);
  run_case(xs, 128, 8, Routing::OneHot, 627, false);
  run_case(xs, 8, 8, Routing::EmptySlots, 624, false);
  // Untouched experts NaN: at 1 and 8 tokens most of the 256 are.
  run_case(xs, 1, 8, Routing::Uniform, 625, true);
  run_case(xs, 8, 8, Routing::Skewed, 626, true);
}

TEST(CudaMoeDecodeFp8, Glm5WidthsMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Fp8Experts xs(256, 6144, 2048, 630, 16);
  for (int m : {1, 3, 8, 32, 64, 100, 128}) {
    run_case(xs, m, 8, Routing::Uniform, 631u + m, false);
    run_case(xs, m, 8, Routing::Skewed, 632u + m, false);
  }
  run_case(xs, 32, 8, Routing::OneHot, 633, false);
  run_case(xs, 3, 8, Routing::EmptySlots, 634, true);
}

TEST(CudaMoeDecodeFp8, UntouchedExpertsAreNotRead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Every expert no token uses holds NaN bytes and NaN scales: one read would make the output NaN.
  const Fp8Experts xs(64, 2048, 1024, 640);
  for (int m : {1, 8, 32, 64}) {
    run_case(xs, m, 4, Routing::Uniform, 641u + m, true);
    run_case(xs, m, 4, Routing::Skewed, 642u + m, true);
  }
  run_case(xs, 16, 4, Routing::OneHot, 643, true);
  run_case(xs, 16, 4, Routing::EmptySlots, 644, true);
}

TEST(CudaMoeDecodeFp8, TakenOnlyWhereItApplies) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";  // the check reads the device's limits
  alignas(16) static float buf[16];
  ms::cuda::MoeExpertsParams p = base_params(8, 8, 256, 7168, 2048);
  p.x = p.act = p.out = p.slot_out = buf;
  const bool fits =
      ms::cuda::moe_decode_fp8_config::choose(ms::cuda::moe_decode_fp8_shape(p),
                                              ms::cuda::limits_of(ms::cuda::current_device_caps()))
          .use;
  EXPECT_TRUE(fits);  // every target part fits DeepSeek-V3 decode (kernel_fit_test)
  EXPECT_EQ(ms::cuda::moe_experts_decode_fp8_applies(p), fits);
  p.disable_decode = true;  // exact mode
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.disable_decode = false;
  p.disable_stream = true;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.disable_stream = false;
  p.m = 128;  // the largest step of top-8: 1024 slots (every target part fits it: kernel_fit_test)
  EXPECT_TRUE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.m = 129;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.m = 8;
  p.fp8_block = 64;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.fp8_block = 128;
  p.inter = 2048 + 64;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.inter = 2048;
  p.format = ms::cuda::MoeWeightFormat::NVFP4;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.format = ms::cuda::MoeWeightFormat::FP8Block;
  p.experts_aligned16 = false;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.experts_aligned16 = true;
  p.x = buf + 1;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_fp8_applies(p));
  p.x = buf;
  EXPECT_TRUE(ms::cuda::moe_experts_decode_fp8_applies(p));
}

}  // namespace
