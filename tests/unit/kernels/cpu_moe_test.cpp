// The one-region CPU MoE kernel against the per-expert sequence it replaced (gather, gate and up GEMMs,
// SiLU-and-mul, down GEMM, weighted add in ascending expert order), bit for bit: same linear kernels, same
// summation order. Random bf16 experts, unused slots (id -1), a hidden size with a vector tail, a scratch
// that holds every slot (one pass) and one that holds only m rows (several passes), every instruction set
// here; and a token's result alone equals its result inside the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "quant/float_formats.h"

namespace {

using namespace ms::kernels::cpu;

constexpr int kExperts = 7, kTopK = 3;
constexpr int64_t kHidden = 40, kInter = 24;

struct Experts {
  std::vector<std::vector<uint16_t>> data;  // per expert: gate [inter, hidden], up, down [hidden, inter]
  std::vector<WeightView> gate, up, down;
};

WeightView bf16_view(const std::vector<uint16_t>& w, int64_t rows, int64_t cols) {
  WeightView v;
  v.format = WeightFormat::BF16;
  v.rows = rows;
  v.cols = cols;
  v.data = w.data();
  return v;
}

Experts make_experts(std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.5f);
  Experts ex;
  ex.data.resize(3 * kExperts);
  for (auto& d : ex.data) {
    d.resize(static_cast<size_t>(kHidden * kInter));
    for (auto& v : d) v = ms::quant::f32_to_bf16(nd(rng));
  }
  for (int e = 0; e < kExperts; ++e) {
    ex.gate.push_back(bf16_view(ex.data[3 * e], kInter, kHidden));
    ex.up.push_back(bf16_view(ex.data[3 * e + 1], kInter, kHidden));
    ex.down.push_back(bf16_view(ex.data[3 * e + 2], kHidden, kInter));
  }
  return ex;
}

struct Routing {
  std::vector<int32_t> ids, offsets, order;
  std::vector<float> weights;
};

// Distinct experts per token, the last slot of every third token unused; grouped as ops::moe_experts does.
Routing route(int64_t m, std::mt19937& rng) {
  Routing r;
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);
  for (int64_t t = 0; t < m; ++t) {
    std::vector<int32_t> pool(kExperts);
    for (int e = 0; e < kExperts; ++e) pool[static_cast<size_t>(e)] = e;
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int k = 0; k < kTopK; ++k) {
      r.ids.push_back(k == kTopK - 1 && t % 3 == 2 ? -1 : pool[static_cast<size_t>(k)]);
      r.weights.push_back(ud(rng));
    }
  }
  r.offsets.assign(kExperts + 1, 0);
  for (int32_t e : r.ids)
    if (e >= 0) ++r.offsets[static_cast<size_t>(e) + 1];
  for (int e = 0; e < kExperts; ++e) r.offsets[e + 1] += r.offsets[e];
  std::vector<int32_t> cursor(r.offsets.begin(), r.offsets.end() - 1);
  r.order.resize(static_cast<size_t>(r.offsets[kExperts]));
  for (size_t s = 0; s < r.ids.size(); ++s)
    if (r.ids[s] >= 0)
      r.order[static_cast<size_t>(cursor[static_cast<size_t>(r.ids[s])]++)] = static_cast<int32_t>(s);
  return r;
}

// The sequence the kernel replaced, one expert after another.
void reference(const Experts& ex, const Routing& r, const std::vector<float>& x, int64_t m,
               std::vector<float>& out) {
  for (int e = 0; e < kExperts; ++e) {
    const int64_t cnt = r.offsets[e + 1] - r.offsets[e];
    if (cnt == 0) continue;
    std::vector<float> xs(static_cast<size_t>(cnt * kHidden)), gu(static_cast<size_t>(cnt * 2 * kInter));
    std::vector<float> act(static_cast<size_t>(cnt * kInter)), ys(static_cast<size_t>(cnt * kHidden));
    for (int64_t i = 0; i < cnt; ++i) {
      const int64_t tok = r.order[static_cast<size_t>(r.offsets[e] + i)] / kTopK;
      std::copy(x.begin() + tok * kHidden, x.begin() + (tok + 1) * kHidden, xs.begin() + i * kHidden);
    }
    LinearParams p;
    p.x = xs.data();
    p.x_stride = kHidden;
    p.m = cnt;
    p.n = kInter;
    p.y_stride = 2 * kInter;
    p.w = ex.gate[static_cast<size_t>(e)];
    p.y = gu.data();
    linear(p);
    p.w = ex.up[static_cast<size_t>(e)];
    p.y = gu.data() + kInter;
    linear(p);
    for (int64_t i = 0; i < cnt; ++i)
      for (int64_t j = 0; j < kInter; ++j) {
        const float g = gu[static_cast<size_t>(i * 2 * kInter + j)],
                    u = gu[static_cast<size_t>(i * 2 * kInter + kInter + j)];
        act[static_cast<size_t>(i * kInter + j)] = g / (1.0f + std::exp(-g)) * u;
      }
    p.x = act.data();
    p.x_stride = kInter;
    p.n = kHidden;
    p.w = ex.down[static_cast<size_t>(e)];
    p.y = ys.data();
    p.y_stride = kHidden;
    linear(p);
    for (int64_t i = 0; i < cnt; ++i) {
      const int32_t slot = r.order[static_cast<size_t>(r.offsets[e] + i)];
      const int64_t tok = slot / kTopK;
      for (int64_t c = 0; c < kHidden; ++c)
        out[static_cast<size_t>(tok * kHidden + c)] +=
            r.weights[static_cast<size_t>(slot)] * ys[static_cast<size_t>(i * kHidden + c)];
    }
  }
}

