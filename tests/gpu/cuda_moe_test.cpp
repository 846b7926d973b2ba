// The CUDA MoE kernels against the CPU references: routing vs moe::route_cpu (and the OEA steps), the
// grouping plan vs a host stable counting sort, the grouped experts vs ops::moe_experts, for every weight
// format. Outputs and workspaces are poisoned before each run (NaN floats, 0x7f7f7f7f ints) so an element
// left unwritten or read before it is written shows up. Experts that no token uses get null weight pointers:
// a kernel that read them would fault.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_plan.h"
#include "kernels/cuda/moe/moe_route.h"
#include "moe/router.h"
#include "ops/moe_experts.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

namespace {

using ms::cuda::MoeWeightFormat;

template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf& operator=(DevBuf&&) = delete;
  ~DevBuf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n_);
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // 0xff: NaN for f32; 0x7f: 0x7f7f7f7f for i32, no valid id or count.
  void poison(int byte) {
    if (n_ > 0) CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

constexpr int32_t kPoisonI32 = 0x7f7f7f7f;

bool have_gpu() {
  return ms::cuda::device_count() > 0;
}

// ---- routing -------------------------------------------------------------------------------------------

// ops::moe_experts on the CPU: out [m, H] += the routed experts of x [m, H].
void cpu_moe_reference(std::vector<float>& x, std::vector<int32_t> ids, std::vector<float> wts, int K,
                       std::span<const ms::ops::ExpertWeights> experts, std::vector<float>& out, int m, int H,
                       int inter) {
  const ms::ops::Ctx ctx = ms::ops::Ctx::cpu();
  const auto scratch =
      ms::ops::MoeScratch::make(ms::ops::cpu_alloc(), m, K, static_cast<int>(experts.size()), H, inter);
  ms::ops::moe_experts(ctx, ms::Tensor::borrow(x.data(), {m, H}, ms::DType::F32),
                       ms::Tensor::borrow(ids.data(), {m, K}, ms::DType::I32),
                       ms::Tensor::borrow(wts.data(), {m, K}, ms::DType::F32), experts,
                       ms::Tensor::borrow(out.data(), {m, H}, ms::DType::F32), scratch);
}

ms::cuda::MoeRouteConfig to_gpu(const ms::moe::RouterConfig& c, const ms::moe::OeaConfig& o) {
  ms::cuda::MoeRouteConfig g;
  g.n_experts = c.n_experts;
  g.top_k = c.top_k;
  g.n_group = c.n_group;
  g.topk_group = c.topk_group;
  g.scoring =
      c.scoring == ms::moe::Scoring::Sigmoid ? ms::cuda::MoeScoring::Sigmoid : ms::cuda::MoeScoring::Softmax;
  g.use_correction_bias = c.use_correction_bias;
  g.norm_topk_prob = c.norm_topk_prob;
  g.routed_scaling_factor = c.routed_scaling_factor;
  g.group_score = c.group_score == ms::moe::GroupScore::Top2Sum ? ms::cuda::MoeGroupScore::Top2Sum
                                                                : ms::cuda::MoeGroupScore::Max;
  g.masked_fill = c.masked_fill == ms::moe::MaskedFill::NegInf ? ms::cuda::MoeMaskedFill::NegInf
                                                               : ms::cuda::MoeMaskedFill::Zero;
  g.oea_enabled = o.enabled;
  g.oea_k0 = o.k0;
  g.oea_kmax = o.kmax;
  return g;
}

ms::moe::RouterConfig glm5() {
  ms::moe::RouterConfig c;
  c.n_experts = 256;
  c.top_k = 8;
  c.n_group = 1;
  c.topk_group = 1;
  c.scoring = ms::moe::Scoring::Sigmoid;
  c.use_correction_bias = true;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  return c;
}

ms::moe::RouterConfig deepseek_v3(ms::moe::MaskedFill fill) {
  ms::moe::RouterConfig c = glm5();
  c.n_group = 8;
  c.topk_group = 4;
  c.group_score = ms::moe::GroupScore::Top2Sum;
  c.masked_fill = fill;
  return c;
}

enum class Mask { None, AllZero, Mixed, AllOne };

struct RouteCase {
  ms::moe::RouterConfig cfg;
  ms::moe::OeaConfig oea;
  int m = 1;
  Mask mask = Mask::None;
  bool ties = false;  // logits and bias on a few levels: many exact ties for the tie rule
  uint32_t seed = 1;
};

std::string describe(const RouteCase& c) {
  return "E=" + std::to_string(c.cfg.n_experts) + " K=" + std::to_string(c.cfg.top_k) +
         " groups=" + std::to_string(c.cfg.n_group) + "/" + std::to_string(c.cfg.topk_group) +
         (c.cfg.scoring == ms::moe::Scoring::Sigmoid ? " sigmoid" : " softmax") +
         (c.cfg.use_correction_bias ? " bias" : "") +
         (c.cfg.masked_fill == ms::moe::MaskedFill::Zero ? " fill0" : "") +
         (c.oea.enabled ? " oea k0=" + std::to_string(c.oea.k0) + " kmax=" + std::to_string(c.oea.kmax)
                        : "") +
         " m=" + std::to_string(c.m) + " mask=" + std::to_string(static_cast<int>(c.mask)) +
         (c.ties ? " ties" : "");
}

// Gathers the rows of `rows` and routes them on the CPU; scatters the slots back.
void route_rows_cpu(const ms::moe::RouterConfig& cfg, const ms::moe::OeaConfig& oea,
                    const std::vector<float>& logits, const std::vector<float>& bias,
                    const std::vector<int>& rows, std::vector<int32_t>& ids, std::vector<float>& weights,
                    std::vector<uint8_t>* base_set) {
  const int E = cfg.n_experts, K = cfg.top_k, n = static_cast<int>(rows.size());
  std::vector<float> lg(static_cast<size_t>(n) * E);
  for (int i = 0; i < n; ++i)
    std::copy_n(logits.begin() + static_cast<int64_t>(rows[i]) * E, E,
                lg.begin() + static_cast<int64_t>(i) * E);
  std::vector<int32_t> gi(static_cast<size_t>(n) * K);
  std::vector<float> gw(gi.size());
  ms::moe::RouterParams p{lg.data(), bias.data(), gi.data(), gw.data(), n};
  ms::moe::route_cpu(cfg, oea, p);
  if (base_set != nullptr) ms::moe::oea_base_set_cpu(cfg, oea, p, base_set->data());
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < K; ++k) {
      ids[static_cast<size_t>(rows[i]) * K + k] = gi[static_cast<size_t>(i) * K + k];
      weights[static_cast<size_t>(rows[i]) * K + k] = gw[static_cast<size_t>(i) * K + k];
    }
}

