// The tensor-core grouped experts (moe_experts_mma, both of its GEMM kernels: mma.sync and, on sm_90, the
// warp-specialised wgmma one) against the CPU reference (ops::moe_experts on the CPU,
// f32 math on the dequantised weights), for NVFP4, FP8Block (e4m3 with an f32 scale per 128x128 block) and
// BF16 weights: small and full-width (GLM-5 hidden 6144, inter 2048; FP8Block also DeepSeek-V3's 7168 /
// 2048) shapes, uniform, skewed and ragged routing (expert row counts 0, 1, 2, 63 .. 65, 127 .. 129, 200,
// 256: empty, single-row and partial tiles of both tile heights), experts with no token (null weight
// pointers: a read would fault) and one expert with every token. Workspaces and slot outputs are poisoned
// with NaN first, so an element never written shows up.
//
// Tolerance: the kernels round activations, act and the NVFP4 / FP8Block weights (value x scale) to bf16
// (8-bit mantissa: relative error <= 2^-9 each, the same as the bf16 activations') and sum in f32 in
// another order, so the error is relative to the size of the experts' contribution c = ref - out0: the
// whole-output relative error ||got - ref|| / ||c|| must stay under 1e-2 (measured expectation ~3e-3), and
// no element may be off by more than 6e-2 * rms(c) + 1e-2 * |c_i|. A wrong fragment layout, row mapping,
// swizzle or block scale gives errors of order 1 (a scale of the wrong 128 block: of order the spread of
// the block scales, ~0.3 on these N(0, 1/cols) weights).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_mma.h"
#include "kernels/cuda/moe/moe_experts_wgmma.h"
#include "kernels/cuda/moe/moe_plan.h"
#include "ops/cuda_backend.h"
#include "ops/moe_experts.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"
#include "random_weights.h"

