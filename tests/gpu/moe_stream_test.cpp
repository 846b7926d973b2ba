// The streamed NVFP4 decode path of the routed experts (moe_experts_stream.h) against ops::moe_experts on the
// CPU: GLM-5-like shapes scaled down and the full GLM-5 width (hidden 6144, inter 2048, 256 experts, top-8)
// at 1, 8, 32 and 256 tokens, uniform and skewed routing. Outputs and the act workspace are poisoned with NaN
// first. Untouched experts point at NaN-filled weights: any read of them would show in the output.
//
// Weights are drawn in the stored NVFP4 format (random_weights.h: every E2M1 code, block scales spread over
// 15x), not quantized from floats: both sides read the same codes and scales, and the full-width set (256
// experts, 5.4 GB) is made once per process, on all cores, for the three tests that run on it.
//
// Tolerance: both sides use the same dequantised NVFP4 weights; the GPU multiplies bf16 weights (exact) by
// activations split into bf16 hi + lo (~2^-16 relative) with f32 accumulation, in another order. Per element
// |gpu - cpu| <= 2e-3 * rms(contribution) + 2e-3 * |contribution|, and the relative RMS error <= 5e-4.
//
// The register-streamed decode path (moe_experts_decode.h, CudaMoeDecode tests) rounds x and act to f16 once
// (2^-11 relative each; the tolerances were set for the bf16 rounding of an earlier version, 2^-9, and are
// kept): per element <= 2.5e-2 * rms + 2.5e-2 * |contribution|, relative RMS error <= 8e-3.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_decode.h"
#include "kernels/cuda/moe/moe_experts_stream.h"
#include "kernels/cuda/moe/moe_plan.h"
#include "moe_test_util.h"
#include "ops/moe_experts.h"
#include "quant/nvfp4.h"
#include "random_weights.h"

namespace {

using ms::test::Dev;
using ms::test::route;
using ms::test::Routing;

bool have_gpu() {
  return ms::cuda::device_count() > 0;
}

struct DeviceExperts;

// One NVFP4 expert set, stored contiguously per matrix kind so a device copy is three allocations. Experts in
// `poisoned` get NaN-filled bytes on the device (0xff: code -6 with scale NaN) instead of their weights.
struct Nvfp4Experts {
  int E, H, I;
  std::vector<ms::quant::Nvfp4Weight> q;  // [E][gate, up, down]
  std::vector<ms::ops::ExpertWeights> cpu;

  Nvfp4Experts(int e, int h, int i, uint32_t seed) : E(e), H(h), I(i) {
    // Matrix k (expert k / 3; gate, up, down) drawn in the stored format by its own engine
    // (random_weights.h), the matrices on all cores; weights of standard deviation 1 / sqrt(cols), as N(0, 1
    // / cols) would give.
    q.resize(3 * static_cast<size_t>(E));
    ms::test::parallel_for(3 * static_cast<int64_t>(E), [&](int64_t k) {
      const int rows = k % 3 == 2 ? H : I, cols = k % 3 == 2 ? I : H;
      q[static_cast<size_t>(k)] =
          ms::test::random_nvfp4(rows, cols, 1.0f / std::sqrt(static_cast<float>(cols)), seed, k);
    });
    for (int x = 0; x < E; ++x) {
      ms::ops::ExpertWeights w;
      auto lw = [&](ms::quant::Nvfp4Weight& m, int rows, int cols) {
        ms::ops::LinearWeight l;
        l.format = ms::ops::WeightFormat::NVFP4;
        l.out = rows;
        l.in = cols;
        l.scale2 = m.scale2;
        l.weight = ms::Tensor::borrow(m.packed.data(), {rows, cols / 2}, ms::DType::U8);
        l.scale = ms::Tensor::borrow(m.scales.data(), {rows, cols / 16}, ms::DType::F8_E4M3);
        return l;
      };
      w.gate = lw(q[3 * x], I, H);
      w.up = lw(q[3 * x + 1], I, H);
      w.down = lw(q[3 * x + 2], H, I);
      cpu.push_back(std::move(w));
    }
  }
  Nvfp4Experts(const Nvfp4Experts&) = delete;
  Nvfp4Experts& operator=(const Nvfp4Experts&) = delete;
  ~Nvfp4Experts();

  // The device copy with no expert poisoned, made on first use and kept while the set lives (a full-width
  // set is 5.4 GB: one upload for all its cases).
  const DeviceExperts& device() const;