void run_route_case(const RouteCase& c) {
  SCOPED_TRACE(describe(c));
  const int E = c.cfg.n_experts, K = c.cfg.top_k, m = c.m;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.5f);
  // Irregular levels, so that sums of two different pairs of scores do not meet by accident.
  const float levels[7] = {-1.73f, -0.91f, -0.37f, 0.13f, 0.61f, 1.29f, 2.07f};
  std::vector<float> logits(static_cast<size_t>(m) * E), bias(E);
  for (auto& v : logits) v = c.ties ? levels[rng() % 7] : nd(rng);
  for (auto& v : bias) v = c.ties ? 0.0625f * static_cast<float>(rng() % 2) : 0.05f * nd(rng);
  std::vector<uint8_t> mask(m, 0);
  for (auto& v : mask)
    v = c.mask == Mask::AllOne ? 1 : c.mask == Mask::Mixed ? static_cast<uint8_t>(rng() % 2) : 0;

  // CPU reference: mask-0 rows plain, mask-1 rows with OEA over the mask-1 rows (when enabled).
  std::vector<int32_t> ref_ids(static_cast<size_t>(m) * K, kPoisonI32);
  std::vector<float> ref_w(ref_ids.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<int> rows0, rows1;
  for (int r = 0; r < m; ++r) (c.mask != Mask::None && c.oea.enabled && mask[r] ? rows1 : rows0).push_back(r);
  std::vector<uint8_t> ref_base(E, 0);
  route_rows_cpu(c.cfg, {}, logits, bias, rows0, ref_ids, ref_w, nullptr);
  if (!rows1.empty()) route_rows_cpu(c.cfg, c.oea, logits, bias, rows1, ref_ids, ref_w, &ref_base);

  DevBuf<float> d_logits(logits), d_bias(bias);
  DevBuf<uint8_t> d_mask(mask), d_base(E);
  DevBuf<int32_t> d_ids(ref_ids.size());
  DevBuf<float> d_w(ref_ids.size());
  d_ids.poison(0x7f);
  d_w.poison(0xff);
  d_base.poison(0x7f);
  ms::cuda::MoeRouteParams p;
  p.logits = d_logits.get();
  p.ld_logits = E;
  p.correction_bias = d_bias.get();
  p.decode_mask = c.mask == Mask::None ? nullptr : d_mask.get();
  p.base_set = d_base.get();
  p.topk_ids = d_ids.get();
  p.topk_weights = d_w.get();
  p.m = m;
  ms::cuda::moe_route(to_gpu(c.cfg, c.oea), p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto ids = d_ids.download();
  const auto w = d_w.download();
  int bad = 0;
  for (size_t i = 0; i < ids.size() && bad < 5; ++i) {
    const float tol = 2e-6f * std::max(1.0f, std::fabs(ref_w[i]));
    if (ids[i] != ref_ids[i] || !(std::fabs(w[i] - ref_w[i]) <= tol)) {
      ADD_FAILURE() << "row " << i / K << " slot " << i % K << ": gpu (" << ids[i] << ", " << w[i]
                    << ") cpu (" << ref_ids[i] << ", " << ref_w[i] << ")";
      ++bad;
    }
  }
  if (c.oea.enabled && c.mask != Mask::None) {
    const auto base = d_base.download();
    for (int e = 0; e < E; ++e) EXPECT_EQ(base[e], ref_base[e]) << "base_set[" << e << "]";
  }
}

TEST(CudaMoeRoute, Glm5SigmoidBias) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int m : {1, 3, 64, 300}) run_route_case({glm5(), {}, m, Mask::None, false, 10u + m});
  run_route_case({glm5(), {}, 64, Mask::None, true, 5});
}

