// mla_absorb_q against a double-precision reference on random inputs, on each instruction set this CPU has:
// q_cat[i, h, :r] = sum_d q_nope[i, h, d] W_UK_h[d, :], q_cat[i, h, r:] = q_pe[i, h, :], for bf16 kv_b with a
// kv_lora_rank that leaves a tail after the 128-column blocks and a partial vector (200 = 128 + 4 x 16 + 8).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/mla.h"
#include "quant/float_formats.h"

namespace {

using namespace ms::kernels::cpu;

TEST(CpuMlaAbsorbQ, Bf16MatchesDoubleReferenceOnEveryIsa) {
  const int64_t m = 3, heads = 3, nope = 7, rope = 3, v = 5, r = 200;
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> kv_b(static_cast<size_t>(heads * (nope + v) * r));
  for (auto& x : kv_b) x = ms::quant::f32_to_bf16(nd(rng));
  std::vector<float> q(static_cast<size_t>(m * heads * (nope + rope)));
  for (auto& x : q) x = nd(rng);
  std::vector<LinearIsa> isas{LinearIsa::Reference};
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    isas.push_back(LinearIsa::Avx512);
  for (LinearIsa isa : isas) {
    std::vector<float> out(static_cast<size_t>(m * heads * (r + rope)),
                           std::numeric_limits<float>::quiet_NaN());
    MlaAbsorbQParams p;
    p.q = q.data();
    p.kv_b.format = WeightFormat::BF16;
    p.kv_b.rows = heads * (nope + v);
    p.kv_b.cols = r;
    p.kv_b.data = kv_b.data();
    p.q_cat = out.data();
    p.m = m;
    p.heads = heads;
    p.nope = nope;
    p.rope = rope;
    p.v = v;
    p.kv_lora_rank = r;
    force_linear_isa(isa);
    mla_absorb_q(p);
    clear_forced_linear_isa();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        const float* qi = q.data() + (i * heads + h) * (nope + rope);
        const float* got = out.data() + (i * heads + h) * (r + rope);
        for (int64_t c = 0; c < r; ++c) {
          double want = 0, mag = 0;
          for (int64_t d = 0; d < nope; ++d) {
            const double t = static_cast<double>(qi[d]) *
                             ms::quant::bf16_to_f32(kv_b[static_cast<size_t>((h * (nope + v) + d) * r + c)]);
            want += t;
            mag += std::fabs(t);
          }
          ASSERT_NEAR(got[c], want, 1e-6 * static_cast<double>(nope) * mag + 1e-6)
              << linear_isa_name(isa) << " token " << i << " head " << h << " col " << c;
        }
        for (int64_t c = 0; c < rope; ++c)
          ASSERT_EQ(got[r + c], qi[nope + c]) << linear_isa_name(isa) << " rope col " << c;
      }
  }
}

}  // namespace
