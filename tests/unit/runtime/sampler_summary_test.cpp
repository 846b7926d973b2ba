// The candidate-summary path of the Sampler against its full-row path: on random rows (ties, -inf entries,
// flat and peaked rows) and many sampling settings, wherever sample_summary decides, the token, the logprob
// and the top logprobs are sample()'s bit for bit (the summary comes from the CPU reference, whose sums are
// the sampler's own); where it cannot, it says so and leaves the state alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/logits_topc.h"
#include "model/builtin_model.h"
#include "runtime/cpu_executor.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace ms {
namespace {

using kernels::cpu::kLogitsTopC;
using kernels::cpu::LogitsTopC;
using runtime::GeneratedToken;
using runtime::Sampler;
using runtime::SamplerState;
using runtime::SamplingParams;

constexpr float kInf = std::numeric_limits<float>::infinity();

LogitsTopC summarise(const std::vector<float>& row, float temperature) {
  LogitsTopC s;
  kernels::cpu::LogitsTopCParams p;
  p.logits = row.data();
  p.stride = static_cast<int64_t>(row.size());
  p.temperature = &temperature;
  p.out = &s;
  p.rows = 1;
  p.vocab = static_cast<int64_t>(row.size());
  kernels::cpu::logits_topc(p);
  return s;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

enum class Shape { Normal, Peaked, Ties, NegInf, Flat };

std::vector<float> make_row(int vocab, Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, shape == Shape::Peaked ? 4.0f : 2.0f);
  std::vector<float> x(static_cast<size_t>(vocab));
  for (auto& v : x) v = nd(rng);
  if (shape == Shape::Peaked) x[rng() % vocab] += 25.0f;
  if (shape == Shape::Ties)
    for (auto& v : x) v = std::round(v * 2.0f) / 2.0f;  // many equal values, -0 and +0 among them
  if (shape == Shape::NegInf)
    for (int i = 0; i < vocab; ++i)
      if (rng() % 3 != 0) x[static_cast<size_t>(i)] = -kInf;
  if (shape == Shape::Flat)
    for (auto& v : x) v = 1.0f + 1e-3f * std::round(v);
  return x;
}

struct Outcome {
  int decided = 0, refused = 0;
};

// Draws `draws` tokens from one row both ways; every decided draw must equal the full row's. Returns how many
// the summary decided.
Outcome compare(Sampler& s, const std::vector<float>& row, const SamplingParams& p, int draws) {
  const LogitsTopC sum = summarise(row, p.temperature);
  SamplerState full = s.new_state(p, {});
  SamplerState cand = s.new_state(p, {});
  Outcome o;
  for (int d = 0; d < draws; ++d) {
    GeneratedToken want, got;
    try {
      want = s.sample(row, p, full);
    } catch (const Error& e) {
      // A row the full path refuses (no finite maximum): the summary refuses it too, with the same words.
      if (!s.summary_may_decide(p)) return o;
      try {
        s.sample_summary(sum, p, cand, got);
        ADD_FAILURE() << "the summary sampled a row the full path refuses: " << e.message();
      } catch (const Error& e2) {
        EXPECT_EQ(e2.message().substr(0, 30), e.message().substr(0, 30));
      }
      return o;
    }
    const int64_t step = cand.step();
    if (!s.sample_summary(sum, p, cand, got)) {
      EXPECT_EQ(cand.step(), step) << "a refused summary advanced the stream";
      s.sample(row, p, cand);  // the engine's fallback: the full row
      ++o.refused;
      continue;
    }
    ++o.decided;
    EXPECT_EQ(got.token, want.token) << "draw " << d << " T " << p.temperature << " top_k " << p.top_k
                                     << " top_p " << p.top_p << " min_p " << p.min_p;
    EXPECT_TRUE(same_bits(got.logprob, want.logprob)) << got.logprob << " vs " << want.logprob;
    EXPECT_EQ(got.top_logprobs.size(), want.top_logprobs.size());
    for (size_t i = 0; i < std::min(got.top_logprobs.size(), want.top_logprobs.size()); ++i) {
      EXPECT_EQ(got.top_logprobs[i].token, want.top_logprobs[i].token);
      EXPECT_TRUE(same_bits(got.top_logprobs[i].logprob, want.top_logprobs[i].logprob));
    }
    EXPECT_EQ(cand.step(), full.step());
  }
  return o;
}

TEST(LogitsTopCReference, CandidatesAreTheBestFirstWithTiesToTheLowestId) {
  for (int vocab : {7, 128, 1000}) {
    for (Shape sh : {Shape::Normal, Shape::Ties, Shape::NegInf}) {
      const auto row = make_row(vocab, sh, 17u + static_cast<uint64_t>(vocab));
      const LogitsTopC s = summarise(row, 0.7f);
      const int count = std::min(vocab, kLogitsTopC);
      ASSERT_EQ(s.count, count);
      std::vector<int32_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      for (int j = 0; j < kLogitsTopC; ++j) {
        if (j < count) {
          EXPECT_EQ(s.token[j], ids[static_cast<size_t>(j)]) << "vocab " << vocab << " slot " << j;
          EXPECT_TRUE(same_bits(s.logit[j], row[ids[static_cast<size_t>(j)]]));
        } else {
          EXPECT_EQ(s.token[j], -1);
          EXPECT_EQ(s.logit[j], -kInf);
        }
      }
      EXPECT_EQ(s.max, row[ids[0]]);
      EXPECT_EQ(s.nan_count, 0);
    }
  }
}

TEST(SamplerSummary, DecidesExactlyAsTheFullRowWhereverItDecides) {
  int decided_top_p = 0, decided_min_p = 0, decided_total = 0;
  for (int vocab : {7, 129, 1000}) {
    Sampler s(vocab, [] {
      runtime::SamplerOptions o;
      o.global_seed = 5;
      return o;
    }());
    uint64_t seed = 1;
    for (Shape sh : {Shape::Normal, Shape::Peaked, Shape::Ties, Shape::NegInf, Shape::Flat}) {
      const auto row = make_row(vocab, sh, 1000u * static_cast<uint64_t>(vocab) + static_cast<uint64_t>(sh));
      for (float t : {0.0f, 5e-6f, 0.05f, 0.7f, 1.0f, 3.0f, 1e4f}) {
        for (int k : {0, 1, 5, 64, 128, 129}) {
          for (float top_p : {1.0f, 0.999f, 0.9f, 0.5f}) {
            for (float min_p : {0.0f, 0.05f, 0.3f}) {
              SamplingParams p;
              p.temperature = t;
              p.top_k = k;
              p.top_p = top_p;
              p.min_p = min_p;
              p.seed = seed++;
              p.top_logprobs =
                  static_cast<int>(seed % 4 == 0 ? -1 : (seed % 4 == 1 ? 0 : (seed % 4 == 2 ? 5 : 20)));
              const bool may = s.summary_may_decide(p);
              const bool greedy = t < 1e-5f;
              const bool use_k = k > 0 && k < vocab;
              EXPECT_EQ(may, greedy || (use_k ? k <= kLogitsTopC : (top_p < 1.0f || min_p > 0.0f)));
              const Outcome o = compare(s, row, p, 6);
              if (!may) {
                EXPECT_EQ(o.decided, 0);
              }
              // Greedy and top-k within the candidates always decide.
              if (greedy || (use_k && k <= kLogitsTopC)) {
                EXPECT_EQ(o.refused, 0);
              }
              decided_total += o.decided;
              if (!greedy && !use_k && top_p < 1.0f) decided_top_p += o.decided;
              if (!greedy && !use_k && top_p == 1.0f && min_p > 0.0f) decided_min_p += o.decided;
            }
          }
        }
      }
    }
  }
  // Not vacuous: the top-p and min-p branches decide on many rows.
  EXPECT_GT(decided_top_p, 200);
  EXPECT_GT(decided_min_p, 100);
  EXPECT_GT(decided_total, 5000);
}

TEST(SamplerSummary, NeedsTheFullRowWhenTheCandidatesCannotDecide) {
  const int vocab = 1000;
  Sampler s(vocab);
  const std::vector<float> flat(vocab, 0.5f);
  const LogitsTopC sum = summarise(flat, 1.0f);
  GeneratedToken out;
  SamplingParams p;
  p.seed = 3;
  // Top-p 0.9 of a flat row needs 900 tokens.
  p.top_p = 0.9f;
  SamplerState st = s.new_state(p, {});
  EXPECT_FALSE(s.sample_summary(sum, p, st, out));
  EXPECT_EQ(st.step(), 0);
  // Min-p keeps every token of a flat row.
  p.top_p = 1.0f;
  p.min_p = 0.5f;
  EXPECT_FALSE(s.sample_summary(sum, p, st, out));
  // Plain sampling, top_k past C, penalties, logit_bias: never.
  p.min_p = 0.0f;
  EXPECT_FALSE(s.summary_may_decide(p));
  p.top_k = kLogitsTopC + 1;
  EXPECT_FALSE(s.summary_may_decide(p));
  p.top_k = 10;
  EXPECT_TRUE(s.summary_may_decide(p));
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(s.summary_may_decide(p));
  p.presence_penalty = 0.0f;
  p.logit_bias = {{3, 1.0f}};
  EXPECT_FALSE(s.summary_may_decide(p));
  // A top-p target within the margin of a running sum: refused rather than guessed.
  std::vector<float> two(vocab, -kInf);
  two[0] = 0.0f;
  two[1] = 0.0f;  // masses 1/2, 1/2: the walk reaches exactly top_p = 0.5 after one token
  const LogitsTopC s2 = summarise(two, 1.0f);
  SamplingParams q;
  q.top_p = 0.5f;
  q.seed = 4;
  SamplerState st2 = s.new_state(q, {});
  EXPECT_FALSE(s.sample_summary(s2, q, st2, out));
}

TEST(SamplerSummary, RefusesBadRowsAsTheFullRowDoes) {
  const int vocab = 300;
  Sampler s(vocab);
  SamplingParams p;
  p.temperature = 0.0f;
  SamplerState st = s.new_state(p, {});
  GeneratedToken out;
  auto row = make_row(vocab, Shape::Normal, 9);
  row[200] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(
      {
        try {
          s.sample_summary(summarise(row, 0.0f), p, st, out);
        } catch (const Error& e) {
          EXPECT_NE(e.message().find("NaN"), std::string::npos) << e.message();
          throw;
        }
      },
      Error);
  std::vector<float> neg(vocab, -kInf);
  EXPECT_THROW(s.sample_summary(summarise(neg, 0.0f), p, st, out), Error);
  EXPECT_THROW(s.sample(neg, p, st), Error);
}

// An executor over a CpuExecutor that answers run_rows as the CUDA executor does, with the CPU reference: the
// Engine's choice of rows, its fallback fetches and its sampling run on the CPU.
struct SummaryCounts {
  int64_t summarised = 0, refetched = 0;
};

class SummaryExecutor final : public runtime::Executor {
 public:
  SummaryExecutor(std::unique_ptr<runtime::Executor> inner, SummaryCounts& counts)
      : inner_(std::move(inner)), counts_(counts) {}
  std::string_view name() const override { return "summary-test"; }
  Device device() const override { return inner_->device(); }
  runtime::KvCapacity kv_capacity() const override { return inner_->kv_capacity(); }
  const model::Model& model() const override { return inner_->model(); }
  const runtime::ExecutorConfig& config() const override { return inner_->config(); }
  Tensor run(const kv::ForwardBatch& b, const model::StepRouting& r, profiler::OpSink* sink) override {
    return inner_->run(b, r, sink);
  }
  bool supports_summaries() const override { return true; }
  void run_rows(const kv::ForwardBatch& b, const runtime::LogitsRequest& req, runtime::StepLogits& out,
                const model::StepRouting& r, profiler::OpSink* sink) override {
    const Tensor all = inner_->run(b, r, sink);
    const int64_t rows = all.shape()[0], vocab = all.shape()[1];
    last_.assign(all.data<float>(), all.data<float>() + rows * vocab);
    vocab_ = vocab;
    summaries_.assign(static_cast<size_t>(rows), LogitsTopC{});
    full_.clear();
    out.full_index.assign(static_cast<size_t>(rows), -1);
    int32_t n_full = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const float* x = last_.data() + i * vocab;
      if (!req.summary.empty() && req.summary[i]) {
        kernels::cpu::LogitsTopCParams p;
        p.logits = x;
        p.stride = vocab;
        p.temperature = &req.temperature[i];
        p.out = &summaries_[static_cast<size_t>(i)];
        p.rows = 1;
        p.vocab = vocab;
        kernels::cpu::logits_topc(p);
        ++counts_.summarised;
      } else {
        full_.insert(full_.end(), x, x + vocab);
        out.full_index[i] = n_full++;
      }
    }
    out.full = Tensor::borrow(full_.data(), {n_full, vocab}, DType::F32);
    out.summaries = summaries_;
  }
  Tensor fetch_rows(std::span<const int32_t> rows) override {
    fetched_.clear();
    for (int32_t r : rows)
      fetched_.insert(fetched_.end(), last_.begin() + r * vocab_, last_.begin() + (r + 1) * vocab_);
    counts_.refetched += static_cast<int64_t>(rows.size());
    return Tensor::borrow(fetched_.data(), {static_cast<int64_t>(rows.size()), vocab_}, DType::F32);
  }

