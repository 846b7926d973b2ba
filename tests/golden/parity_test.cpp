// Golden parity against Hugging Face transformers (fixtures in tests/data/golden, made by tools/golden on the
// CPU in float32 from bf16 weights).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "golden_fixture.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kv/forward_batch.h"
#include "kv/kv_pool.h"
#include "model/checkpoint_source.h"
#include "model/weight_loader.h"
#include "quant/float_formats.h"
#include "quant/nvfp4.h"
#include "runtime/engine.h"
#include "test_executor.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

using test::Fixture;
using test::load_fixture;

using test::expected_logits;

// max |a - b| / max |b| over rows [r0, r1).
double rel_err(const float* got, const Tensor& want, int64_t r0, int64_t r1, int64_t V) {
  double num = 0, den = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t v = 0; v < V; ++v) {
      const double w = want.data<float>()[r * V + v];
      num = std::max(num, std::fabs(got[(r - r0) * V + v] - w));
      den = std::max(den, std::fabs(w));
    }
  return num / den;
}

// Logits of every position of `ids`, in one prefill or (decode) prompt prefill then one token per step.
std::vector<float> run(model::Model& m, const std::vector<int32_t>& ids, size_t prompt_len, bool decode,
                       kv::KvCacheDType dt) {
  test::ExecPool pool(m, 8, 64, dt);
  std::vector<int32_t> pages;
  EXPECT_TRUE(pool.allocator().allocate(pool.pages_for(static_cast<int64_t>(ids.size())), pages));
  std::vector<float> out;
  const int64_t V = m.config().vocab_size;
  size_t start = 0;
  while (start < ids.size()) {
    const size_t n = !decode ? ids.size() : (start == 0 ? prompt_len : 1);
    kv::ForwardBatchBuilder bb(64);
    bb.add_sequence(pages, static_cast<int32_t>(start), ids.data() + start, static_cast<int32_t>(n), false);
    kv::ForwardBatch b = bb.finish();
    for (size_t i = 0; i < n; ++i) b.logit_rows.push_back(static_cast<int32_t>(i));
    Tensor lg = pool.forward(b);
    out.insert(out.end(), lg.data<float>(), lg.data<float>() + static_cast<int64_t>(n) * V);
    start += n;
  }
  return out;
}

// The fixture's expert weights replaced by our NVFP4 quantisation of them (everything else stays bf16, as
// ModelOpt checkpoints keep attention, router and lm_head in bf16).
std::unique_ptr<model::MemorySource> nvfp4_experts(const Fixture& f) {
  auto src = std::make_unique<model::MemorySource>("nvfp4 variant");
  for (const auto& name : f.src->checkpoint().names()) {
    Tensor t = f.src->tensor(name);
    const bool expert = name.find(".mlp.experts.") != std::string::npos && name.ends_with(".weight");
    if (!expert) {
      src->put(name, t);
      continue;
    }
    const int64_t rows = t.size(0), cols = t.size(1);
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < w.size(); ++i) w[i] = quant::bf16_to_f32(t.data<uint16_t>()[i]);
    quant::Nvfp4Weight q = quant::nvfp4_quantize(w.data(), rows, cols);
    const std::string prefix = name.substr(0, name.size() - 7);
    Tensor packed = Tensor::empty({rows, cols / 2}, DType::U8);
    std::copy(q.packed.begin(), q.packed.end(), packed.data<uint8_t>());
    Tensor scales = Tensor::empty({rows, cols / 16}, DType::F8_E4M3);
    std::copy(q.scales.begin(), q.scales.end(), scales.data<uint8_t>());
    Tensor s2 = Tensor::empty({}, DType::F32);
    s2.data<float>()[0] = q.scale2;
    src->put(prefix + ".weight", packed);
    src->put(prefix + ".weight_scale", scales);
    src->put(prefix + ".weight_scale_2", s2);
  }
  return src;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, FullPromptAndDecodeMatchTransformers) {
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture tests/data/golden/" << GetParam() << " is absent (tools/golden makes it)";
  model::Model m(f->cfg, model::load_weights(f->cfg, *f->src));
  const int64_t V = f->cfg.vocab_size;
  for (size_t i = 0; i < f->prompts.size(); ++i) {
    std::vector<int32_t> ids = f->prompts[i];
    ids.insert(ids.end(), f->greedy[i].begin(), f->greedy[i].end() - 1);
    Tensor want = expected_logits(GetParam(), i);
    ASSERT_EQ(want.size(0), static_cast<int64_t>(ids.size()));
    const int64_t P = static_cast<int64_t>(f->prompts[i].size()), T = want.size(0);
    // fp32 compute, exact (f32) cache: the whole sequence in one forward, then token by token.
    auto full = run(m, ids, ids.size(), false, kv::KvCacheDType::F32);
    EXPECT_LT(rel_err(full.data(), want, 0, T, V), 1e-3) << GetParam() << " prompt " << i << " full forward";
    auto dec = run(m, ids, static_cast<size_t>(P), true, kv::KvCacheDType::F32);
    EXPECT_LT(rel_err(dec.data(), want, 0, T, V), 1e-3) << GetParam() << " prompt " << i << " decode";
    // bf16 cache, prompt rows only (decode rows can follow a flipped discrete choice, see below): within
    // the rounding of 8-bit mantissas. GLM-5's prompt 3 flips an expert choice inside its prompt; its rows
    // are checked up to that flip by DivergenceStartsAtADiscreteNearTie.
    auto bf = run(m, ids, static_cast<size_t>(P), true, kv::KvCacheDType::BF16);
    // DSA models: a bf16 cache can flip the indexer's selection at a near-tie;
    // DivergenceStartsAtADiscreteNearTie checks their rows up to the first flip.
    if (f->cfg.index_topk <= 0) {
      EXPECT_LT(rel_err(bf.data(), want, 0, P, V), 2e-2) << GetParam() << " prompt " << i << " bf16 kv";
    }
  }
}