 private:
  mutable std::unique_ptr<DeviceExperts> device_;
};

struct DeviceExperts {
  std::vector<uint8_t*> bufs;
  std::vector<ms::cuda::MoeExpertWeights> table;
  DeviceExperts(const Nvfp4Experts& xs, const std::vector<uint8_t>& poisoned) {
    table.resize(xs.E);
    for (int e = 0; e < xs.E; ++e) {
      const void* ptr[6];
      float s2[3];
      for (int k = 0; k < 3; ++k) {
        const auto& m = xs.q[3 * e + k];
        for (int part = 0; part < 2; ++part) {
          const auto& h = part == 0 ? m.packed : m.scales;
          uint8_t* d = nullptr;
          CUDA_CHECK(cudaMalloc(&d, h.size()));
          if (poisoned[e])
            CUDA_CHECK(cudaMemset(d, 0xff, h.size()));
          else
            CUDA_CHECK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
          bufs.push_back(d);
          ptr[2 * k + part] = d;
        }
        s2[k] = poisoned[e] ? std::numeric_limits<float>::quiet_NaN() : m.scale2;
      }
      table[e] = {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], ptr[5], s2[0], s2[1], s2[2], 0.f};
    }
  }
  ~DeviceExperts() {
    for (auto* b : bufs) cudaFree(b);
  }
  DeviceExperts(const DeviceExperts&) = delete;
  DeviceExperts& operator=(const DeviceExperts&) = delete;
};

Nvfp4Experts::~Nvfp4Experts() = default;

const DeviceExperts& Nvfp4Experts::device() const {
  if (!device_) device_ = std::make_unique<DeviceExperts>(*this, std::vector<uint8_t>(E, 0));
  return *device_;
}

// The full GLM-5 width set (256 experts, hidden 6144, inter 2048), made once per process for every test
// that runs on it.
const Nvfp4Experts& glm5_full_width() {
  static const Nvfp4Experts xs(256, 6144, 2048, 410);
  return xs;
}

enum class Path { Old, Stream, Decode };