TEST(CudaMoeRoute, DeepSeekV3Groups) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (auto fill : {ms::moe::MaskedFill::NegInf, ms::moe::MaskedFill::Zero}) {
    for (int m : {1, 3, 64, 300}) run_route_case({deepseek_v3(fill), {}, m, Mask::None, false, 20u + m});
    run_route_case({deepseek_v3(fill), {}, 300, Mask::None, true, 21});
  }
  // Zero fill matters when biased scores go negative: masked experts (0) then beat eligible ones.
  ms::moe::RouterConfig c = deepseek_v3(ms::moe::MaskedFill::Zero);
  c.routed_scaling_factor = 1.0f;
  RouteCase rc{c, {}, 64, Mask::None, false, 22};
  run_route_case(rc);
}

TEST(CudaMoeRoute, Softmax) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ms::moe::RouterConfig qwen;  // Qwen-style: softmax over all experts, no groups, no bias
  qwen.n_experts = 128;
  qwen.top_k = 8;
  qwen.scoring = ms::moe::Scoring::Softmax;
  qwen.use_correction_bias = false;
  qwen.norm_topk_prob = true;
  for (int m : {1, 3, 64, 300}) run_route_case({qwen, {}, m, Mask::None, false, 30u + m});
  run_route_case({qwen, {}, 64, Mask::None, true, 31});
  ms::moe::RouterConfig v2;  // DeepSeek-V2: softmax, group max, no normalisation, scaling 16
  v2.n_experts = 160;
  v2.top_k = 6;
  v2.n_group = 8;
  v2.topk_group = 3;
  v2.scoring = ms::moe::Scoring::Softmax;
  v2.use_correction_bias = false;
  v2.norm_topk_prob = false;
  v2.routed_scaling_factor = 16.0f;
  v2.group_score = ms::moe::GroupScore::Max;
  for (int m : {1, 64, 300}) run_route_case({v2, {}, m, Mask::None, false, 32u + m});
  run_route_case({v2, {}, 64, Mask::None, true, 33});
}

TEST(CudaMoeRoute, Limits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ms::moe::RouterConfig big = glm5();  // the kernel's limits: 512 experts, top-16, 32 groups of 16
  big.n_experts = 512;
  big.top_k = 16;
  big.n_group = 32;
  big.topk_group = 8;
  run_route_case({big, {}, 3, Mask::None, false, 40});
  run_route_case({big, {}, 64, Mask::None, true, 41});
  ms::moe::RouterConfig odd;  // n_experts not a multiple of 32, groups of 18, no bias, zero fill
  odd.n_experts = 72;
  odd.top_k = 5;
  odd.n_group = 4;
  odd.topk_group = 2;
  odd.use_correction_bias = false;
  odd.masked_fill = ms::moe::MaskedFill::Zero;
  run_route_case({odd, {}, 64, Mask::None, false, 42});
  ms::moe::RouterConfig single = glm5();  // one-expert groups: the group score is the expert's value
  single.n_experts = 32;
  single.n_group = 32;
  single.topk_group = 10;
  run_route_case({single, {}, 64, Mask::None, false, 43});
  run_route_case({single, {}, 64, Mask::None, true, 44});
}

TEST(CudaMoeRoute, OeaWithDecodeMask) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ms::moe::OeaConfig oea{true, 4, 0};
  for (int m : {1, 3, 64, 300}) {
    run_route_case({glm5(), oea, m, Mask::Mixed, false, 50u + m});
    run_route_case({glm5(), oea, m, Mask::AllOne, false, 51u + m});
  }
  run_route_case({glm5(), oea, 64, Mask::AllZero, false, 52});
  run_route_case({glm5(), oea, 64, Mask::None, false, 53});  // no mask: every row plain
  run_route_case({glm5(), ms::moe::OeaConfig{true, 3, 6}, 64, Mask::Mixed, false, 54});
  run_route_case({glm5(), ms::moe::OeaConfig{true, 2, 8}, 300, Mask::Mixed, true, 55});
  run_route_case({deepseek_v3(ms::moe::MaskedFill::NegInf), oea, 64, Mask::Mixed, false, 56});
  run_route_case({deepseek_v3(ms::moe::MaskedFill::Zero), oea, 64, Mask::Mixed, true, 57});
  run_route_case({glm5(), ms::moe::OeaConfig{true, 8, 0}, 64, Mask::Mixed, false, 58});  // k0 == top_k: plain
}

TEST(CudaMoeRoute, TwoStepsEqualOneCall) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // moe_route_base_set + moe_route_select (with room for an all-reduce between them) = moe_route.
  const auto cfg = to_gpu(glm5(), ms::moe::OeaConfig{true, 4, 0});
  const int m = 37, E = cfg.n_experts, K = cfg.top_k;
  std::mt19937 rng(60);
  std::normal_distribution<float> nd;
  std::vector<float> logits(static_cast<size_t>(m) * E), bias(E);
  for (auto& v : logits) v = nd(rng);
  for (auto& v : bias) v = 0.05f * nd(rng);
  std::vector<uint8_t> mask(m);
  for (auto& v : mask) v = static_cast<uint8_t>(rng() % 2);
  DevBuf<float> d_logits(logits), d_bias(bias);
  DevBuf<uint8_t> d_mask(mask), d_base(E);
  DevBuf<int32_t> ids_a(m * K), ids_b(m * K);
  DevBuf<float> w_a(m * K), w_b(m * K);
  ms::cuda::MoeRouteParams p{d_logits.get(), E,           d_bias.get(), d_mask.get(),
                             d_base.get(),   ids_a.get(), w_a.get(),    m};
  ms::cuda::moe_route(cfg, p, nullptr);
  p.topk_ids = ids_b.get();
  p.topk_weights = w_b.get();
  d_base.poison(0x7f);
  ms::cuda::moe_route_base_set(cfg, p, nullptr);
  ms::cuda::moe_route_select(cfg, p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(ids_a.download(), ids_b.download());
  EXPECT_EQ(w_a.download(), w_b.download());
}