std::map<size_t, std::vector<int32_t>> engine_greedy(const Fixture& f, kv::KvCacheDType dt) {
  auto m = std::make_shared<model::Model>(f.cfg, model::load_weights(f.cfg, *f.src));
  runtime::EngineConfig ec;
  ec.kv_cache_dtype = dt;
  ec.kv_cache_tokens = 4096;
  runtime::Engine e(m, ec);
  std::map<uint64_t, size_t> which;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    runtime::Request r;
    r.prompt_ids = f.prompts[i];
    r.max_tokens = static_cast<int>(f.greedy[i].size());
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    which[e.submit(r)] = i;
  }
  std::map<size_t, std::vector<int32_t>> got;
  while (e.has_work())
    for (const auto& o : e.step())
      for (const auto& g : o.tokens) got[which[o.request_id]].push_back(g.token);
  return got;
}

// All prompts batched together through the Engine (prefill and decode mixed in its steps).
TEST_P(Golden, GreedyTokensIdentical) {
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture tests/data/golden/" << GetParam() << " is absent (tools/golden makes it)";
  auto exact = engine_greedy(*f, kv::KvCacheDType::F32);
  auto bf16 = engine_greedy(*f, kv::KvCacheDType::BF16);
  for (size_t i = 0; i < f->prompts.size(); ++i) {
    EXPECT_EQ(exact[i], f->greedy[i]) << GetParam() << " prompt " << i << " f32 kv";
    if (f->cfg.index_topk <= 0) {
      EXPECT_EQ(bf16[i], f->greedy[i]) << GetParam() << " prompt " << i << " bf16 kv";
    } else {
      // Known gap, explained by DivergenceStartsAtADiscreteNearTie below: with a bf16 cache a discrete choice
      // at a near-tie flips. Measured: prompt 3 flips an expert top-k choice at position 8 (inside the
      // prompt; layer 2; gap 2.3e-4 between the 8th and 9th selection score, which the bf16 cache moves by up
      // to 5.9e-4), prompt 2 flips a DSA top-8 choice at position 23 (layer 3; gap 8.2e-5, moved by 1.1e-2).
      // Rows and tokens before the first flip match the reference; the exact (f32) cache matches every token.
      size_t agree = 0;
      while (agree < bf16[i].size() && agree < f->greedy[i].size() && bf16[i][agree] == f->greedy[i][agree])
        ++agree;
      RecordProperty("glm5_bf16_agree_prompt_" + std::to_string(i), static_cast<int>(agree));
      EXPECT_GE(agree, 1u) << GetParam() << " prompt " << i << " bf16 kv: even the prefill's token differs";
    }
  }
}