// Runs plan + experts on the device through `path` (checked on the host to be the one moe_experts() takes);
// decode_variant picks the register kernels' variant explicitly (base unless a test asks for another,
// whatever the environment says).
std::vector<float> run_gpu(const Nvfp4Experts& xs, const DeviceExperts& dx, const std::vector<float>& x,
                           const std::vector<int32_t>& ids, const std::vector<float>& wts,
                           const std::vector<float>& out0, int m, int K, Path path, int decode_ring = 0,
                           std::vector<uint16_t>* act_out = nullptr,
                           int decode_variant = ms::cuda::kMoeDecodeBase) {
  const int E = xs.E, H = xs.H, I = xs.I;
  Dev<ms::cuda::MoeExpertWeights> d_table(dx.table);
  Dev<float> d_x(x), d_w(wts), d_out(out0);
  Dev<int32_t> d_ids(ids), d_counts(E), d_offsets(E + 1), d_sorted(ids.size());
  Dev<float> d_act(ms::cuda::moe_experts_act_bytes(m, K, I) / sizeof(float));
  Dev<float> d_slot(ms::cuda::moe_experts_slot_out_bytes(m, K, H) / sizeof(float));
  CUDA_CHECK(cudaMemset(d_act.p, 0xff, d_act.n * sizeof(float)));
  CUDA_CHECK(cudaMemset(d_slot.p, 0xff, d_slot.n * sizeof(float)));
  CUDA_CHECK(cudaMemset(d_sorted.p, 0x7f, d_sorted.n * sizeof(int32_t)));
  ms::cuda::moe_plan({d_ids.p, d_counts.p, d_offsets.p, d_sorted.p, m, K, E}, nullptr);
  ms::cuda::MoeExpertsParams p;
  p.x = d_x.p;
  p.ldx = H;
  p.topk_ids = d_ids.p;
  p.topk_weights = d_w.p;
  p.expert_counts = d_counts.p;
  p.expert_offsets = d_offsets.p;
  p.sorted_slots = d_sorted.p;
  p.experts = d_table.p;
  p.format = ms::cuda::MoeWeightFormat::NVFP4;
  p.act = d_act.p;
  p.slot_out = d_slot.p;
  p.out = d_out.p;
  p.ldo = H;
  p.m = m;
  p.top_k = K;
  p.n_experts = E;
  p.hidden = H;
  p.inter = I;
  p.experts_aligned16 = true;
  p.disable_stream = path == Path::Old;
  p.disable_decode = path != Path::Decode;
  p.decode_ring = decode_ring;
  p.decode_variant = decode_variant;
  EXPECT_EQ(ms::cuda::moe_decode_variant(p), decode_variant);
  EXPECT_EQ(ms::cuda::moe_experts_decode_applies(p), path == Path::Decode);
  // The ring variant is asked for only where the test expects it to fit (else the comparison would be void).
  EXPECT_EQ(ms::cuda::moe_experts_decode_uses_ring(p), path == Path::Decode && decode_ring == 1);
  if (path == Path::Stream) {
    EXPECT_TRUE(ms::cuda::moe_experts_stream_applies(p));
  }
  ms::cuda::moe_experts(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  if (act_out) {  // the decode path's f16 act [m * top_k grouped positions, inter], first half of p.act
    act_out->resize(static_cast<size_t>(m) * K * I);
    CUDA_CHECK(
        cudaMemcpy(act_out->data(), d_act.p, act_out->size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  }
  return d_out.get();
}

// decode_ring (Path::Decode): 1 runs the cp.async ring variant, checks it against the CPU reference and
// requires the base register kernels' output bit for bit (same decode, k order and summation order).
// variant (Path::Decode, register kernels): the MoeDecodeVariant to run, checked against the CPU reference;
// the sc8 variants (same math, only the scale loads differ) must also match the same variant without sc8 bit
// for bit (sc8: base, acc2sc8: acc2, halfsc8: half); acc2 and half (other f32 summation orders) only the
// reference's tolerances.
void run_case(const Nvfp4Experts& xs, int m, int K, bool skewed, uint32_t seed, bool poison_untouched,
              Path path = Path::Stream, Routing routing = Routing::Uniform, int decode_ring = 0,
              int variant = ms::cuda::kMoeDecodeBase) {
  if (skewed && routing == Routing::Uniform) routing = Routing::Skewed;
  SCOPED_TRACE(std::string(path == Path::Decode ? (decode_ring == 1 ? "decode ring" : "decode") : "stream") +
               (path == Path::Decode && decode_ring != 1
                    ? std::string(" variant ") + ms::cuda::moe_decode_variant_name(variant)
                    : std::string()) +
               " routing " + std::to_string(static_cast<int>(routing)) + " E=" + std::to_string(xs.E) +
               " H=" + std::to_string(xs.H) + " I=" + std::to_string(xs.I) + " m=" + std::to_string(m) +
               " K=" + std::to_string(K) + (skewed ? " skewed" : " uniform"));
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
  std::unique_ptr<DeviceExperts> own;
  if (poison_untouched) own = std::make_unique<DeviceExperts>(xs, poisoned);
  const DeviceExperts& dx = poison_untouched ? *own : xs.device();

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
  std::vector<uint16_t> act_ring, act_regs;
  const auto got = run_gpu(xs, dx, x, ids, wts, out0, m, K, path, decode_ring, &act_ring, variant);
  const bool sc8 = (variant & ms::cuda::kMoeDecodeSc8) != 0;
  const int ref_variant = decode_ring == 1 ? ms::cuda::kMoeDecodeBase : variant & ~ms::cuda::kMoeDecodeSc8;
  const std::string what = decode_ring == 1 ? "ring" : ms::cuda::moe_decode_variant_name(variant);
  const std::string regs_name = ms::cuda::moe_decode_variant_name(ref_variant);
  if (path == Path::Decode && (decode_ring == 1 || sc8)) {
    // act_ring: this run's act (ring or variant); act_regs, regs: the register kernels' of ref_variant.
    const auto regs = run_gpu(xs, dx, x, ids, wts, out0, m, K, path, 0, &act_regs, ref_variant);
    // gate_up first: act rows are grouped positions (expert-sorted slots), columns intermediate indices.
    int act_differ = 0;
    for (size_t i = 0; i < act_ring.size(); ++i) {
      if (act_ring[i] == act_regs[i]) continue;
      if (act_differ++ < 5)
        ADD_FAILURE() << "gate_up: " << what << " != " << regs_name << " at act index " << i << ": position "
                      << i / xs.I << " intermediate " << i % xs.I << " (tile " << (i % xs.I) / 16
                      << "): " << what << " f16 0x" << std::hex << act_ring[i] << " " << regs_name << " 0x"
                      << act_regs[i] << std::dec;
    }
    EXPECT_EQ(act_differ, 0) << "act values differing between the " << what << " and " << regs_name
                             << " gate_up kernels";
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &regs[i], sizeof(float)) == 0) continue;
      if (differ++ < 5) {
        // Row r of a 16-row down tile; the token's experts say which gate_up items fed it.
        const size_t tok = i / H, col = i % H;
        std::string experts;
        for (int k = 0; k < K; ++k) experts += " " + std::to_string(ids[tok * K + k]);
        ADD_FAILURE() << what << " != " << regs_name << " at index " << i << ": token " << tok << " col "
                      << col << " (down block " << col / 16 << " row " << col % 16 << ", experts" << experts
                      << "): " << what << " " << got[i] << " " << regs_name << " " << regs[i] << " cpu "
                      << ref[i];
      }
    }
    EXPECT_EQ(differ, 0) << "outputs differing between the " << what << " and " << regs_name
                         << " register kernels";
  }
  const double tol_rel = path == Path::Decode ? 2.5e-2 : 2e-3, rms_rel = path == Path::Decode ? 8e-3 : 5e-4;
  double ss = 0, se = 0;
  for (size_t i = 0; i < ref.size(); ++i) ss += (ref[i] - out0[i]) * (ref[i] - out0[i]);
  const double rms = std::sqrt(ss / ref.size());
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    se += d * d;
    const double tol = tol_rel * rms + tol_rel * std::fabs(ref[i] - out0[i]);
    if (!std::isfinite(got[i]) || std::fabs(d) > tol) {
      if (bad++ < 5)
        ADD_FAILURE() << "token " << i / H << " col " << i % H << ": gpu " << got[i] << " cpu " << ref[i]
                      << " (out before " << out0[i] << ", rms contribution " << rms << ")";
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LE(std::sqrt(se / ref.size()), rms_rel * rms) << "relative RMS error";
  // Deterministic: the same bits again.
  EXPECT_EQ(run_gpu(xs, dx, x, ids, wts, out0, m, K, path, decode_ring, nullptr, variant), got);
}

TEST(CudaMoeStream, ScaledDownGlm5MatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts xs(32, 1024, 512, 300);
  for (int m : {1, 3, 8, 32, 100, 256}) {
    run_case(xs, m, 8, false, 301u + m, false);
    run_case(xs, m, 8, true, 302u + m, false);
  }
  const Nvfp4Experts wide(16, 512, 4096, 303);  // inter above one down stage (2048): two stages per expert
  run_case(wide, 5, 4, true, 304, false);
  run_case(wide, 64, 4, false, 305, false);
}

TEST(CudaMoeStream, FullWidthGlm5MatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts& xs = glm5_full_width();
  for (int m : {1, 8, 32, 256}) {
    run_case(xs, m, 8, false, 311u + m, false);
    run_case(xs, m, 8, true, 312u + m, false);
  }
}

TEST(CudaMoeStream, UntouchedExpertsAreNotRead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Every expert no token uses holds NaN bytes and NaN global scales: one read would make the output NaN.
  const Nvfp4Experts xs(64, 1024, 512, 320);
  for (int m : {1, 8, 32}) {
    run_case(xs, m, 4, false, 321u + m, true);
    run_case(xs, m, 4, true, 322u + m, true);
  }
}

TEST(CudaMoeStream, EqualsOldKernelsWithinTolerance) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts xs(32, 1024, 512, 330);
  const int m = 16, K = 8, H = xs.H;
  std::mt19937 rng(331);
  std::normal_distribution<float> nd;
  const auto ids = route(m, K, xs.E, true, rng);
  std::vector<float> wts(ids.size(), 0.3f), x(static_cast<size_t>(m) * H), out0(x.size());
  for (auto& v : x) v = nd(rng);
  for (auto& v : out0) v = nd(rng);
  const DeviceExperts dx(xs, std::vector<uint8_t>(xs.E, 0));
  const auto a = run_gpu(xs, dx, x, ids, wts, out0, m, K, Path::Stream);
  const auto b = run_gpu(xs, dx, x, ids, wts, out0, m, K, Path::Old);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-3 * (1.0 + std::fabs(b[i]))) << i;
}