std::vector<float> run(const Experts& ex, const Routing& r, const std::vector<float>& x, int64_t m,
                       int64_t scratch_rows, const std::vector<float>& out0) {
  std::vector<float> xs(static_cast<size_t>(scratch_rows * kHidden), NAN),
      gu(static_cast<size_t>(scratch_rows * 2 * kInter), NAN);
  std::vector<float> act(static_cast<size_t>(scratch_rows * kInter), NAN),
      ys(static_cast<size_t>(scratch_rows * kHidden), NAN);
  std::vector<float> out = out0;
  MoeExpertsParams p;
  p.x = x.data();
  p.topk_ids = r.ids.data();
  p.topk_weights = r.weights.data();
  p.offsets = r.offsets.data();
  p.order = r.order.data();
  p.gate = ex.gate.data();
  p.up = ex.up.data();
  p.down = ex.down.data();
  p.m = m;
  p.hidden = kHidden;
  p.inter = kInter;
  p.top_k = kTopK;
  p.n_experts = kExperts;
  p.xs = xs.data();
  p.gate_up = gu.data();
  p.act = act.data();
  p.ys = ys.data();
  p.scratch_rows = scratch_rows;
  p.out = out.data();
  moe_experts(p);
  return out;
}

TEST(CpuMoe, OneRegionEqualsPerExpertSequenceBitForBit) {
  std::vector<LinearIsa> isas{LinearIsa::Reference};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas.push_back(LinearIsa::Avx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    isas.push_back(LinearIsa::Avx512);
  std::mt19937 rng(7);
  const Experts ex = make_experts(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (LinearIsa isa : isas) {
    force_linear_isa(isa);
    for (int64_t m : {1, 2, 5, 9, 17}) {
      SCOPED_TRACE(::testing::Message() << linear_isa_name(isa) << " m=" << m);
      const Routing r = route(m, rng);
      std::vector<float> x(static_cast<size_t>(m * kHidden)), out0(x.size());
      for (auto& v : x) v = nd(rng);
      for (auto& v : out0) v = nd(rng);
      std::vector<float> want = out0;
      reference(ex, r, x, m, want);
      for (int64_t rows : {m * kTopK, m}) {
        const std::vector<float> got = run(ex, r, x, m, rows, out0);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << "scratch rows " << rows;
      }
      // Token 0 alone, with its own routing: the same bits as inside the batch.
      Routing r1;
      r1.ids.assign(r.ids.begin(), r.ids.begin() + kTopK);
      r1.weights.assign(r.weights.begin(), r.weights.begin() + kTopK);
      r1.offsets.assign(kExperts + 1, 0);
      for (int32_t e : r1.ids)
        if (e >= 0) ++r1.offsets[static_cast<size_t>(e) + 1];
      for (int e = 0; e < kExperts; ++e) r1.offsets[e + 1] += r1.offsets[e];
      std::vector<int32_t> cur(r1.offsets.begin(), r1.offsets.end() - 1);
      r1.order.resize(static_cast<size_t>(r1.offsets[kExperts]));
      for (int k = 0; k < kTopK; ++k)
        if (r1.ids[k] >= 0) r1.order[static_cast<size_t>(cur[static_cast<size_t>(r1.ids[k])]++)] = k;
      const std::vector<float> x1(x.begin(), x.begin() + kHidden), o1(out0.begin(), out0.begin() + kHidden);
      const std::vector<float> alone = run(ex, r1, x1, 1, kTopK, o1);
      ASSERT_EQ(std::memcmp(alone.data(), want.data(), kHidden * sizeof(float)), 0);
      for (float v : want) ASSERT_TRUE(std::isfinite(v));
    }
  }
  clear_forced_linear_isa();
}

}  // namespace