// FP8 e4m3 KV cache and NVFP4 experts: error budgets measured on these fixtures (see the numbers in the
// messages). FP8 keeps 3 mantissa bits (relative rounding <= 1/16) on every cached latent and rope value;
// NVFP4 keeps E2M1 (relative step up to 1/3 between 4 and 6) per block of 16 with an fp8 block scale.
// Measured worst row (max |diff| / max |ref| over a row): fp8 kv 0.42 / 0.44 / 0.038 and nvfp4 experts
// 0.38 / 0.46 / 0.085 for glm5_tiny / deepseek_v3_tiny / deepseek_v3_tiny_qproj. The two large figures come
// from rows after a discrete choice (expert or DSA top-k) flips; without a flip the error is the continuous
// one (qproj). The bound 0.6 is the worst measured row with ~30% headroom: a real decoding bug (wrong scale,
// wrong block, misplaced nibble) gives rows of order 1.
TEST_P(Golden, Fp8KvAndNvfp4WithinTheirBudgets) {
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture tests/data/golden/" << GetParam() << " is absent (tools/golden makes it)";
  model::Model m(f->cfg, model::load_weights(f->cfg, *f->src));
  auto q = nvfp4_experts(*f);
  model::Model mq(f->cfg, model::load_weights(f->cfg, *q));
  ASSERT_EQ(mq.weights().layers[1].moe.experts[0].gate.format, ops::WeightFormat::NVFP4);
  const int64_t V = f->cfg.vocab_size;
  double worst_fp8 = 0, worst_nvfp4 = 0;
  for (size_t i = 0; i < f->prompts.size(); ++i) {
    std::vector<int32_t> ids = f->prompts[i];
    ids.insert(ids.end(), f->greedy[i].begin(), f->greedy[i].end() - 1);
    Tensor want = expected_logits(GetParam(), i);
    const int64_t T = want.size(0);
    auto fp8 = run(m, ids, f->prompts[i].size(), true, kv::KvCacheDType::FP8E4M3);
    worst_fp8 = std::max(worst_fp8, rel_err(fp8.data(), want, 0, T, V));
    auto nv = run(mq, ids, ids.size(), false, kv::KvCacheDType::F32);
    worst_nvfp4 = std::max(worst_nvfp4, rel_err(nv.data(), want, 0, T, V));
  }
  RecordProperty("fp8_kv_rel_err", std::to_string(worst_fp8));
  RecordProperty("nvfp4_rel_err", std::to_string(worst_nvfp4));
  std::printf("%s: fp8 kv worst row rel err %.4g, nvfp4 experts %.4g\n", GetParam().c_str(), worst_fp8,
              worst_nvfp4);
  EXPECT_LT(worst_fp8, 0.6) << GetParam();
  EXPECT_GT(worst_fp8, 1e-4) << GetParam() << ": the fp8 cache did not round anything";
  EXPECT_LT(worst_nvfp4, 0.6) << GetParam();
  EXPECT_GT(worst_nvfp4, 1e-4) << GetParam() << ": nvfp4 weights changed nothing";
}

// ---- GLM-5 with a bf16 KV cache: why its greedy tokens can leave the reference ------------------------
//
// Two discrete choices follow continuous scores: the DSA indexer keeps the top index_topk (8) positions by
// index[j] = sum_h w[h] relu(scale q[h] . k_j), and each MoE layer keeps the top num_experts_per_tok experts
// by sigmoid(router logit) + correction bias. The bf16 cache rounds the latent and the indexer keys to 8-bit
// mantissas, which moves those scores slightly. Teacher-forced on the reference tokens, this test records
// both scores (recomputed in double from the model's probes and the pool's keys) at every query of every
// layer, with an f32 and a bf16 cache, and finds the first query where a choice differs.

struct RouterChoice {
  std::vector<double> scores;   // [experts] selection scores: sigmoid(logit) + correction bias
  std::vector<int32_t> chosen;  // sorted
};

struct IndexerScores {
  std::vector<double> scores;  // [position + 1]
  std::vector<int32_t> chosen;
};
using ScoreKey = std::tuple<int, int, int>;  // (position, layer, unused 0): ordered by position first