// A GLM-5 decode step (8 tokens, top 8 of 256 NVFP4 experts, weight pointers declared 16-byte aligned) for
// the *_applies checks, which read no data: x, act and out all point at buf.
ms::cuda::MoeExpertsParams glm5_step_params(float* buf) {
  ms::cuda::MoeExpertsParams p;
  p.x = p.act = p.out = p.slot_out = buf;
  p.ldx = p.ldo = 6144;
  p.format = ms::cuda::MoeWeightFormat::NVFP4;
  p.hidden = 6144;
  p.inter = 2048;
  p.m = 8;
  p.top_k = 8;
  p.n_experts = 256;
  p.experts_aligned16 = true;
  return p;
}

TEST(CudaMoeStream, NotTakenWhereItDoesNotApply) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";  // the check reads the device's limits
  alignas(16) static float buf[16];
  ms::cuda::MoeExpertsParams p = glm5_step_params(buf);
  EXPECT_EQ(ms::cuda::moe_experts_stream_applies(p),
            ms::cuda::limits_of(ms::cuda::current_device_caps()).smem_per_block_optin >=
                ms::cuda::moe_stream_config::gate_up_smem());
  p.experts_aligned16 = false;  // unchecked weight pointers
  EXPECT_FALSE(ms::cuda::moe_experts_stream_applies(p));
  p.experts_aligned16 = true;
  p.format = ms::cuda::MoeWeightFormat::BF16;
  EXPECT_FALSE(ms::cuda::moe_experts_stream_applies(p));
  p.format = ms::cuda::MoeWeightFormat::NVFP4;
  p.m = 257;  // prefill: the old (or tensor-core) kernels
  EXPECT_FALSE(ms::cuda::moe_experts_stream_applies(p));
  p.m = 8;
  p.hidden = 6144 + 16;
  EXPECT_FALSE(ms::cuda::moe_experts_stream_applies(p));
  p.hidden = 6144;
  p.x = buf + 1;  // x not 16-byte aligned
  EXPECT_FALSE(ms::cuda::moe_experts_stream_applies(p));
}

// ---- the register-streamed decode path (moe_experts_decode.h) ------------------------------------------