namespace {

using ms::cuda::MoeWeightFormat;

template <typename T>
class Buf {
 public:
  explicit Buf(size_t n) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  explicit Buf(const std::vector<T>& h) : Buf(h.size()) {
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  Buf(Buf&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf& operator=(Buf&&) = delete;
  ~Buf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  T* get() const { return p_; }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison(int byte) {
    if (n_ > 0) CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

bool have_gpu() {
  return ms::cuda::device_count() > 0 && ms::cuda::current_device_caps().arch() >= 80;
}

struct Stored {
  std::vector<uint8_t> data, scale;
  float scale2 = 1.0f;
};

const char* format_name(MoeWeightFormat f) {
  switch (f) {
    case MoeWeightFormat::NVFP4:
      return "nvfp4";
    case MoeWeightFormat::FP8Block:
      return "fp8";
    case MoeWeightFormat::BF16:
      return "bf16";
    default:
      return "f32";
  }
}

Stored store(const std::vector<float>& w, int rows, int cols, MoeWeightFormat f) {
  Stored s;
  if (f == MoeWeightFormat::BF16) {
    s.data.resize(w.size() * 2);
    ms::test::parallel_for(rows, [&](int64_t r) {
      for (size_t i = static_cast<size_t>(r) * cols; i < static_cast<size_t>(r + 1) * cols; ++i) {
        const uint16_t b = ms::quant::f32_to_bf16(w[i]);
        std::memcpy(s.data.data() + 2 * i, &b, 2);
      }
    });
  } else if (f == MoeWeightFormat::FP8Block) {
    // e4m3 [rows, cols], f32 scales [ceil(rows / 128), ceil(cols / 128)] (partial edge blocks where the
    // widths are not multiples of 128).
    auto q = ms::quant::fp8_block_quantize(w.data(), rows, cols);
    s.data = std::move(q.data);
    s.scale.resize(q.scale_inv.size() * 4);
    std::memcpy(s.scale.data(), q.scale_inv.data(), s.scale.size());
  } else {
    auto q = ms::quant::nvfp4_quantize(w.data(), rows, cols);
    s.data = std::move(q.packed);
    s.scale = std::move(q.scales);
    s.scale2 = q.scale2;
  }
  return s;
}

ms::ops::LinearWeight cpu_weight(const Stored& s, int rows, int cols, MoeWeightFormat f) {
  ms::ops::LinearWeight lw;
  lw.out = rows;
  lw.in = cols;
  lw.scale2 = s.scale2;
  lw.block = 128;
  void* data = const_cast<uint8_t*>(s.data.data());
  void* scale = const_cast<uint8_t*>(s.scale.data());
  if (f == MoeWeightFormat::BF16) {
    lw.format = ms::ops::WeightFormat::BF16;
    lw.weight = ms::Tensor::borrow(data, {rows, cols}, ms::DType::BF16);
  } else if (f == MoeWeightFormat::FP8Block) {
    lw.format = ms::ops::WeightFormat::FP8Block;
    lw.weight = ms::Tensor::borrow(data, {rows, cols}, ms::DType::F8_E4M3);
    lw.scale = ms::Tensor::borrow(scale, {(rows + 127) / 128, (cols + 127) / 128}, ms::DType::F32);
  } else {
    lw.format = ms::ops::WeightFormat::NVFP4;
    lw.weight = ms::Tensor::borrow(data, {rows, cols / 2}, ms::DType::U8);
    lw.scale = ms::Tensor::borrow(scale, {rows, cols / 16}, ms::DType::F8_E4M3);
  }
  return lw;
}

// E experts of one format on the host (CPU reference) and the device. Weights N(0, 1/cols), so every
// projection keeps the activations' scale.
class Experts {
 public:
  Experts(int E, int hidden, int inter, MoeWeightFormat f, uint32_t seed)
      : E_(E), hidden_(hidden), inter_(inter), format_(f) {
    // Matrix k (expert k / 3; gate, up, down) drawn by its own engines, on all cores (random_weights.h).
    auto matrix = [&](int rows, int cols, int k) {
      return ms::test::normal_matrix(rows, cols, 1.0f / std::sqrt(static_cast<float>(cols)), seed,
                                     static_cast<uint64_t>(k));
    };
    stored_.reserve(static_cast<size_t>(E) * 3);
    for (int e = 0; e < E; ++e) {
      stored_.push_back(store(matrix(inter, hidden, 3 * e), inter, hidden, f));
      stored_.push_back(store(matrix(inter, hidden, 3 * e + 1), inter, hidden, f));
      stored_.push_back(store(matrix(hidden, inter, 3 * e + 2), hidden, inter, f));
    }
    for (int e = 0; e < E; ++e) {
      ms::ops::ExpertWeights ew;
      ew.gate = cpu_weight(stored_[3 * e], inter, hidden, f);
      ew.up = cpu_weight(stored_[3 * e + 1], inter, hidden, f);
      ew.down = cpu_weight(stored_[3 * e + 2], hidden, inter, f);
      cpu_.push_back(std::move(ew));
    }
    for (const Stored& s : stored_) {
      dev_.emplace_back(s.data);
      dev_.emplace_back(s.scale);
    }
  }
  // Experts not in `touched` get null pointers and NaN scales.
  std::vector<ms::cuda::MoeExpertWeights> table(const std::vector<uint8_t>& touched) const {
    std::vector<ms::cuda::MoeExpertWeights> t(E_);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int e = 0; e < E_; ++e) {
      if (!touched[e]) {
        t[e] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nan, nan, nan, 0.f};
        continue;
      }
      auto d = [&](int i) -> const void* { return dev_[static_cast<size_t>(6 * e + i)].get(); };
      t[e] = {d(0),
              d(1),
              d(2),
              d(3),
              d(4),
              d(5),
              stored_[3 * e].scale2,
              stored_[3 * e + 1].scale2,
              stored_[3 * e + 2].scale2,
              0.f};
    }
    return t;
  }
  const std::vector<ms::ops::ExpertWeights>& cpu() const { return cpu_; }
  // The same experts as the executor holds them: LinearWeights over the device copies.
  std::vector<ms::ops::ExpertWeights> device() const {
    std::vector<ms::ops::ExpertWeights> out = cpu_;
    auto to_dev = [&](ms::ops::LinearWeight& lw, size_t i) {
      lw.weight = ms::Tensor::borrow(dev_[2 * i].get(), lw.weight.shape(), lw.weight.dtype(), nullptr,
                                     ms::Device::CUDA);
      if (lw.scale.defined() && lw.scale.numel() > 0)
        lw.scale = ms::Tensor::borrow(dev_[2 * i + 1].get(), lw.scale.shape(), lw.scale.dtype(), nullptr,
                                      ms::Device::CUDA);
    };
    for (int e = 0; e < E_; ++e) {
      to_dev(out[e].gate, 3 * static_cast<size_t>(e));
      to_dev(out[e].up, 3 * static_cast<size_t>(e) + 1);
      to_dev(out[e].down, 3 * static_cast<size_t>(e) + 2);
    }
    return out;
  }
  int E() const { return E_; }
  int hidden() const { return hidden_; }
  int inter() const { return inter_; }
  MoeWeightFormat format() const { return format_; }

 private:
  int E_, hidden_, inter_;
  MoeWeightFormat format_;
  std::vector<Stored> stored_;
  std::vector<ms::ops::ExpertWeights> cpu_;
  std::vector<Buf<uint8_t>> dev_;
};

enum class Routing { Uniform, Skewed, OneHot, Ragged };

// Ragged: expert e gets exactly kRaggedRows[e % 16] rows (empty, single-row, and one short of / exactly /
// one past the 64- and 128-row tiles), dealt round-robin over the tokens so no token holds an expert twice;
// slots left over are empty (-1). Counts above m are clipped to m; K * m must cover their sum.
constexpr int kRaggedRows[16] = {0, 1, 129, 0, 1, 64, 65, 128, 127, 1, 0, 256, 2, 63, 1, 200};

std::vector<int32_t> ragged_ids(int m, int K, int E) {
  std::vector<int32_t> ids(static_cast<size_t>(m) * K, -1);
  std::vector<int> used(m, 0);
  int cursor = 0;
  for (int e = 0; e < E; ++e) {
    const int rows = std::min(kRaggedRows[e % 16], m);
    for (int i = 0; i < rows; ++i, cursor = (cursor + 1) % m) {
      if (used[cursor] >= K) {
        ADD_FAILURE() << "ragged routing: " << m << " tokens x " << K << " slots are too few";
        return ids;
      }
      ids[static_cast<size_t>(cursor) * K + used[cursor]++] = e;
    }
  }
  return ids;
}

// K distinct experts per token. Skewed: expert e drawn with weight 1 / (e + 1)^2 (many experts get 0 tokens)
// and 5% empty slots. OneHot: expert 1 in every token's first slot, the rest uniform over experts >= E / 2
// (experts 0 and 2 .. E/2 - 1 get nothing). Ragged: ragged_ids.
std::vector<int32_t> make_ids(int m, int K, int E, Routing r, std::mt19937& rng) {
  if (r == Routing::Ragged) return ragged_ids(m, K, E);
  std::vector<int32_t> ids(static_cast<size_t>(m) * K);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int t = 0; t < m; ++t) {
    std::vector<double> w(E, 1.0);
    if (r == Routing::Skewed)
      for (int e = 0; e < E; ++e) w[e] = 1.0 / ((e + 1.0) * (e + 1.0));
    if (r == Routing::OneHot)
      for (int e = 0; e < E / 2; ++e) w[e] = 0.0;
    for (int k = 0; k < K; ++k) {
      int e;
      if (r == Routing::OneHot && k == 0) {
        e = 1;
      } else {
        std::discrete_distribution<int> d(w.begin(), w.end());
        e = d(rng);
      }
      w[e] = 0.0;
      ids[static_cast<size_t>(t) * K + k] = (r == Routing::Skewed && u(rng) < 0.05) ? -1 : e;
    }
  }
  return ids;
}

using ms::cuda::MoePrefillKernel;

// load (wgmma only): 0 cp.async, 1 tensor copies through per-expert maps built from the same table.
std::vector<float> run_mma(const Experts& xs, const std::vector<float>& x, const std::vector<int32_t>& ids,
                           const std::vector<float>& wts, const std::vector<float>& out0, int m, int K,
                           MoePrefillKernel kernel, int load, int expand) {
  const int E = xs.E(), H = xs.hidden(), I = xs.inter();
  std::vector<uint8_t> touched(E, 0);
  for (int32_t e : ids)
    if (e >= 0) touched[e] = 1;
  const auto table = xs.table(touched);
  Buf<ms::cuda::MoeExpertWeights> d_table(table);
  void* maps = nullptr;
  // FP8Block has no tensor-copy loads: asked for anyway (wgmma_load 1, no maps), it falls back to cp.async.
  const bool tma = load == 1 && xs.format() != MoeWeightFormat::FP8Block;
  if (tma) maps = ms::cuda::moe_experts_wgmma_maps(table.data(), E, xs.format(), H, I);
  Buf<float> d_x(x), d_w(wts), d_out(out0);
  Buf<int32_t> d_ids(ids), d_counts(E), d_offsets(E + 1), d_sorted(ids.size());
  Buf<uint8_t> d_ws(ms::cuda::moe_experts_mma_workspace_bytes(m, K, H, I));
  Buf<float> d_slot(ms::cuda::moe_experts_slot_out_bytes(m, K, H) / sizeof(float));
  d_ws.poison(0xff);  // bf16 0xffff is NaN
  d_slot.poison(0xff);
  ms::cuda::moe_plan({d_ids.get(), d_counts.get(), d_offsets.get(), d_sorted.get(), m, K, E}, nullptr);
  ms::cuda::MoeExpertsParams p;
  p.x = d_x.get();
  p.ldx = H;
  p.topk_ids = d_ids.get();
  p.topk_weights = d_w.get();
  p.expert_counts = d_counts.get();
  p.expert_offsets = d_offsets.get();
  p.sorted_slots = d_sorted.get();
  p.experts = d_table.get();
  p.format = xs.format();
  p.slot_out = d_slot.get();
  p.out = d_out.get();
  p.ldo = H;
  p.m = m;
  p.top_k = K;
  p.n_experts = E;
  p.hidden = H;
  p.inter = I;
  p.prefill_kernel = kernel;
  p.wgmma_maps = maps;
  p.wgmma_load = load;
  p.wgmma_expand = expand;
  EXPECT_TRUE(ms::cuda::moe_experts_mma_supported(p));
  EXPECT_EQ(ms::cuda::moe_experts_prefill_kernel(p), kernel);
  if (kernel == MoePrefillKernel::Wgmma) {
    EXPECT_EQ(ms::cuda::moe_experts_wgmma_groups_rows(p), tma);
    // The Registers layout is taken wherever asked for and possible (NVFP4, tensor copies, 256-row tiles).
    if (expand == static_cast<int>(ms::cuda::MoeWgExpand::Registers) && tma &&
        xs.format() == MoeWeightFormat::NVFP4 && I % 128 == 0 && H % 256 == 0) {
      const auto cfg = ms::cuda::moe_experts_wgmma_config(p);
      EXPECT_EQ(cfg.gate_up.expand, ms::cuda::MoeWgExpand::Registers);
      EXPECT_EQ(cfg.down.expand, ms::cuda::MoeWgExpand::Registers);
    }
  }
  ms::cuda::moe_experts_mma(p, d_ws.get(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  if (maps != nullptr) CUDA_CHECK(cudaFree(maps));
  // Every valid slot row was written (no NaN left from the poison).
  const auto slot = d_slot.download();
  int unwritten = 0;
  for (size_t s = 0; s < ids.size() && unwritten < 3; ++s) {
    if (ids[s] < 0) continue;
    for (int c = 0; c < H; ++c) {
      if (!std::isfinite(slot[s * H + c])) {
        ADD_FAILURE() << "slot " << s << " col " << c << " not written";
        ++unwritten;
        break;
      }
    }
  }
  return d_out.download();
}

void run_case(const Experts& xs, int m, int K, Routing r, uint32_t seed,
              MoePrefillKernel kernel = MoePrefillKernel::Mma, int load = 0, int expand = -1) {
  const int H = xs.hidden();
  const char* kname = kernel != MoePrefillKernel::Wgmma ? "mma"
                      : load != 1                       ? "wgmma"
                      : expand == 2                     ? "wgmma-tma-rs"
                                                        : "wgmma-tma";
  SCOPED_TRACE(std::string(kname) + " " + std::string(format_name(xs.format())) + " E=" +
               std::to_string(xs.E()) + " H=" + std::to_string(H) + " I=" + std::to_string(xs.inter()) +
               " m=" + std::to_string(m) + " K=" + std::to_string(K) + " routing=" + std::to_string(int(r)));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> uw(0.05f, 1.0f);
  auto ids = make_ids(m, K, xs.E(), r, rng);
  std::vector<float> wts(ids.size()), x(static_cast<size_t>(m) * H), out0(x.size());
  for (auto& v : wts) v = uw(rng);
  for (auto& v : x) v = nd(rng);
  for (auto& v : out0) v = nd(rng);

  std::vector<float> ref = out0;
  {
    const ms::ops::Ctx ctx = ms::ops::Ctx::cpu();
    const auto scratch = ms::ops::MoeScratch::make(ms::ops::cpu_alloc(), m, K, xs.E(), H, xs.inter());
    std::vector<float> xc = x;
    std::vector<int32_t> idc = ids;
    std::vector<float> wc = wts;
    ms::ops::moe_experts(ctx, ms::Tensor::borrow(xc.data(), {m, H}, ms::DType::F32),
                         ms::Tensor::borrow(idc.data(), {m, K}, ms::DType::I32),
                         ms::Tensor::borrow(wc.data(), {m, K}, ms::DType::F32), xs.cpu(),
                         ms::Tensor::borrow(ref.data(), {m, H}, ms::DType::F32), scratch);
  }
  const auto got = run_mma(xs, x, ids, wts, out0, m, K, kernel, load, expand);

  double c2 = 0, e2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double c = ref[i] - out0[i];
    c2 += c * c;
    const double d = static_cast<double>(got[i]) - ref[i];
    e2 += std::isfinite(d) ? d * d : 1e30;
  }
  const double rms = std::sqrt(c2 / std::max<size_t>(ref.size(), 1));
  const double rel = std::sqrt(e2 / std::max(c2, 1e-30));
  EXPECT_LT(rel, 1e-2) << "relative error of the experts' contribution";
  int bad = 0;
  for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
    const double tol = 6e-2 * rms + 1e-2 * std::fabs(ref[i] - out0[i]);
    if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > tol) {
      ADD_FAILURE() << "token " << i / H << " col " << i % H << ": gpu " << got[i] << " cpu " << ref[i]
                    << " (out before " << out0[i] << ", rms contribution " << rms << ")";
      ++bad;
    }
  }
  // Deterministic: the same bits again.
  if (m <= 300) {
    EXPECT_EQ(run_mma(xs, x, ids, wts, out0, m, K, kernel, load, expand), got);
  }
  std::printf("  [moe_%s] %s E=%d H=%d I=%d m=%d K=%d routing=%d: relative error %.2e\n", kname,
              format_name(xs.format()), xs.E(), H, xs.inter(), m, K, static_cast<int>(r), rel);
}

class CudaMoeMma : public ::testing::TestWithParam<MoeWeightFormat> {};

TEST_P(CudaMoeMma, SmallShapesMatchCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device of sm_80 or newer";
  // hidden 384 = 3 N tiles of the down GEMM, inter 192 = 3 act tiles of gate_up, 6 and 3 k steps (fewer than
  // the pipeline's stages on down).
  const Experts xs(16, 384, 192, GetParam(), 1);
  int seed = 10;
  for (int m : {1, 40, 300, 1000}) {
    for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::OneHot}) run_case(xs, m, 4, r, seed++);
  }
  run_case(xs, 300, 4, Routing::Ragged, seed++);
  const Experts one(1, 128, 64, GetParam(), 2);  // one expert, one tile column, k = 64 (a single stage)
  run_case(one, 200, 1, Routing::Uniform, seed++);
}