std::map<ScoreKey, IndexerScores> indexer_scores(const Fixture& f, const std::vector<int32_t>& ids, size_t P,
                                                 kv::KvCacheDType dt, std::vector<float>* logits,
                                                 std::map<ScoreKey, RouterChoice>* routes) {
  std::map<ScoreKey, IndexerScores> out;
  const model::Model* model_ptr = nullptr;
  const kv::ForwardBatch* batch_ptr = nullptr;
  const kv::KvPool* pool_ptr = nullptr;
  std::vector<int32_t> pages;
  model::ModelOptions opt;
  float scale = 1.0f;
  opt.indexer_probe = [&](const model::IndexerProbe& p) {
    const Tensor& keys = pool_ptr->index_keys(p.layer);
    const int64_t m = p.q->size(0), H = p.q->size(1), D = p.q->size(2), ps = keys.size(1),
                  K = p.topk->size(1);
    for (int64_t i = 0; i < m; ++i) {
      const int32_t pos = p.batch->positions[static_cast<size_t>(i)];
      IndexerScores s;
      for (int32_t j = 0; j <= pos; ++j) {
        const int64_t base = (static_cast<int64_t>(pages[static_cast<size_t>(j / ps)]) * ps + j % ps) * D;
        double idx = 0;
        for (int64_t h = 0; h < H; ++h) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            const double k = keys.dtype() == DType::F32 ? keys.data<float>()[base + d]
                                                        : quant::bf16_to_f32(keys.data<uint16_t>()[base + d]);
            dot += p.q->data<float>()[(i * H + h) * D + d] * k;
          }
          idx += p.w->data<float>()[i * H + h] * std::max(0.0, scale * dot);
        }
        s.scores.push_back(idx);
      }
      for (int64_t k = 0; k < K; ++k)
        if (p.topk->data<int32_t>()[i * K + k] >= 0) s.chosen.push_back(p.topk->data<int32_t>()[i * K + k]);
      out[{pos, p.layer, 0}] = std::move(s);
    }
  };
  opt.router_probe = [&](const model::RouterProbe& p) {
    const int64_t m = p.logits->size(0), E = p.logits->size(1), K = f.cfg.num_experts_per_tok;
    const Tensor& bias = model_ptr->weights().layers[static_cast<size_t>(p.layer)].moe.correction_bias;
    for (int64_t i = 0; i < m; ++i) {
      RouterChoice rc;
      for (int64_t e = 0; e < E; ++e) {
        const double x = p.logits->data<float>()[i * E + e];
        rc.scores.push_back(1.0 / (1.0 + std::exp(-x)) + (bias.numel() ? bias.data<float>()[e] : 0.0f));
      }
      rc.chosen.assign(p.topk_ids + i * K, p.topk_ids + (i + 1) * K);
      std::sort(rc.chosen.begin(), rc.chosen.end());
      (*routes)[{batch_ptr->positions[static_cast<size_t>(i)], p.layer, 1}] = std::move(rc);
    }
  };
  model::Model m(f.cfg, model::load_weights(f.cfg, *f.src), opt);
  model_ptr = &m;
  scale = m.scales().indexer_softmax_scale;
  test::ExecPool pool(m, 8, 64, dt);
  pool_ptr = &pool.kv();
  EXPECT_TRUE(pool.allocator().allocate(pool.pages_for(static_cast<int64_t>(ids.size())), pages));
  const int64_t V = m.config().vocab_size;
  for (size_t start = 0; start < ids.size();) {
    const size_t n = start == 0 ? P : 1;
    kv::ForwardBatchBuilder bb(64);
    bb.add_sequence(pages, static_cast<int32_t>(start), ids.data() + start, static_cast<int32_t>(n), false);
    kv::ForwardBatch b = bb.finish();
    for (size_t i = 0; i < n; ++i) b.logit_rows.push_back(static_cast<int32_t>(i));
    batch_ptr = &b;
    Tensor lg = pool.forward(b);
    logits->insert(logits->end(), lg.data<float>(), lg.data<float>() + static_cast<int64_t>(n) * V);
    start += n;
  }
  return out;
}

// The gap between the k-th and (k+1)-th largest score.
double boundary_margin(std::vector<double> s, size_t k) {
  std::sort(s.begin(), s.end(), std::greater<>());
  return s[k - 1] - s[k];
}

// The first query (position, layer) whose discrete choice differs between two runs: `what`, the f32 run's gap
// at the k boundary and how far the bf16 cache moved that query's scores.
struct Flip {
  int position = -1, layer = -1;
  const char* what = "";
  double gap = 0, shift = 0, largest = 0;
};