TEST(CudaMoeRoute, RefusesBadConfigs) {
  ms::cuda::MoeRouteConfig c = to_gpu(glm5(), {});
  ms::cuda::MoeRouteParams p{};
  c.n_experts = 1024;
  EXPECT_THROW(ms::cuda::moe_route_check(c, p), ms::Error);
  c = to_gpu(glm5(), {});
  c.top_k = 17;
  EXPECT_THROW(ms::cuda::moe_route_check(c, p), ms::Error);
  c = to_gpu(glm5(), {});
  c.n_group = 3;
  EXPECT_THROW(ms::cuda::moe_route_check(c, p), ms::Error);
  c = to_gpu(glm5(), ms::moe::OeaConfig{true, 4, 0});
  EXPECT_THROW(ms::cuda::moe_route_check(c, p), ms::Error);  // OEA without a base_set buffer
}

// ---- grouping plan -------------------------------------------------------------------------------------

struct HostPlan {
  std::vector<int32_t> counts, offsets, sorted;
};

HostPlan plan_host(const std::vector<int32_t>& ids, int E) {
  HostPlan h;
  h.counts.assign(E, 0);
  for (int32_t e : ids)
    if (e >= 0 && e < E) ++h.counts[e];
  h.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) h.offsets[e + 1] = h.offsets[e] + h.counts[e];
  h.sorted.assign(ids.size(), -1);
  std::vector<int32_t> fill(h.offsets.begin(), h.offsets.end() - 1);
  for (size_t s = 0; s < ids.size(); ++s)
    if (ids[s] >= 0 && ids[s] < E) h.sorted[fill[ids[s]]++] = static_cast<int32_t>(s);
  return h;
}

// K distinct experts per token; skewed: expert e drawn with weight 1 / (e + 1)^2. empty: share of -1 slots.
std::vector<int32_t> make_ids(int m, int K, int E, bool skewed, double empty, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(m) * K);
  std::vector<double> pw(E);
  for (int e = 0; e < E; ++e) pw[e] = skewed ? 1.0 / ((e + 1.0) * (e + 1.0)) : 1.0;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int t = 0; t < m; ++t) {
    std::vector<double> w = pw;
    for (int k = 0; k < K; ++k) {
      std::discrete_distribution<int> d(w.begin(), w.end());
      const int e = d(rng);
      w[e] = 0.0;
      ids[static_cast<size_t>(t) * K + k] = u(rng) < empty ? -1 : e;
    }
  }
  return ids;
}

void run_plan_case(int m, int K, int E, bool skewed, double empty, bool out_of_range, uint32_t seed) {
  SCOPED_TRACE("plan m=" + std::to_string(m) + " K=" + std::to_string(K) + " E=" + std::to_string(E) +
               (skewed ? " skewed" : " uniform"));
  std::mt19937 rng(seed);
  auto ids = make_ids(m, K, E, skewed, empty, rng);
  if (out_of_range && !ids.empty()) ids[ids.size() / 2] = E + 3;  // treated as an empty slot
  const HostPlan h = plan_host(ids, E);
  DevBuf<int32_t> d_ids(ids), d_counts(E), d_offsets(E + 1), d_sorted(ids.size());
  d_counts.poison(0x7f);
  d_offsets.poison(0x7f);
  d_sorted.poison(0x7f);
  ms::cuda::MoePlanParams p{d_ids.get(), d_counts.get(), d_offsets.get(), d_sorted.get(), m, K, E};
  ms::cuda::moe_plan(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_counts.download(), h.counts);
  EXPECT_EQ(d_offsets.download(), h.offsets);
  EXPECT_EQ(d_sorted.download(), h.sorted);
}

TEST(CudaMoePlan, MatchesHostStableGrouping) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int m : {1, 3, 64, 300}) {
    run_plan_case(m, 8, 256, false, 0.0, false, 70u + m);
    run_plan_case(m, 8, 256, true, 0.1, false, 71u + m);
  }
  run_plan_case(2000, 6, 64, true, 0.05, true, 72);
  run_plan_case(5, 16, 512, false, 0.3, true, 73);
  run_plan_case(1000, 4, 1024, false, 0.0, false, 74);
  run_plan_case(0, 8, 256, false, 0.0, false, 75);
}

// ---- experts -------------------------------------------------------------------------------------------

struct Stored {
  std::vector<uint8_t> data, scale;
  float scale2 = 1.0f;
};