TEST_P(CudaMoeMma, FullWidthMatchesCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device of sm_80 or newer";
  // GLM-5's expert widths; 8 experts, top-4; 150 tokens: ~75 rows an expert (bm 64, partial tiles).
  const Experts xs(8, 6144, 2048, GetParam(), 3);
  run_case(xs, 150, 4, Routing::Uniform, 30);
  run_case(xs, 64, 4, Routing::OneHot, 31);
  run_case(xs, 150, 4, Routing::Ragged, 32);
  if (GetParam() == MoeWeightFormat::FP8Block) {
    // DeepSeek-V3's expert widths (56 x 16 scale blocks for gate / up, 16 x 56 for down).
    const Experts ds(8, 7168, 2048, GetParam(), 5);
    run_case(ds, 150, 4, Routing::Uniform, 33);
    run_case(ds, 150, 4, Routing::Ragged, 34);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaMoeMma,
                         ::testing::Values(MoeWeightFormat::NVFP4, MoeWeightFormat::BF16,
                                           MoeWeightFormat::FP8Block),
                         [](const ::testing::TestParamInfo<MoeWeightFormat>& i) {
                           return std::string(format_name(i.param));
                         });

// The warpgroup-MMA kernel (sm_90 only) on the same shapes and routings, plus a width where both
// projections take 256-row weight tiles (hidden 512, inter 256) with few k steps, and the one-expert case
// whose k steps (2 and 1) are fewer than the ring's copies in flight (the producer's drain path).
class CudaMoeWgmma : public ::testing::TestWithParam<MoeWeightFormat> {};

bool have_sm90() {
  return ms::cuda::device_count() > 0 && ms::cuda::current_device_caps().arch() == 90;
}

TEST_P(CudaMoeWgmma, SmallShapesMatchCpuReference) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  // bn 128 for both projections (inter 192 is not a multiple of 128, hidden 384 not of 256).
  const Experts xs(16, 384, 192, GetParam(), 1);
  int seed = 10;
  for (int m : {1, 40, 300, 1000}) {
    for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::OneHot})
      run_case(xs, m, 4, r, seed++, MoePrefillKernel::Wgmma);
  }
  const Experts one(1, 128, 64, GetParam(), 2);
  run_case(one, 200, 1, Routing::Uniform, seed++, MoePrefillKernel::Wgmma);
  run_case(xs, 300, 4, Routing::Ragged, seed++, MoePrefillKernel::Wgmma);
  // bn 256 for both; 1000 x 4 / 16 = 250 rows an expert: full and partial 128-row tiles, both consumers.
  // FP8Block: the down tile's 256 rows span two 128-row scale blocks, gate_up's two matrices.
  const Experts wide(16, 512, 256, GetParam(), 4);
  for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::OneHot, Routing::Ragged})
    run_case(wide, 1000, 4, r, seed++, MoePrefillKernel::Wgmma);
  run_case(wide, 40, 4, Routing::Uniform, seed++, MoePrefillKernel::Wgmma);
}