TEST(CudaMoeDecode, ScaledDownGlm5MatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts xs(32, 1024, 512, 400);   // hidden 1024: one 32-k step per lane
  for (int m : {1, 3, 8, 32, 64, 100, 128}) {  // 128 x top-8: the largest work list (1024 slots)
    run_case(xs, m, 8, false, 401u + m, false, Path::Decode);
    run_case(xs, m, 8, true, 402u + m, false, Path::Decode);
    run_case(xs, m, 8, false, 403u + m, false, Path::Decode, Routing::OneHot);
    run_case(xs, m, 8, false, 404u + m, false, Path::Decode, Routing::EmptySlots);
  }
  const Nvfp4Experts odd(16, 7168, 1024, 405);  // hidden 7168: 7 steps, a partial unroll group
  run_case(odd, 5, 4, true, 406, false, Path::Decode);
  run_case(odd, 17, 6, false, 407, false, Path::Decode, Routing::OneHot);
}

TEST(CudaMoeDecode, FullWidthGlm5MatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts& xs = glm5_full_width();
  for (int m : {1, 3, 8, 32, 64, 100, 128}) {
    run_case(xs, m, 8, false, 411u + m, false, Path::Decode);
    run_case(xs, m, 8, true, 412u + m, false, Path::Decode);
  }
  run_case(xs, 64, 8, false, 413, false, Path::Decode, Routing::OneHot);
  run_case(xs, 128, 8, false, 415, false, Path::Decode, Routing::OneHot);
  run_case(xs, 8, 8, false, 414, false, Path::Decode, Routing::EmptySlots);
}

TEST(CudaMoeDecode, UntouchedExpertsAreNotRead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts xs(64, 2048, 1024, 420);
  for (int m : {1, 8, 32, 64, 100}) {
    run_case(xs, m, 4, false, 421u + m, true, Path::Decode);
    run_case(xs, m, 4, true, 422u + m, true, Path::Decode);
  }
  run_case(xs, 16, 4, false, 423, true, Path::Decode, Routing::OneHot);
}

TEST(CudaMoeDecode, TakenOnlyWhereItApplies) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";  // the check reads the device's limits
  alignas(16) static float buf[16];
  ms::cuda::MoeExpertsParams p = glm5_step_params(buf);
  const bool fits = ms::cuda::moe_decode_config::choose(ms::cuda::moe_decode_shape(p),
                                                        ms::cuda::limits_of(ms::cuda::current_device_caps()))
                        .use;
  EXPECT_EQ(ms::cuda::moe_experts_decode_applies(p), fits);
  p.disable_decode = true;  // exact mode
  EXPECT_FALSE(ms::cuda::moe_experts_decode_applies(p));
  p.disable_decode = false;
  p.disable_stream = true;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_applies(p));
  p.disable_stream = false;
  p.m = 128;  // the largest step of top-8: 1024 slots
  EXPECT_EQ(ms::cuda::moe_experts_decode_applies(p),
            ms::cuda::moe_decode_config::choose(ms::cuda::moe_decode_shape(p),
                                                ms::cuda::limits_of(ms::cuda::current_device_caps()))
                .use);
  EXPECT_TRUE(ms::cuda::moe_experts_decode_applies(p) || !fits);  // what fits 8 tokens fits 128 (kernel_fit)
  p.m = 129;  // beyond the per-warp output tiles: the streamed path
  EXPECT_FALSE(ms::cuda::moe_experts_decode_applies(p));
  p.m = 8;
  p.experts_aligned16 = false;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_applies(p));
  p.experts_aligned16 = true;
  p.x = buf + 1;
  EXPECT_FALSE(ms::cuda::moe_experts_decode_applies(p));
}

}  // namespace

// ---- the cp.async ring variant of the decode path (decode_ring = 1) ---------------------------------------
// Every case also runs the register variant and requires the same bits (run_case): a mismatch prints the
// first indices with their token, column (down block and row) and the token's experts.

TEST(CudaMoeDecodeRing, ScaledDownGlm5MatchesRegistersBitForBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts xs(32, 1024, 512, 400);  // one step per item: the ring runs ahead across items
  for (int m : {1, 3, 8, 32, 64, 100, 128}) {
    run_case(xs, m, 8, false, 501u + m, false, Path::Decode, Routing::Uniform, 1);
    run_case(xs, m, 8, true, 502u + m, false, Path::Decode, Routing::Skewed, 1);
    run_case(xs, m, 8, false, 503u + m, false, Path::Decode, Routing::OneHot, 1);
    run_case(xs, m, 8, false, 504u + m, false, Path::Decode, Routing::EmptySlots, 1);
  }
  const Nvfp4Experts odd(16, 7168, 1024, 405);  // hidden 7168: 7 steps, not a multiple of the depth
  run_case(odd, 5, 4, true, 506, false, Path::Decode, Routing::Skewed, 1);
  run_case(odd, 17, 6, false, 507, false, Path::Decode, Routing::OneHot, 1);
}