Stored store(const std::vector<float>& w, int rows, int cols, MoeWeightFormat f) {
  Stored s;
  switch (f) {
    case MoeWeightFormat::F32:
      s.data.resize(w.size() * 4);
      std::memcpy(s.data.data(), w.data(), s.data.size());
      break;
    case MoeWeightFormat::BF16: {
      s.data.resize(w.size() * 2);
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t b = ms::quant::f32_to_bf16(w[i]);
        std::memcpy(s.data.data() + 2 * i, &b, 2);
      }
      break;
    }
    case MoeWeightFormat::FP8Block: {
      auto q = ms::quant::fp8_block_quantize(w.data(), rows, cols);
      s.data = std::move(q.data);
      s.scale.resize(q.scale_inv.size() * 4);
      std::memcpy(s.scale.data(), q.scale_inv.data(), s.scale.size());
      break;
    }
    case MoeWeightFormat::NVFP4: {
      auto q = ms::quant::nvfp4_quantize(w.data(), rows, cols);
      s.data = std::move(q.packed);
      s.scale = std::move(q.scales);
      s.scale2 = q.scale2;
      break;
    }
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
  switch (f) {
    case MoeWeightFormat::F32:
      lw.format = ms::ops::WeightFormat::F32;
      lw.weight = ms::Tensor::borrow(data, {rows, cols}, ms::DType::F32);
      break;
    case MoeWeightFormat::BF16:
      lw.format = ms::ops::WeightFormat::BF16;
      lw.weight = ms::Tensor::borrow(data, {rows, cols}, ms::DType::BF16);
      break;
    case MoeWeightFormat::FP8Block:
      lw.format = ms::ops::WeightFormat::FP8Block;
      lw.weight = ms::Tensor::borrow(data, {rows, cols}, ms::DType::F8_E4M3);
      lw.scale = ms::Tensor::borrow(scale, {(rows + 127) / 128, (cols + 127) / 128}, ms::DType::F32);
      break;
    case MoeWeightFormat::NVFP4:
      lw.format = ms::ops::WeightFormat::NVFP4;
      lw.weight = ms::Tensor::borrow(data, {rows, cols / 2}, ms::DType::U8);
      lw.scale = ms::Tensor::borrow(scale, {rows, cols / 16}, ms::DType::F8_E4M3);
      break;
  }
  return lw;
}

const char* format_name(MoeWeightFormat f) {
  switch (f) {
    case MoeWeightFormat::F32:
      return "f32";
    case MoeWeightFormat::BF16:
      return "bf16";
    case MoeWeightFormat::FP8Block:
      return "fp8_block";
    case MoeWeightFormat::NVFP4:
      return "nvfp4";
  }
  return "?";
}