 private:
  std::unique_ptr<runtime::Executor> inner_;
  SummaryCounts& counts_;
  std::vector<float> last_, full_, fetched_;
  std::vector<LogitsTopC> summaries_;
  int64_t vocab_ = 0;
};

TEST(SamplerSummary, EngineGivesTheSameTokensWithAndWithoutSummaries) {
  const std::shared_ptr<const model::Model> m = model::make_builtin_model();
  runtime::EngineConfig cfg;
  cfg.kv_cache_tokens = 4096;
  cfg.page_size = 16;
  cfg.sampler.global_seed = 11;
  std::vector<runtime::Request> reqs;
  auto add = [&](float t, int k, float top_p, float min_p, int logprobs, uint64_t seed) {
    runtime::Request r;
    r.prompt_ids = {72, 101, 108, 108, 111, static_cast<int32_t>(seed % 200)};
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.sampling.temperature = t;
    r.sampling.top_k = k;
    r.sampling.top_p = top_p;
    r.sampling.min_p = min_p;
    r.sampling.top_logprobs = logprobs;
    r.sampling.seed = seed;
    reqs.push_back(r);
  };
  add(0.0f, 0, 1.0f, 0.0f, 3, 1);     // greedy
  add(0.8f, 20, 1.0f, 0.0f, 0, 2);    // top-k
  add(1.0f, 0, 0.9f, 0.0f, 5, 3);     // top-p
  add(0.6f, 0, 1.0f, 0.1f, -1, 4);    // min-p
  add(1.0f, 0, 1.0f, 0.0f, 2, 5);     // plain: always full
  add(1.5f, 0, 0.95f, 0.02f, 1, 6);   // top-p and min-p
  add(0.7f, 300, 0.8f, 0.0f, -1, 7);  // top_k past C: full
  auto run = [&](bool summaries, SummaryCounts& counts) {
    runtime::EngineConfig c = cfg;
    c.logits_summaries = summaries;
    c.logits_summary_min_rows = 1;  // every step, even of one row
    auto exec = std::make_unique<SummaryExecutor>(runtime::make_cpu_executor(m, c), counts);
    runtime::Engine e(std::move(exec), c);
    std::map<uint64_t, std::vector<runtime::GeneratedToken>> toks;
    std::vector<uint64_t> ids;
    for (const auto& r : reqs) ids.push_back(e.submit(r));
    while (e.has_work())
      for (auto& o : e.step()) {
        EXPECT_NE(o.finish, runtime::FinishReason::Error) << o.error;
        for (auto& t : o.tokens) toks[o.request_id].push_back(t);
      }
    std::vector<std::vector<runtime::GeneratedToken>> out;
    for (uint64_t id : ids) out.push_back(toks[id]);
    return out;
  };
  SummaryCounts with, without;
  const auto a = run(true, with);
  const auto b = run(false, without);
  EXPECT_GT(with.summarised, 0);
  EXPECT_EQ(without.summarised, 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size()) << "request " << r;
    for (size_t i = 0; i < a[r].size(); ++i) {
      EXPECT_EQ(a[r][i].token, b[r][i].token) << "request " << r << " token " << i;
      EXPECT_TRUE(same_bits(a[r][i].logprob, b[r][i].logprob));
      ASSERT_EQ(a[r][i].top_logprobs.size(), b[r][i].top_logprobs.size());
      for (size_t j = 0; j < a[r][i].top_logprobs.size(); ++j)
        EXPECT_EQ(a[r][i].top_logprobs[j].token, b[r][i].top_logprobs[j].token);
    }
  }
}

}  // namespace
}  // namespace ms