TEST_P(CudaMoeWgmma, FullWidthMatchesCpuReference) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  const Experts xs(8, 6144, 2048, GetParam(), 3);
  run_case(xs, 150, 4, Routing::Uniform, 30, MoePrefillKernel::Wgmma);
  run_case(xs, 64, 4, Routing::OneHot, 31, MoePrefillKernel::Wgmma);
  run_case(xs, 300, 4, Routing::Skewed, 32, MoePrefillKernel::Wgmma);
  run_case(xs, 300, 4, Routing::Ragged, 33, MoePrefillKernel::Wgmma);
  if (GetParam() == MoeWeightFormat::FP8Block) {
    const Experts ds(8, 7168, 2048, GetParam(), 5);  // DeepSeek-V3's expert widths
    run_case(ds, 300, 4, Routing::Uniform, 34, MoePrefillKernel::Wgmma);
    run_case(ds, 300, 4, Routing::Ragged, 35, MoePrefillKernel::Wgmma);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaMoeWgmma,
                         ::testing::Values(MoeWeightFormat::NVFP4, MoeWeightFormat::BF16,
                                           MoeWeightFormat::FP8Block),
                         [](const ::testing::TestParamInfo<MoeWeightFormat>& i) {
                           return std::string(format_name(i.param));
                         });