// E experts of one format, on the host (CPU reference) and on the device.
class ExpertSet {
 public:
  ExpertSet(int E, int hidden, int inter, MoeWeightFormat f, uint32_t seed)
      : E_(E), hidden_(hidden), inter_(inter), format_(f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto matrix = [&](int rows, int cols) {
      std::vector<float> w(static_cast<size_t>(rows) * cols);
      const float sd = 1.0f / std::sqrt(static_cast<float>(cols));
      for (auto& v : w) v = sd * nd(rng);
      return w;
    };
    stored_.reserve(static_cast<size_t>(E) * 3);
    for (int e = 0; e < E; ++e) {
      stored_.push_back(store(matrix(inter, hidden), inter, hidden, f));
      stored_.push_back(store(matrix(inter, hidden), inter, hidden, f));
      stored_.push_back(store(matrix(hidden, inter), hidden, inter, f));
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

  const std::vector<ms::ops::ExpertWeights>& cpu() const { return cpu_; }

  // The device table; experts not in `touched` get null pointers (and NaN scales) so a read would fault.
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

  int E() const { return E_; }
  int hidden() const { return hidden_; }
  int inter() const { return inter_; }
  MoeWeightFormat format() const { return format_; }

 private:
  int E_, hidden_, inter_;
  MoeWeightFormat format_;
  std::vector<Stored> stored_;  // [E][gate, up, down]
  std::vector<ms::ops::ExpertWeights> cpu_;
  std::vector<DevBuf<uint8_t>> dev_;  // [E][gate, gate scale, up, up scale, down, down scale]
};

// Runs plan + experts on the device over poisoned workspaces; returns out. pad > 0: x and out sit in rows
// of H + pad (the padding of x NaN, of out a marker that must survive), which also leaves the tiled path's
// vector alignment when pad % 4 != 0.
std::vector<float> run_experts_gpu(const ExpertSet& xs, const std::vector<float>& x,
                                   const std::vector<int32_t>& ids, const std::vector<float>& wts,
                                   const std::vector<float>& out0, int m, int K, int pad = 0) {
  const int E = xs.E(), H = xs.hidden(), I = xs.inter();
  const int64_t ld = H + pad;
  std::vector<uint8_t> touched(E, 0);
  for (int32_t e : ids)
    if (e >= 0) touched[e] = 1;
  constexpr float kOutPad = 12345.0f;
  std::vector<float> x_ld(static_cast<size_t>(m) * ld, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> out_ld(x_ld.size(), kOutPad);
  for (int t = 0; t < m; ++t) {
    std::copy_n(x.begin() + static_cast<int64_t>(t) * H, H, x_ld.begin() + t * ld);
    std::copy_n(out0.begin() + static_cast<int64_t>(t) * H, H, out_ld.begin() + t * ld);
  }
  DevBuf<ms::cuda::MoeExpertWeights> d_table(xs.table(touched));
  DevBuf<float> d_x(x_ld), d_w(wts), d_out(out_ld);
  DevBuf<int32_t> d_ids(ids), d_counts(E), d_offsets(E + 1), d_sorted(ids.size());
  DevBuf<float> d_act(ms::cuda::moe_experts_act_bytes(m, K, I) / sizeof(float));
  DevBuf<float> d_slot(ms::cuda::moe_experts_slot_out_bytes(m, K, H) / sizeof(float));
  d_counts.poison(0x7f);
  d_offsets.poison(0x7f);
  d_sorted.poison(0x7f);
  d_act.poison(0xff);
  d_slot.poison(0xff);
  ms::cuda::moe_plan({d_ids.get(), d_counts.get(), d_offsets.get(), d_sorted.get(), m, K, E}, nullptr);
  ms::cuda::MoeExpertsParams p;
  p.x = d_x.get();
  p.ldx = ld;
  p.topk_ids = d_ids.get();
  p.topk_weights = d_w.get();
  p.expert_counts = d_counts.get();
  p.expert_offsets = d_offsets.get();
  p.sorted_slots = d_sorted.get();
  p.experts = d_table.get();
  p.format = xs.format();
  p.act = d_act.get();
  p.slot_out = d_slot.get();
  p.out = d_out.get();
  p.ldo = ld;
  p.m = m;
  p.top_k = K;
  p.n_experts = E;
  p.hidden = H;
  p.inter = I;
  ms::cuda::moe_experts(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto got_ld = d_out.download();
  std::vector<float> got(static_cast<size_t>(m) * H);
  for (int t = 0; t < m; ++t) {
    std::copy_n(got_ld.begin() + t * ld, H, got.begin() + static_cast<int64_t>(t) * H);
    for (int64_t c = H; c < ld; ++c) EXPECT_EQ(got_ld[t * ld + c], kOutPad) << "out padding, token " << t;
  }
  return got;
}

void run_experts_case(const ExpertSet& xs, int m, int K, bool skewed, double empty, uint32_t seed,
                      int pad = 0) {
  SCOPED_TRACE(std::string("experts ") + format_name(xs.format()) + " E=" + std::to_string(xs.E()) + " H=" +
               std::to_string(xs.hidden()) + " I=" + std::to_string(xs.inter()) + " m=" + std::to_string(m) +
               " K=" + std::to_string(K) + (skewed ? " skewed" : " uniform") + " pad=" + std::to_string(pad));
  const int H = xs.hidden();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> uw(0.05f, 1.0f);
  const auto ids = make_ids(m, K, xs.E(), skewed, empty, rng);
  std::vector<float> wts(ids.size()), x(static_cast<size_t>(m) * H), out0(x.size());
  for (auto& v : wts) v = uw(rng);
  for (auto& v : x) v = nd(rng);
  for (auto& v : out0) v = nd(rng);

  std::vector<float> ref = out0;
  cpu_moe_reference(x, ids, wts, K, xs.cpu(), ref, m, H, xs.inter());
  const auto got = run_experts_gpu(xs, x, ids, wts, out0, m, K, pad);

  // Same dequantised weights on both sides; what differs is f32 summation order, relative to the size of
  // the experts' contribution.
  double mean_contrib = 0;
  for (size_t i = 0; i < ref.size(); ++i) mean_contrib += std::fabs(ref[i] - out0[i]);
  mean_contrib /= std::max<size_t>(ref.size(), 1);
  int bad = 0;
  for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
    const double tol = 1e-4 * (mean_contrib + std::fabs(ref[i] - out0[i])) + 1e-6 * std::fabs(ref[i]);
    if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > tol) {
      ADD_FAILURE() << "token " << i / H << " col " << i % H << ": gpu " << got[i] << " cpu " << ref[i]
                    << " (out before " << out0[i] << ")";
      ++bad;
    }
  }
  // Deterministic: a second run gives the same bits.
  if (m == 64) {
    EXPECT_EQ(run_experts_gpu(xs, x, ids, wts, out0, m, K, pad), got);
  }
}

class CudaMoeExperts : public ::testing::TestWithParam<MoeWeightFormat> {};

TEST_P(CudaMoeExperts, MatchesCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // 320 x 192: column tiles that are not powers of two; FP8 blocks cut at 128 (partial scale blocks).
  const ExpertSet xs(32, 320, 192, GetParam(), 80);
  for (int m : {1, 3, 64, 300}) {
    run_experts_case(xs, m, 6, false, 0.0, 81u + m);
    run_experts_case(xs, m, 6, true, 0.1, 82u + m);
  }
  const ExpertSet wide(16, 256, 512, GetParam(), 83);
  run_experts_case(wide, 300, 8, true, 0.0, 84);  // hot experts with ~300 tokens: many token tiles per block
  run_experts_case(wide, 3, 8, false, 0.0, 85);
}

// Shapes the tiled path does not take (the general kernels): the tiny test models (64 / 32), multiples of 16
// but not 64 (96 / 48, 208 / 112; NVFP4's smallest step), multiples of 8 only (80 / 24) and odd sizes, for
// the formats that allow them.
TEST_P(CudaMoeExperts, OddShapesMatchCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int hidden, inter;
  };
  const bool nvfp4 = GetParam() == MoeWeightFormat::NVFP4;
  const Shape shapes[] = {{64, 32}, {96, 48}, {208, 112}, {80, 24}, {37, 19}, {1, 1}};
  uint32_t seed = 200;
  for (const Shape& sh : shapes) {
    if (nvfp4 && (sh.hidden % 16 != 0 || sh.inter % 16 != 0)) continue;
    ASSERT_EQ(ms::cuda::moe_experts_path(GetParam(), sh.hidden, sh.inter), ms::cuda::MoeExpertsPath::General);
    const ExpertSet xs(12, sh.hidden, sh.inter, GetParam(), seed++);
    for (int m : {1, 3, 64, 300}) {
      run_experts_case(xs, m, 4, false, 0.0, seed++);
      run_experts_case(xs, m, 4, true, 0.1, seed++);
    }
    run_experts_case(xs, 37, 4, true, 0.1, seed++, 3);  // strided rows
  }
  // A tiled shape whose rows are not 16-byte aligned takes the general path as well.
  const ExpertSet tiled(8, 128, 64, GetParam(), seed++);
  for (int m : {3, 64}) run_experts_case(tiled, m, 4, true, 0.0, seed++, 1);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaMoeExperts,
                         ::testing::Values(MoeWeightFormat::F32, MoeWeightFormat::BF16,
                                           MoeWeightFormat::FP8Block, MoeWeightFormat::NVFP4),
                         [](const ::testing::TestParamInfo<MoeWeightFormat>& i) {
                           return std::string(format_name(i.param));
                         });

TEST(CudaMoeExpertsUntouched, NullWeightsOfUntouchedExpertsAreNeverRead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // 64 experts, every token on experts 5, 17 and 40 only: the other 61 have null pointers and NaN scales.
  const ExpertSet xs(64, 256, 128, MoeWeightFormat::NVFP4, 90);
  const int m = 50, K = 3, H = xs.hidden();
  std::mt19937 rng(91);
  std::normal_distribution<float> nd;
  std::vector<int32_t> ids(static_cast<size_t>(m) * K);
  const int32_t used[3] = {5, 17, 40};
  for (int t = 0; t < m; ++t)
    for (int k = 0; k < K; ++k) ids[static_cast<size_t>(t) * K + k] = used[(t + k) % 3];
  std::vector<float> wts(ids.size(), 0.5f), x(static_cast<size_t>(m) * H), out0(x.size());
  for (auto& v : x) v = nd(rng);
  for (auto& v : out0) v = nd(rng);
  std::vector<float> ref = out0;
  cpu_moe_reference(x, ids, wts, K, xs.cpu(), ref, m, H, xs.inter());
  const auto got = run_experts_gpu(xs, x, ids, wts, out0, m, K);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    ASSERT_NEAR(got[i], ref[i], 1e-4 * (1.0 + std::fabs(ref[i]))) << i;
  }
}