TEST(CudaMoeDecodeRing, FullWidthGlm5MatchesRegistersBitForBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts& xs = glm5_full_width();
  for (int m : {1, 3, 8, 32, 64, 100, 128}) {
    run_case(xs, m, 8, false, 511u + m, false, Path::Decode, Routing::Uniform, 1);
    run_case(xs, m, 8, true, 512u + m, false, Path::Decode, Routing::Skewed, 1);
  }
  run_case(xs, 64, 8, false, 513, false, Path::Decode, Routing::OneHot, 1);
  run_case(xs, 128, 8, false, 515, false, Path::Decode, Routing::OneHot, 1);
  run_case(xs, 8, 8, false, 514, false, Path::Decode, Routing::EmptySlots, 1);
}

TEST(CudaMoeDecodeRing, UntouchedExpertsAreNotRead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts xs(64, 2048, 1024, 420);
  for (int m : {1, 4}) {
    run_case(xs, m, 4, false, 521u + m, true, Path::Decode, Routing::Uniform, 1);
    run_case(xs, m, 4, true, 522u + m, true, Path::Decode, Routing::Skewed, 1);
  }
  run_case(xs, 16, 4, false, 523, true, Path::Decode, Routing::OneHot, 1);
}

// ---- the register kernels' variants (MoeDecodeVariant) ------------------------------------------------
// Each against the CPU reference with the decode tolerances; sc8 also against base, acc2sc8 against acc2 and
// halfsc8 against half bit for bit (run_case). hidden 1024 .. 3072 give 1 .. 3 gate_up steps a warp (fewer
// than sc8's 4 a scale load; half: 2 .. 6), 7168 seven (a partial last block; half: 14, a second pass of
// halfsc8's 12-step loop), 6144 GLM-5's six (half: 12); down always has 4 a piece. The half variants' work
// items alternate between two groups inside runs of one work-list entry: one-hot routing (many chunks of one
// expert), skew and m up to 128 (several entries a block) exercise the restaging between entries.

constexpr int kVariantsBeyondBase[] = {ms::cuda::kMoeDecodeAcc2,    ms::cuda::kMoeDecodeSc8,
                                       ms::cuda::kMoeDecodeAcc2Sc8, ms::cuda::kMoeDecodeHalf,
                                       ms::cuda::kMoeDecodeHalfSc8, ms::cuda::kMoeDecodeWhole,
                                       ms::cuda::kMoeDecodeTile};
constexpr int kHalfVariants[] = {ms::cuda::kMoeDecodeHalf, ms::cuda::kMoeDecodeHalfSc8};

TEST(CudaMoeDecodeVariant, ScaledDownShapesMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts h1(32, 1024, 512, 600), h2(16, 2048, 1024, 601), h3(16, 3072, 512, 602);
  const Nvfp4Experts odd(16, 7168, 1024, 603);
  for (int v : kVariantsBeyondBase) {
    for (int m : {1, 3, 8, 32, 100, 128}) {
      run_case(h1, m, 8, false, 611u + m, false, Path::Decode, Routing::Uniform, 0, v);
      run_case(h1, m, 8, true, 612u + m, false, Path::Decode, Routing::Skewed, 0, v);
    }
    run_case(h1, 16, 8, false, 613, false, Path::Decode, Routing::OneHot, 0, v);
    run_case(h1, 8, 8, false, 614, false, Path::Decode, Routing::EmptySlots, 0, v);
    run_case(h2, 5, 4, true, 615, false, Path::Decode, Routing::Skewed, 0, v);
    run_case(h3, 9, 4, false, 616, false, Path::Decode, Routing::Uniform, 0, v);
    run_case(odd, 1, 8, false, 617, false, Path::Decode, Routing::Uniform, 0, v);
    run_case(odd, 17, 6, false, 618, false, Path::Decode, Routing::OneHot, 0, v);
  }
}

TEST(CudaMoeDecodeVariant, FullWidthGlm5MatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts& xs = glm5_full_width();
  for (int v : kVariantsBeyondBase) {
    for (int m : {1, 8, 32, 128})
      run_case(xs, m, 8, false, 621u + m, false, Path::Decode, Routing::Uniform, 0, v);
    run_case(xs, 3, 8, true, 622, false, Path::Decode, Routing::Skewed, 0, v);
  }
}