// The tensor-copy loads (MoeWgLoad::Tma: grouped activation rows, per-expert tensor maps, one issuing thread,
// NVFP4 codes and scales expanded by the consumers into the bf16 W tile: the consumer layout, pinned). Shapes
// whose NVFP4 scale rows are multiples of 16 bytes (hidden, inter multiples of 256). Ragged counts: 1 and 3
// tokens over 64 experts (experts of 0 and 1 rows), 40 tokens (partial tiles, a consumer warpgroup with no
// rows), 1000 (full and partial 128-row tiles), one expert whose k steps (512 / 64 = 8, 256 / 64 = 4) are
// fewer than or equal to the ring's stages.
class CudaMoeWgmmaTma : public ::testing::TestWithParam<MoeWeightFormat> {};

// The consumer layout pinned (NVFP4 takes the Registers layout by default where it can).
constexpr int kConsumer = static_cast<int>(ms::cuda::MoeWgExpand::Consumer);

TEST_P(CudaMoeWgmmaTma, SmallShapesMatchCpuReference) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  int seed = 50;
  const Experts many(64, 512, 256, GetParam(), 5);
  for (int m : {1, 3}) run_case(many, m, 4, Routing::Uniform, seed++, MoePrefillKernel::Wgmma, 1, kConsumer);
  run_case(many, 40, 4, Routing::Skewed, seed++, MoePrefillKernel::Wgmma, 1, kConsumer);
  const Experts wide(16, 512, 256, GetParam(), 4);
  for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::OneHot})
    run_case(wide, 1000, 4, r, seed++, MoePrefillKernel::Wgmma, 1, kConsumer);
  run_case(wide, 40, 4, Routing::Uniform, seed++, MoePrefillKernel::Wgmma, 1, kConsumer);
  // bn 128 for gate_up (inter 320 is a multiple of 64, not of 128): gate_up tiles of 64 gate + 64 up rows.
  if (GetParam() == MoeWeightFormat::BF16) {
    const Experts narrow(16, 256, 320, GetParam(), 6);
    run_case(narrow, 300, 4, Routing::Uniform, seed++, MoePrefillKernel::Wgmma, 1, kConsumer);
  }
  const Experts one(1, 512, 256, GetParam(), 7);
  run_case(one, 200, 1, Routing::Uniform, seed++, MoePrefillKernel::Wgmma, 1, kConsumer);
}