TEST(CudaMoeExpertsUntouched, RefusesBadShapes) {
  ms::cuda::MoeExpertsParams p;
  p.m = 0;
  p.top_k = 8;
  p.n_experts = 256;
  p.hidden = 6144;
  p.inter = 2048;
  EXPECT_NO_THROW(ms::cuda::moe_experts_check(p));
  p.hidden = 6100;  // any size for BF16 (the general path)
  EXPECT_NO_THROW(ms::cuda::moe_experts_check(p));
  p.format = MoeWeightFormat::NVFP4;  // not for NVFP4: k must hold whole 16-element blocks
  EXPECT_THROW(ms::cuda::moe_experts_check(p), ms::Error);
  p.hidden = 6144;
  p.inter = 24;
  EXPECT_THROW(ms::cuda::moe_experts_check(p), ms::Error);
  p.inter = 48;
  EXPECT_NO_THROW(ms::cuda::moe_experts_check(p));
  p.format = MoeWeightFormat::BF16;
  p.hidden = 0;
  EXPECT_THROW(ms::cuda::moe_experts_check(p), ms::Error);
  p.hidden = 6144;
  p.inter = 2048;
  p.format = MoeWeightFormat::FP8Block;
  p.fp8_block = 100;
  EXPECT_THROW(ms::cuda::moe_experts_check(p), ms::Error);
  // A non-empty batch: f32 alignment is enough, ldx / ldo must cover hidden.
  alignas(16) static float buf[64];
  static const int32_t ibuf[4] = {};
  static const ms::cuda::MoeExpertWeights table[1] = {};
  p.format = MoeWeightFormat::BF16;
  p.fp8_block = 128;
  p.m = 1;
  p.hidden = 5;
  p.inter = 3;
  p.x = buf + 1;
  p.ldx = 5;
  p.out = buf + 1;
  p.ldo = 5;
  p.act = buf + 1;
  p.slot_out = buf + 1;
  p.topk_ids = ibuf;
  p.topk_weights = buf;
  p.expert_counts = ibuf;
  p.expert_offsets = ibuf;
  p.sorted_slots = ibuf;
  p.experts = table;
  EXPECT_NO_THROW(ms::cuda::moe_experts_check(p));
  p.ldx = 4;
  EXPECT_THROW(ms::cuda::moe_experts_check(p), ms::Error);
  p.ldx = 5;
  p.out = reinterpret_cast<float*>(reinterpret_cast<char*>(buf) + 2);
  EXPECT_THROW(ms::cuda::moe_experts_check(p), ms::Error);
}