// hidden a multiple of 512 but not of 1024: only the half variants take it (4 warps split an item's k);
// 512 gives one step a warp, 1536 three, 5632 eleven (halfsc8: a partial third scale block).
TEST(CudaMoeDecodeVariant, HalfTakesHiddenMultiplesOf512) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts h05(16, 512, 512, 640), h15(32, 1536, 512, 641), h55(16, 5632, 1024, 642);
  for (int v : kHalfVariants) {
    for (int m : {1, 5, 8, 64, 128}) {
      run_case(h15, m, 8, false, 651u + m, false, Path::Decode, Routing::Uniform, 0, v);
      run_case(h15, m, 8, true, 652u + m, false, Path::Decode, Routing::Skewed, 0, v);
    }
    run_case(h05, 3, 4, false, 653, false, Path::Decode, Routing::Uniform, 0, v);
    run_case(h05, 32, 4, false, 654, false, Path::Decode, Routing::OneHot, 0, v);
    run_case(h15, 8, 8, false, 655, false, Path::Decode, Routing::EmptySlots, 0, v);
    run_case(h55, 1, 8, false, 656, false, Path::Decode, Routing::Uniform, 0, v);
    run_case(h55, 24, 6, true, 657, false, Path::Decode, Routing::Skewed, 0, v);
  }
  // The other variants leave such a shape to the streamed path.
  const Nvfp4Experts& xs = h15;
  ms::cuda::MoeExpertsParams p;
  p.format = ms::cuda::MoeWeightFormat::NVFP4;
  p.hidden = xs.H;
  p.inter = xs.I;
  p.m = 4;
  p.top_k = 8;
  p.n_experts = xs.E;
  for (int v : ms::cuda::kMoeDecodeVariantList) {
    p.decode_variant = v;
    EXPECT_EQ(ms::cuda::moe_decode_config::choose_variant(
                  ms::cuda::moe_decode_shape(p), ms::cuda::limits_of(ms::cuda::current_device_caps()),
                  ms::cuda::moe_decode_split(v))
                  .use,
              (v & ms::cuda::kMoeDecodeHalf) != 0 || v == ms::cuda::kMoeDecodeWhole ||
                  v == ms::cuda::kMoeDecodeTile)
        << ms::cuda::moe_decode_variant_name(v);
  }
}

// whole (one warp an item, all of k): hidden any multiple of 128. 640 gives five 128-k steps (the register
// slots' loop of 3 with a partial second pass), 1536 twelve, 5632 forty-four; one-hot routing and m up to 128
// restage x between work-list entries inside a block's run.
// tile (one warp a 16-row tile, all of k) likewise: the tail of its 4-step register loop (5, 12 and 44
// steps), and its gate_up grid sized for the most entries a step can have, of which one-hot routing uses
// few (most blocks return at once) and uniform routing at m 64 and 128 nearly all.
TEST(CudaMoeDecodeVariant, WholeTakesHiddenMultiplesOf128) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts h06(16, 640, 512, 660), h15(32, 1536, 512, 661), h55(16, 5632, 1024, 662);
  for (int v : {ms::cuda::kMoeDecodeWhole, ms::cuda::kMoeDecodeTile}) {
    for (int m : {1, 5, 8, 64, 128}) {
      run_case(h06, m, 8, false, 671u + m, false, Path::Decode, Routing::Uniform, 0, v);
      run_case(h15, m, 8, true, 672u + m, false, Path::Decode, Routing::Skewed, 0, v);
    }
    run_case(h06, 32, 4, false, 673, false, Path::Decode, Routing::OneHot, 0, v);
    run_case(h15, 8, 8, false, 674, false, Path::Decode, Routing::EmptySlots, 0, v);
    run_case(h55, 1, 8, false, 675, false, Path::Decode, Routing::Uniform, 0, v);
    run_case(h55, 24, 6, true, 676, false, Path::Decode, Routing::Skewed, 0, v);
  }
}

TEST(CudaMoeDecodeVariant, UntouchedExpertsAreNotRead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Nvfp4Experts xs(64, 2048, 1024, 630);
  for (int v : kVariantsBeyondBase) {
    run_case(xs, 1, 4, false, 631, true, Path::Decode, Routing::Uniform, 0, v);
    run_case(xs, 4, 4, true, 632, true, Path::Decode, Routing::Skewed, 0, v);
  }
}