template <class Choice>
void first_flip(const std::map<ScoreKey, Choice>& f32, const std::map<ScoreKey, Choice>& bf16, size_t k,
                const char* what, Flip& flip) {
  for (const auto& [key, a] : f32) {
    const auto& b = bf16.at(key);
    if (a.chosen == b.chosen) continue;
    if (flip.position >= 0 && std::get<0>(key) >= flip.position) return;
    flip.position = std::get<0>(key);
    flip.layer = std::get<1>(key);
    flip.what = what;
    flip.gap = boundary_margin(a.scores, k);
    flip.shift = flip.largest = 0;
    for (size_t j = 0; j < a.scores.size(); ++j) {
      flip.shift = std::max(flip.shift, std::fabs(a.scores[j] - b.scores[j]));
      flip.largest = std::max(flip.largest, std::fabs(a.scores[j]));
    }
    return;
  }
}

class GoldenDsaBf16Kv : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenDsaBf16Kv, DivergenceStartsAtADiscreteNearTie) {
  const std::string name = GetParam();
  auto f = load_fixture(name);
  if (!f) GTEST_SKIP() << "fixture tests/data/golden/" << name << " is absent";
  const auto bf16_tokens = engine_greedy(*f, kv::KvCacheDType::BF16);
  const int64_t V = f->cfg.vocab_size;
  for (size_t i = 0; i < f->prompts.size(); ++i) {
    std::vector<int32_t> ids = f->prompts[i];
    ids.insert(ids.end(), f->greedy[i].begin(), f->greedy[i].end() - 1);
    const size_t P = f->prompts[i].size();
    std::vector<float> lf, lb;
    std::map<ScoreKey, RouterChoice> rf, rb;
    const auto sf = indexer_scores(*f, ids, P, kv::KvCacheDType::F32, &lf, &rf);
    const auto sb = indexer_scores(*f, ids, P, kv::KvCacheDType::BF16, &lb, &rb);
    ASSERT_EQ(sf.size(), sb.size());
    ASSERT_EQ(rf.size(), rb.size());
    Flip flip;
    first_flip(sf, sb, static_cast<size_t>(f->cfg.index_topk), "DSA top-k", flip);
    first_flip(rf, rb, static_cast<size_t>(f->cfg.num_experts_per_tok), "expert top-k", flip);
    Tensor want = expected_logits(name, i);
    const int64_t rows = flip.position < 0 ? want.size(0) : flip.position;
    if (flip.position >= 0) {
      std::printf(
          "%s prompt %zu (%zu prompt tokens): first flip at position %d, layer %d, %s: boundary gap "
          "%.3g "
          "with the f32 cache; the bf16 cache moved those scores by up to %.3g (largest score %.3g); row "
          "error "
          "there %.3g\n",
          name.c_str(), i, P, flip.position, flip.layer, flip.what, flip.gap, flip.shift, flip.largest,
          rel_err(lb.data() + flip.position * V, want, flip.position, flip.position + 1, V));
      RecordProperty(name + "_bf16_flip_prompt_" + std::to_string(i),
                     fmt::format("position {} layer {} {} gap {:.3g} shift {:.3g}", flip.position, flip.layer,
                                 flip.what, flip.gap, flip.shift));
      // A near-tie: the gap at the boundary is smaller than what bf16 rounding moved the scores.
      EXPECT_LT(flip.gap, 2 * flip.shift) << "prompt " << i << ": a flip without a near-tie";
    }
    // Before the first flip, every row is within bf16 rounding of the reference, and so are the greedy
    // tokens chosen from those rows.
    if (rows > 0) {
      EXPECT_LT(rel_err(lb.data(), want, 0, rows, V), 2e-2) << "prompt " << i << " bf16 kv before any flip";
    }
    const auto& got = bf16_tokens.at(i);
    for (int64_t t = 0; t + static_cast<int64_t>(P) - 1 < rows && t < static_cast<int64_t>(got.size()); ++t)
      EXPECT_EQ(got[static_cast<size_t>(t)], f->greedy[i][static_cast<size_t>(t)])
          << "prompt " << i << " bf16 kv token " << t << " differs before any flip";
  }
}

// trained_builtin: the trained built-in model (tools/train/train_builtin.py writes its fixture), English
// prompts of lengths around and above its index_topk and one chat prompt.
INSTANTIATE_TEST_SUITE_P(Fixtures, Golden,
                         ::testing::Values("glm5_tiny", "deepseek_v3_tiny", "deepseek_v3_tiny_qproj",
                                           "trained_builtin"));
INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenDsaBf16Kv, ::testing::Values("glm5_tiny", "trained_builtin"));

}  // namespace
}  // namespace ms