TEST(CudaMoeExpertsUntouched, PathChoice) {
  using ms::cuda::moe_experts_path;
  using ms::cuda::MoeExpertsPath;
  for (auto f :
       {MoeWeightFormat::F32, MoeWeightFormat::BF16, MoeWeightFormat::FP8Block, MoeWeightFormat::NVFP4}) {
    EXPECT_EQ(moe_experts_path(f, 6144, 2048), MoeExpertsPath::Tiled);
    EXPECT_EQ(moe_experts_path(f, 7168, 2048), MoeExpertsPath::Tiled);
    EXPECT_EQ(moe_experts_path(f, 64, 64), MoeExpertsPath::Tiled);
    EXPECT_EQ(moe_experts_path(f, 64, 32), MoeExpertsPath::General);
    EXPECT_EQ(moe_experts_path(f, 96, 64), MoeExpertsPath::General);
    EXPECT_EQ(moe_experts_path(f, 2048, 1408 + 16), MoeExpertsPath::General);
  }
  // Alignment of the buffers of one call downgrades a tiled shape.
  alignas(16) static float buf[16];
  ms::cuda::MoeExpertsParams p;
  p.format = MoeWeightFormat::NVFP4;
  p.hidden = 128;
  p.inter = 64;
  p.x = p.out = p.act = p.slot_out = buf;
  p.ldx = p.ldo = 128;
  EXPECT_EQ(moe_experts_path(p), MoeExpertsPath::Tiled);
  p.ldo = 130;
  EXPECT_EQ(moe_experts_path(p), MoeExpertsPath::General);
  p.ldo = 128;
  p.slot_out = buf + 1;
  EXPECT_EQ(moe_experts_path(p), MoeExpertsPath::General);
  p.slot_out = buf;
  p.inter = 48;
  EXPECT_EQ(moe_experts_path(p), MoeExpertsPath::General);
  EXPECT_LE(ms::cuda::moe_experts_smem_bytes(MoeExpertsPath::General), size_t{48} * 1024);
  EXPECT_LE(ms::cuda::moe_experts_smem_bytes(MoeExpertsPath::Tiled), size_t{48} * 1024);
}

// ---- the whole step under a CUDA graph ------------------------------------------------------------------

TEST(CudaMoeGraph, RoutePlanExpertsCaptureAndReplay) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Routing (groups, OEA on a mixed mask), plan and experts captured once; the replay must equal the eager
  // launches bit for bit, which also shows that nothing in them reads device data on the host.
  ms::moe::RouterConfig rc = deepseek_v3(ms::moe::MaskedFill::NegInf);
  rc.n_experts = 64;
  rc.top_k = 6;
  const auto cfg = to_gpu(rc, ms::moe::OeaConfig{true, 3, 0});
  const ExpertSet xs(64, 128, 64, MoeWeightFormat::BF16, 100);
  const int m = 24, E = 64, K = 6, H = xs.hidden(), I = xs.inter();
  std::mt19937 rng(101);
  std::normal_distribution<float> nd;
  std::vector<float> logits(static_cast<size_t>(m) * E), bias(E), x(static_cast<size_t>(m) * H),
      out0(x.size());
  for (auto& v : logits) v = nd(rng);
  for (auto& v : bias) v = 0.05f * nd(rng);
  for (auto& v : x) v = nd(rng);
  for (auto& v : out0) v = nd(rng);
  std::vector<uint8_t> mask(m), all(E, 1);
  for (auto& v : mask) v = static_cast<uint8_t>(rng() % 2);
  DevBuf<ms::cuda::MoeExpertWeights> d_table(xs.table(all));
  DevBuf<float> d_logits(logits), d_bias(bias), d_x(x), d_out(out0), d_w(m * K);
  DevBuf<uint8_t> d_mask(mask), d_base(E);
  DevBuf<int32_t> d_ids(m * K), d_counts(E), d_offsets(E + 1), d_sorted(m * K);
  DevBuf<float> d_act(static_cast<size_t>(m) * K * I), d_slot(static_cast<size_t>(m) * K * H);
  ms::cuda::MoeRouteParams rp{d_logits.get(), E,           d_bias.get(), d_mask.get(),
                              d_base.get(),   d_ids.get(), d_w.get(),    m};
  ms::cuda::MoePlanParams pp{d_ids.get(), d_counts.get(), d_offsets.get(), d_sorted.get(), m, K, E};
  ms::cuda::MoeExpertsParams ep;
  ep.x = d_x.get();
  ep.ldx = H;
  ep.topk_ids = d_ids.get();
  ep.topk_weights = d_w.get();
  ep.expert_counts = d_counts.get();
  ep.expert_offsets = d_offsets.get();
  ep.sorted_slots = d_sorted.get();
  ep.experts = d_table.get();
  ep.format = MoeWeightFormat::BF16;
  ep.act = d_act.get();
  ep.slot_out = d_slot.get();
  ep.out = d_out.get();
  ep.ldo = H;
  ep.m = m;
  ep.top_k = K;
  ep.n_experts = E;
  ep.hidden = H;
  ep.inter = I;
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto step = [&] {
    ms::cuda::moe_route(cfg, rp, s);
    ms::cuda::moe_plan(pp, s);
    ms::cuda::moe_experts(ep, s);
  };
  step();
  CUDA_CHECK(cudaStreamSynchronize(s));
  const auto eager_out = d_out.download();
  const auto eager_ids = d_ids.download();

  d_out.upload(out0);
  d_ids.poison(0x7f);
  d_w.poison(0xff);
  d_act.poison(0xff);
  d_slot.poison(0xff);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  step();
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  size_t nodes = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_GE(nodes, 7u);  // memset + 2 routing kernels + 2 plan kernels + 3 expert kernels
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(d_ids.download(), eager_ids);
  EXPECT_EQ(d_out.download(), eager_out);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