TEST(CudaMoeDecodeVariant, VariantFromEnvironment) {
  EXPECT_EQ(ms::cuda::moe_decode_variant_from_env(nullptr), -1);
  EXPECT_EQ(ms::cuda::moe_decode_variant_from_env(""), -1);
  for (int v : ms::cuda::kMoeDecodeVariantList)
    EXPECT_EQ(ms::cuda::moe_decode_variant_from_env(ms::cuda::moe_decode_variant_name(v)), v);
  EXPECT_EQ(ms::cuda::moe_decode_variant_from_env("half"), ms::cuda::kMoeDecodeHalf);
  EXPECT_EQ(ms::cuda::moe_decode_variant_from_env("halfsc8"), ms::cuda::kMoeDecodeHalfSc8);
  EXPECT_THROW(ms::cuda::moe_decode_variant_from_env("acc4"), ms::Error);
  EXPECT_THROW(ms::cuda::moe_decode_variant_from_env("acc2,sc8"), ms::Error);
  EXPECT_THROW(ms::cuda::moe_decode_variant_from_env("acc2half"), ms::Error);
  ms::cuda::MoeExpertsParams p;
  p.decode_variant = ms::cuda::kMoeDecodeAcc2Sc8;
  EXPECT_EQ(ms::cuda::moe_decode_variant(p), ms::cuda::kMoeDecodeAcc2Sc8);
  p.decode_variant = ms::cuda::kMoeDecodeHalfSc8;
  EXPECT_EQ(ms::cuda::moe_decode_variant(p), ms::cuda::kMoeDecodeHalfSc8);
  p.decode_variant = ms::cuda::kMoeDecodeWhole;
  EXPECT_EQ(ms::cuda::moe_decode_variant(p), ms::cuda::kMoeDecodeWhole);
  EXPECT_EQ(ms::cuda::moe_decode_variant_from_env("whole"), ms::cuda::kMoeDecodeWhole);
  p.decode_variant = ms::cuda::kMoeDecodeTile;
  EXPECT_EQ(ms::cuda::moe_decode_variant(p), ms::cuda::kMoeDecodeTile);
  EXPECT_EQ(ms::cuda::moe_decode_variant_from_env("tile"), ms::cuda::kMoeDecodeTile);
  // The default by token count (where the environment names none): tile up to 8 tokens, whole from 9.
  const char* env = std::getenv("MOESERVE_MOE_DECODE_VARIANT");
  if (env == nullptr || *env == '\0') {
    p.decode_variant = -1;
    for (int m : {1, 2, 8, 9, 32, 33, 64, 128}) {
      p.m = m;
      EXPECT_EQ(ms::cuda::moe_decode_variant(p),
                m <= 8 ? ms::cuda::kMoeDecodeTile : ms::cuda::kMoeDecodeWhole)
          << "m = " << m;
    }
  }
  // acc2 with half, whole or tile with another flag, and past the flags
  for (int bad : {5, 7, 9, 10, 12, 17, 18, 20, 24, 32}) {
    p.decode_variant = bad;
    EXPECT_THROW(ms::cuda::moe_decode_variant(p), ms::Error) << bad;
    EXPECT_THROW(ms::cuda::moe_decode_variant_name(bad), ms::Error) << bad;
  }
}

TEST(CudaMoeDecodeRing, KernelFromEnvironment) {
  EXPECT_EQ(ms::cuda::moe_decode_kernel_from_env(nullptr), -1);
  EXPECT_EQ(ms::cuda::moe_decode_kernel_from_env(""), -1);
  EXPECT_EQ(ms::cuda::moe_decode_kernel_from_env("registers"), 0);
  EXPECT_EQ(ms::cuda::moe_decode_kernel_from_env("ring"), 1);
  EXPECT_THROW(ms::cuda::moe_decode_kernel_from_env("tma"), ms::Error);
}

// The weights the NVFP4 tests run on (no device needed): every E2M1 code, normal e4m3 scales over the whole
// stated range, the asked standard deviation, and the same bytes on a second draw.
TEST(RandomNvfp4Weights, EveryCodeNormalScalesAskedSpread) {
  const int rows = 64, cols = 2048;
  const float sd = 1.0f / std::sqrt(static_cast<float>(cols));
  const auto q = ms::test::random_nvfp4(rows, cols, sd, 7, 3);
  ASSERT_EQ(q.packed.size(), static_cast<size_t>(rows) * cols / 2);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(rows) * cols / 16);
  std::vector<int> codes(16, 0);
  for (uint8_t b : q.packed) {
    ++codes[b & 15];
    ++codes[b >> 4];
  }
  for (int c = 0; c < 16; ++c) EXPECT_GT(codes[c], rows * cols / 32) << "code " << c;
  float smin = 1e30f, smax = 0.f;
  for (uint8_t s : q.scales) {
    EXPECT_GE(s >> 3, 1) << "e4m3 scale not normal: " << int{s};
    EXPECT_LT(s, 0x7f) << "e4m3 scale NaN or negative: " << int{s};
    smin = std::min(smin, ms::quant::fp8_e4m3_to_f32(s));
    smax = std::max(smax, ms::quant::fp8_e4m3_to_f32(s));
  }
  EXPECT_EQ(smin, 0.5f);
  EXPECT_EQ(smax, 7.5f);
  double ss = 0;
  std::vector<float> row(cols);
  for (int r = 0; r < rows; ++r) {
    ms::quant::nvfp4_dequantize_row(q.packed.data() + static_cast<size_t>(r) * cols / 2,
                                    q.scales.data() + static_cast<size_t>(r) * cols / 16, q.scale2, cols,
                                    row.data());
    for (float v : row) ss += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(std::sqrt(ss / (static_cast<double>(rows) * cols)) / sd, 1.0, 0.02);
  const auto again = ms::test::random_nvfp4(rows, cols, sd, 7, 3);
  EXPECT_EQ(again.packed, q.packed);
  EXPECT_EQ(again.scales, q.scales);
  EXPECT_NE(ms::test::random_nvfp4(rows, cols, sd, 7, 4).packed, q.packed);  // another stream
  // Row chunks on all cores: the same values on every draw.
  EXPECT_EQ(ms::test::normal_matrix(300, 77, 1.f, 9, 1), ms::test::normal_matrix(300, 77, 1.f, 9, 1));
}