TEST_P(CudaMoeWgmmaTma, FullWidthMatchesCpuReference) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  const Experts xs(8, 6144, 2048, GetParam(), 3);
  run_case(xs, 150, 4, Routing::Uniform, 60, MoePrefillKernel::Wgmma, 1, kConsumer);
  run_case(xs, 64, 4, Routing::OneHot, 61, MoePrefillKernel::Wgmma, 1, kConsumer);
  run_case(xs, 300, 4, Routing::Skewed, 62, MoePrefillKernel::Wgmma, 1, kConsumer);
}

// FP8Block: the same cases asked for with tensor copies run on the cp.async loads (the fallback).
INSTANTIATE_TEST_SUITE_P(Formats, CudaMoeWgmmaTma,
                         ::testing::Values(MoeWeightFormat::NVFP4, MoeWeightFormat::BF16,
                                           MoeWeightFormat::FP8Block),
                         [](const ::testing::TestParamInfo<MoeWeightFormat>& i) {
                           return std::string(format_name(i.param));
                         });

// The Registers layout (the transposed product, NVFP4 codes expanded into the wgmma A fragments, activations
// permuted inside 64-column blocks, items taken from a counter): the tensor-copy cases above, asked for it.
// An item of r rows (at most 256) runs the N = 64 ceil(r / 64) MMAs: 1 and 3 tokens over 64 experts, 40
// (skewed), 1000 over 16 experts (about 250 rows an expert; skewed and one-hot: experts of several items),
// one expert of 200 rows. BF16 and FP8Block cannot take it: asked for anyway, they run their own layouts.
class CudaMoeWgmmaRegisters : public ::testing::TestWithParam<MoeWeightFormat> {};

TEST_P(CudaMoeWgmmaRegisters, SmallShapesMatchCpuReference) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  const int rs = static_cast<int>(ms::cuda::MoeWgExpand::Registers);
  int seed = 80;
  const Experts many(64, 512, 256, GetParam(), 5);
  for (int m : {1, 3}) run_case(many, m, 4, Routing::Uniform, seed++, MoePrefillKernel::Wgmma, 1, rs);
  run_case(many, 40, 4, Routing::Skewed, seed++, MoePrefillKernel::Wgmma, 1, rs);
  const Experts wide(16, 512, 256, GetParam(), 4);
  for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::OneHot})
    run_case(wide, 1000, 4, r, seed++, MoePrefillKernel::Wgmma, 1, rs);
  const Experts one(1, 512, 256, GetParam(), 7);
  run_case(one, 200, 1, Routing::Uniform, seed++, MoePrefillKernel::Wgmma, 1, rs);
}

TEST_P(CudaMoeWgmmaRegisters, FullWidthMatchesCpuReference) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  const int rs = static_cast<int>(ms::cuda::MoeWgExpand::Registers);
  const Experts xs(8, 6144, 2048, GetParam(), 3);
  run_case(xs, 150, 4, Routing::Uniform, 90, MoePrefillKernel::Wgmma, 1, rs);
  run_case(xs, 300, 4, Routing::Skewed, 91, MoePrefillKernel::Wgmma, 1, rs);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaMoeWgmmaRegisters,
                         ::testing::Values(MoeWeightFormat::NVFP4, MoeWeightFormat::BF16,
                                           MoeWeightFormat::FP8Block),
                         [](const ::testing::TestParamInfo<MoeWeightFormat>& i) {
                           return std::string(format_name(i.param));
                         });

