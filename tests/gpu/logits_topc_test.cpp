// kernels/cuda/sampling/logits_topc against the CPU reference (same candidates bit for bit, sums within
// 1e-5 relative: the device's expf and tree order), and the Engine on the CUDA executor with and without
// candidate summaries (the same greedy and seeded tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/logits_topc.h"
#include "kernels/cuda/sampling/logits_topc.h"
#include "model/builtin_model.h"
#include "runtime/cpu_executor.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/engine.h"

namespace ms {
namespace {

using kernels::cpu::kLogitsTopC;
using kernels::cpu::LogitsTopC;
constexpr float kInf = std::numeric_limits<float>::infinity();

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

// Row r's shape: r % 4 == 0 normal, 1 ties (values on a 0.5 grid), 2 mostly -inf, 3 peaked.
std::vector<float> make_rows(int64_t rows, int64_t vocab, int64_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(rows * stride), 12345.0f);  // padding past vocab: never read
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * stride;
    for (int64_t i = 0; i < vocab; ++i) {
      float v = nd(rng);
      if (r % 4 == 1) v = std::round(v * 2.0f) / 2.0f;
      if (r % 4 == 2 && rng() % 4 != 0) v = -kInf;
      row[i] = v;
    }
    if (r % 4 == 3) row[rng() % vocab] += 30.0f;
  }
  return x;
}