TEST(CudaMoeWgmmaTma, MapsRefuseShapesAndNeedMaps) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  ms::cuda::MoeExpertWeights w{};
  // NVFP4 scale rows of 384 / 16 = 24 bytes cannot be a tensor map's rows.
  EXPECT_THROW(ms::cuda::moe_experts_wgmma_maps(&w, 1, MoeWeightFormat::NVFP4, 384, 256), ms::Error);
  ms::cuda::MoeExpertsParams p;
  p.format = MoeWeightFormat::BF16;
  p.m = 8192;
  p.top_k = 8;
  p.n_experts = 256;
  p.hidden = 6144;
  p.inter = 2048;
  p.wgmma_load = 1;  // asked for without maps
  EXPECT_TRUE(ms::cuda::moe_experts_wgmma_unavailable(p).has_value());
  EXPECT_THROW(ms::cuda::moe_experts_wgmma_config(p), ms::Error);
  // FP8Block: no maps to build; asked for tensor copies, it gets cp.async.
  EXPECT_THROW(ms::cuda::moe_experts_wgmma_maps(&w, 1, MoeWeightFormat::FP8Block, 512, 256), ms::Error);
  p.format = MoeWeightFormat::FP8Block;
  p.hidden = 7168;
  EXPECT_FALSE(ms::cuda::moe_experts_wgmma_unavailable(p).has_value());
  EXPECT_EQ(ms::cuda::moe_experts_wgmma_config(p).gate_up.load, ms::cuda::MoeWgLoad::CpAsync);
  EXPECT_FALSE(ms::cuda::moe_experts_wgmma_groups_rows(p));
}

TEST(CudaMoeWgmma, ChosenByDefaultOnSm90ForLargeSteps) {
  if (!have_sm90()) GTEST_SKIP() << "no CUDA device of sm_90";
  ms::cuda::MoeExpertsParams p;
  p.format = MoeWeightFormat::NVFP4;
  p.m = 8192;
  p.top_k = 8;
  p.n_experts = 256;
  p.hidden = 6144;
  p.inter = 2048;
  if (std::getenv("MOESERVE_MOE_PREFILL_KERNEL") == nullptr) {
    EXPECT_EQ(ms::cuda::moe_experts_prefill_kernel(p), MoePrefillKernel::Wgmma);
  }
  p.prefill_kernel = MoePrefillKernel::Mma;
  EXPECT_EQ(ms::cuda::moe_experts_prefill_kernel(p), MoePrefillKernel::Mma);
  const auto cfg = ms::cuda::moe_experts_wgmma_config(p);
  EXPECT_EQ(cfg.gate_up.bn, 256);
  EXPECT_EQ(cfg.down.bn, 256);
  // DeepSeek-V3's FP8Block experts take the same kernel and tiles, ring of 4.
  p.prefill_kernel = MoePrefillKernel::Auto;
  p.format = MoeWeightFormat::FP8Block;
  p.hidden = 7168;
  if (std::getenv("MOESERVE_MOE_PREFILL_KERNEL") == nullptr) {
    EXPECT_EQ(ms::cuda::moe_experts_prefill_kernel(p), MoePrefillKernel::Wgmma);
  }
  const auto f8 = ms::cuda::moe_experts_wgmma_config(p);
  EXPECT_EQ(f8.gate_up.bn, 256);
  EXPECT_EQ(f8.down.bn, 256);
  EXPECT_EQ(f8.gate_up.stages, 4);
  EXPECT_EQ(f8.down.expand, ms::cuda::MoeWgExpand::Consumer);
}

// The op as the executor calls it (ops::moe_experts on the CUDA backend) on a layer in the prefill regime
// (1000 tokens x top-4 over 16 experts, hidden 512, inter 256): the relative error against the f32 CPU
// reference, in default mode and in exact mode, on one backend (passed in, so that its state can be read).
struct OpErrors {
  double tensor_core = 0, exact = 0;
};

OpErrors op_against_cpu(MoeWeightFormat f, ms::ops::CudaBackend& backend) {
  const int E = 16, H = 512, I = 256, m = 1000, K = 4;
  const Experts xs(E, H, I, f, 6);
  std::mt19937 rng(60);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> uw(0.05f, 1.0f);
  const auto ids = make_ids(m, K, E, Routing::Uniform, rng);
  std::vector<float> wts(ids.size()), x(static_cast<size_t>(m) * H), out0(x.size());
  for (auto& v : wts) v = uw(rng);
  for (auto& v : x) v = nd(rng);
  for (auto& v : out0) v = nd(rng);
  std::vector<float> ref = out0;
  {
    const auto scratch = ms::ops::MoeScratch::make(ms::ops::cpu_alloc(), m, K, E, H, I);
    std::vector<float> xc = x, wc = wts;
    std::vector<int32_t> idc = ids;
    ms::ops::moe_experts(ms::ops::Ctx::cpu(), ms::Tensor::borrow(xc.data(), {m, H}, ms::DType::F32),
                         ms::Tensor::borrow(idc.data(), {m, K}, ms::DType::I32),
                         ms::Tensor::borrow(wc.data(), {m, K}, ms::DType::F32), xs.cpu(),
                         ms::Tensor::borrow(ref.data(), {m, H}, ms::DType::F32), scratch);
  }
  std::vector<std::shared_ptr<void>> held;  // the device scratch, freed at the end
  const ms::TensorAlloc dev_alloc = [&](const ms::Shape& shape, ms::DType dt) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(ms::dtype_bytes(dt, static_cast<size_t>(n)), 256)));
    held.emplace_back(p, [](void* q) { cudaFree(q); });
    return ms::Tensor::borrow(p, shape, dt, nullptr, ms::Device::CUDA);
  };
  const auto scratch = ms::ops::MoeScratch::make(dev_alloc, m, K, E, H, I);
  const auto experts = xs.device();
  Buf<float> d_x(x), d_w(wts), d_out(out0);
  Buf<int32_t> d_ids(ids);
  const auto cuda = ms::Device::CUDA;
  auto run = [&](bool exact) {
    backend.set_exact_linear(exact);
    CUDA_CHECK(cudaMemcpy(d_out.get(), out0.data(), out0.size() * 4, cudaMemcpyHostToDevice));
    ms::ops::moe_experts(backend.ctx(nullptr),
                         ms::Tensor::borrow(d_x.get(), {m, H}, ms::DType::F32, nullptr, cuda),
                         ms::Tensor::borrow(d_ids.get(), {m, K}, ms::DType::I32, nullptr, cuda),
                         ms::Tensor::borrow(d_w.get(), {m, K}, ms::DType::F32, nullptr, cuda), experts,
                         ms::Tensor::borrow(d_out.get(), {m, H}, ms::DType::F32, nullptr, cuda), scratch);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = d_out.download();
    double c2 = 0, e2 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double c = ref[i] - out0[i], d = static_cast<double>(got[i]) - ref[i];
      c2 += c * c;
      e2 += std::isfinite(d) ? d * d : 1e30;
    }
    return std::sqrt(e2 / std::max(c2, 1e-30));
  };
  OpErrors r;
  r.tensor_core = run(false);
  r.exact = run(true);
  std::printf("  [moe_op] %s E=%d H=%d I=%d m=%d K=%d: tensor-core path %.2e, exact mode %.2e\n",
              format_name(f), E, H, I, m, K, r.tensor_core, r.exact);
  return r;
}