void check_rows(int64_t rows, int64_t vocab, int64_t stride, uint32_t seed, int nan_row = -1) {
  auto x = make_rows(rows, vocab, stride, seed);
  if (nan_row >= 0)
    x[static_cast<size_t>(nan_row * stride + vocab / 2)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> temps(static_cast<size_t>(rows));
  const float choices[] = {0.0f, 0.3f, 1.0f, 2.5f, 1e-6f};
  for (int64_t r = 0; r < rows; ++r) temps[static_cast<size_t>(r)] = choices[r % 5];
  std::vector<LogitsTopC> want(static_cast<size_t>(rows));
  kernels::cpu::LogitsTopCParams p;
  p.logits = x.data();
  p.stride = stride;
  p.temperature = temps.data();
  p.out = want.data();
  p.rows = rows;
  p.vocab = vocab;
  kernels::cpu::logits_topc(p);

  test::DeviceBuffer<float> dx(x);
  test::DeviceBuffer<float> dt(temps);
  // Both launch shapes: a block per row, and rows cut over several blocks then merged (with a workspace).
  test::DeviceBuffer<LogitsTopC> dws(cuda::logits_topc_workspace_bytes(rows) / sizeof(LogitsTopC));
  for (bool split : {false, true}) {
    test::DeviceBuffer<LogitsTopC> dout(static_cast<size_t>(rows));  // poisoned: 0xff bytes
    kernels::cpu::LogitsTopCParams q = p;
    q.logits = dx.get();
    q.temperature = dt.get();
    q.out = dout.get();
    if (split) {
      cuda::logits_topc(q, nullptr, dws.get(), rows);
    } else {
      cuda::logits_topc(q, nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = dout.download();
    for (int64_t r = 0; r < rows; ++r) {
      const LogitsTopC& g = got[static_cast<size_t>(r)];
      const LogitsTopC& w = want[static_cast<size_t>(r)];
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " row " << r << " of " << rows
                                      << (split ? " (split rows)" : " (a block per row)"));
      ASSERT_EQ(g.count, w.count);
      ASSERT_EQ(g.nan_count, w.nan_count);
      EXPECT_EQ(g.reserved, 0);
      if (w.nan_count > 0) continue;  // the rest is unspecified for such rows
      EXPECT_TRUE(same_bits(g.max, w.max) || (g.max == 0.0f && w.max == 0.0f)) << g.max << " vs " << w.max;
      for (int j = 0; j < kLogitsTopC; ++j) {
        ASSERT_EQ(g.token[j], w.token[j]) << "slot " << j;
        ASSERT_TRUE(same_bits(g.logit[j], w.logit[j]))
            << "slot " << j << ": " << g.logit[j] << " vs " << w.logit[j];
      }
      if (!std::isfinite(w.max))
        continue;  // every entry -inf: the sums are NaN (the sampler refuses the row)
      ASSERT_TRUE(std::isfinite(g.sum_exp));
      EXPECT_NEAR(g.sum_exp, w.sum_exp, 1e-5 * w.sum_exp);
      ASSERT_TRUE(std::isfinite(g.sum_exp_t));
      EXPECT_NEAR(g.sum_exp_t, w.sum_exp_t, 1e-5 * w.sum_exp_t);
    }
  }
}

TEST(LogitsTopC, MatchesTheCpuReference) {
  MS_REQUIRE_GPU();
  for (int64_t vocab : {154880, 1000, 129, 128, 7, 1})
    for (int64_t rows : {1, 64, 256}) {
      if (vocab == 154880 && rows == 256) continue;  // below, once, to keep the reference's time down
      check_rows(rows, vocab, vocab, static_cast<uint32_t>(vocab * 7 + rows));
    }
  check_rows(256, 154880, 154880, 3);
  check_rows(5, 1000, 1003, 4);  // rows further apart than the vocabulary
}

TEST(LogitsTopC, CountsNaN) {
  MS_REQUIRE_GPU();
  check_rows(8, 1000, 1000, 5, 3);
}

TEST(LogitsTopC, EqualRowsTakeTheLowestIds) {
  MS_REQUIRE_GPU();
  const int64_t vocab = 154880;
  std::vector<float> x(static_cast<size_t>(vocab), 0.25f);
  x[100000] = -0.0f;
  std::vector<float> t = {1.0f};
  test::DeviceBuffer<float> dx(x), dt(t);
  test::DeviceBuffer<LogitsTopC> dout(1);
  kernels::cpu::LogitsTopCParams q;
  q.logits = dx.get();
  q.stride = vocab;
  q.temperature = dt.get();
  q.out = dout.get();
  q.rows = 1;
  q.vocab = vocab;
  cuda::logits_topc(q, nullptr);
  const auto g = dout.download();
  for (int j = 0; j < kLogitsTopC; ++j) EXPECT_EQ(g[0].token[j], j);
  EXPECT_NEAR(g[0].sum_exp, static_cast<double>(vocab - 1) + std::exp(-0.25), 1e-6 * vocab);
  // The row cut over several blocks: the ties across segments still go to the lowest ids.
  test::DeviceBuffer<LogitsTopC> dws(cuda::logits_topc_workspace_bytes(1) / sizeof(LogitsTopC));
  test::DeviceBuffer<LogitsTopC> dsplit(1);
  q.out = dsplit.get();
  cuda::logits_topc(q, nullptr, dws.get(), 1);
  const auto h = dsplit.download();
  for (int j = 0; j < kLogitsTopC; ++j) EXPECT_EQ(h[0].token[j], j);
  EXPECT_EQ(h[0].count, kLogitsTopC);
  EXPECT_NEAR(h[0].sum_exp, static_cast<double>(vocab - 1) + std::exp(-0.25), 1e-6 * vocab);
}

// The Engine on the CUDA executor: the same tokens with and without summaries, greedy and seeded.
std::vector<std::vector<runtime::GeneratedToken>> engine_tokens(const model::Model& m, bool summaries,
                                                                runtime::StepTimes* times) {
  runtime::cuda::CudaExecutorOptions opt;
  opt.quiet = true;
  runtime::ExecutorConfig c = runtime::executor_config_for(m, 16, 256 * 16, kv::KvCacheDType::F32, 8, 512, 0);
  auto ex = std::make_unique<runtime::cuda::CudaExecutor>(m, c, opt);
  runtime::EngineConfig ec;
  ec.max_running = 8;
  ec.max_prefill_tokens = 512;
  ec.enable_prefix_cache = false;
  ec.logits_summaries = summaries;
  ec.logits_summary_min_rows = 1;  // every step, even of one row
  runtime::Engine e(std::move(ex), ec);
  struct Case {
    float t;
    int k;
    float top_p, min_p;
    int logprobs;
  };
  const Case cases[] = {{0.0f, 0, 1.0f, 0.0f, 3},    {0.8f, 20, 1.0f, 0.0f, 0}, {1.0f, 0, 0.9f, 0.0f, 5},
                        {0.6f, 0, 1.0f, 0.1f, -1},   {1.0f, 0, 1.0f, 0.0f, 2},  {1.5f, 0, 0.95f, 0.02f, 1},
                        {0.7f, 300, 0.8f, 0.0f, -1}, {0.0f, 0, 1.0f, 0.0f, 20}};
  std::map<uint64_t, size_t> which;
  for (size_t i = 0; i < std::size(cases); ++i) {
    runtime::Request r;
    r.prompt_ids = {72, 101, 108, 108, 111, static_cast<int32_t>(10 + i)};
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.sampling.temperature = cases[i].t;
    r.sampling.top_k = cases[i].k;
    r.sampling.top_p = cases[i].top_p;
    r.sampling.min_p = cases[i].min_p;
    r.sampling.top_logprobs = cases[i].logprobs;
    r.sampling.seed = 100 + i;
    which[e.submit(r)] = i;
  }
  std::vector<std::vector<runtime::GeneratedToken>> out(std::size(cases));
  runtime::StepTimes sum;
  while (e.has_work()) {
    for (auto& o : e.step()) {
      EXPECT_NE(o.finish, runtime::FinishReason::Error) << o.error;
      for (auto& g : o.tokens) out[which[o.request_id]].push_back(g);
    }
    sum.rows_summary += e.last_step_times().rows_summary;
    sum.rows_full += e.last_step_times().rows_full;
    sum.rows_refetched += e.last_step_times().rows_refetched;
  }
  if (times) *times = sum;
  return out;
}

TEST(LogitsTopC, EngineTokensAreTheSameWithAndWithoutSummaries) {
  MS_REQUIRE_GPU();
  auto m = model::make_builtin_model();
  runtime::StepTimes on, off;
  const auto a = engine_tokens(*m, true, &on);
  const auto b = engine_tokens(*m, false, &off);
  std::printf("[ measured ] summaries on: %d rows from summaries, %d full, %d refetched\n", on.rows_summary,
              on.rows_full, on.rows_refetched);
  EXPECT_GT(on.rows_summary, 0);
  EXPECT_EQ(off.rows_summary, 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size()) << "request " << r;
    for (size_t i = 0; i < a[r].size(); ++i) {
      EXPECT_EQ(a[r][i].token, b[r][i].token) << "request " << r << " token " << i;
      EXPECT_NEAR(a[r][i].logprob, b[r][i].logprob, 1e-5);
      ASSERT_EQ(a[r][i].top_logprobs.size(), b[r][i].top_logprobs.size());
      for (size_t j = 0; j < a[r][i].top_logprobs.size(); ++j) {
        EXPECT_EQ(a[r][i].top_logprobs[j].token, b[r][i].top_logprobs[j].token);
        EXPECT_NEAR(a[r][i].top_logprobs[j].logprob, b[r][i].top_logprobs[j].logprob, 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace ms