// An FP8Block layer must take the tensor-core path (bf16 activations: error of order 1e-3, above 1e-5) and
// match the reference within the bf16 tolerance; in exact mode the same call stays on the f32 CUDA-core
// kernels (error below 1e-5). An executor that kept FP8Block on the CUDA-core kernels fails the first bound.
TEST(CudaMoeMma, Fp8BlockLayerTakesTheTensorCorePath) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device of sm_80 or newer";
  ms::ops::CudaBackend backend;
  const OpErrors e = op_against_cpu(MoeWeightFormat::FP8Block, backend);
  EXPECT_LT(e.tensor_core, 1e-2);
  EXPECT_GT(e.tensor_core, 1e-5)
      << "f32-exact result: the FP8Block layer did not take the tensor-core (bf16) path";
  EXPECT_LT(e.exact, 1e-5);
  EXPECT_EQ(backend.moe_tensor_copy_layers(), 0);  // FP8Block copies with cp.async
}

// NVFP4 and BF16 layers on sm_90: the op builds the layer's tensor maps at its first prefill pass, so the
// warpgroup kernel loads by tensor copies, and the result matches the CPU reference within the bf16
// tolerance.
TEST(CudaMoeMma, Nvfp4AndBf16LayersLoadByTensorCopies) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device of sm_80 or newer";
  const char* forced = std::getenv("MOESERVE_MOE_WGMMA_LOAD");
  for (MoeWeightFormat f : {MoeWeightFormat::NVFP4, MoeWeightFormat::BF16}) {
    ms::ops::CudaBackend backend;
    const OpErrors e = op_against_cpu(f, backend);
    EXPECT_LT(e.tensor_core, 1e-2) << format_name(f);
    EXPECT_GT(e.tensor_core, 1e-5) << format_name(f) << ": f32-exact result, not the tensor-core path";
    EXPECT_LT(e.exact, 1e-5) << format_name(f);
    if (have_sm90() && !(forced && std::strcmp(forced, "cpasync") == 0)) {
      EXPECT_EQ(backend.moe_tensor_copy_layers(), 1) << format_name(f);
    }
  }
}

TEST(CudaMoeMma, BigTilesWhenExpertsHaveManyRows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device of sm_80 or newer";
  // 1000 tokens x top-4 over 16 experts: 250 rows an expert -> the bm 128 configuration.
  ms::cuda::MoeMmaShape s{ms::cuda::MoeMmaFormat::NVFP4, 1000, 4, 16, 384, 192};
  const auto cfg = ms::cuda::choose_moe_mma_config(s, ms::cuda::limits_of(ms::cuda::current_device_caps()));
  ASSERT_TRUE(cfg.has_value());
  EXPECT_EQ(cfg->bm, 128);
}

TEST(CudaMoeMma, UnsupportedShapesAreRefused) {
  ms::cuda::MoeExpertsParams p;
  p.format = MoeWeightFormat::NVFP4;
  p.m = 4;
  p.top_k = 2;
  p.n_experts = 4;
  p.hidden = 320;  // not a multiple of 128
  p.inter = 128;
  EXPECT_FALSE(ms::cuda::moe_experts_mma_supported(p));
  p.hidden = 256;
  EXPECT_TRUE(ms::cuda::moe_experts_mma_supported(p));
  p.format = MoeWeightFormat::FP8Block;
  EXPECT_TRUE(ms::cuda::moe_experts_mma_supported(p));
  p.fp8_block = 96;  // a 64-k stage would straddle two scale blocks
  EXPECT_FALSE(ms::cuda::moe_experts_mma_supported(p));
  p.fp8_block = 128;
  p.format = MoeWeightFormat::F32;
  EXPECT_FALSE(ms::cuda::moe_experts_mma_supported(p));
}

}  // namespace
