// The step plan codec: random batches (prefill chunks, decode tokens, logit rows, block-table padding, OEA
// decode masks) survive a round trip field by field, and a corrupt or truncated buffer is refused naming why.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "core/error.h"
#include "runtime/step_plan.h"

namespace ms {
namespace {

using runtime::StepOp;
using runtime::StepPlan;

// A batch as the scheduler builds them: per sequence either a prefill chunk (some with logits) or one decode
// token, pages from a shuffled pool, block table padded with -1 to the longest sequence.
StepPlan random_plan(std::mt19937& rng, int64_t step) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int32_t ps = 1 << uni(2, 6);
  kv::ForwardBatchBuilder bb(ps);
  StepPlan p;
  p.step = step;
  p.routing.oea.enabled = uni(0, 1) == 1;
  p.routing.oea.k0 = uni(0, 8);
  p.routing.oea.kmax = uni(0, 8);
  const int n_seqs = uni(1, 9);
  int32_t next_page = uni(0, 100);
  for (int s = 0; s < n_seqs; ++s) {
    const bool decode = uni(0, 2) > 0;
    const int32_t start = uni(0, 300);
    const int32_t n = decode ? 1 : uni(1, 70);
    std::vector<int32_t> pages((start + n + ps - 1) / ps);
    for (auto& pg : pages) pg = next_page++;
    std::vector<int32_t> toks(static_cast<size_t>(n));
    for (auto& t : toks) t = uni(0, 150000);
    bb.add_sequence(pages, start, toks.data(), n, decode || uni(0, 1) == 1);
    p.routing.decode_tokens.insert(p.routing.decode_tokens.end(), static_cast<size_t>(n), decode ? 1 : 0);
  }
  p.batch = bb.finish();
  if (uni(0, 3) == 0) p.routing.decode_tokens.clear();  // a step that marks none
  // Slots past 2^31 (a large pool at a large page size) need both words.
  if (uni(0, 1) == 1)
    for (auto& s : p.batch.slot_mapping) s += int64_t{3} << 32;
  return p;
}

void expect_same(const StepPlan& a, const StepPlan& b) {
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.batch.token_ids, b.batch.token_ids);
  EXPECT_EQ(a.batch.positions, b.batch.positions);
  EXPECT_EQ(a.batch.token_seq, b.batch.token_seq);
  EXPECT_EQ(a.batch.seq_lens, b.batch.seq_lens);
  EXPECT_EQ(a.batch.block_table, b.batch.block_table);
  EXPECT_EQ(a.batch.max_blocks, b.batch.max_blocks);
  EXPECT_EQ(a.batch.slot_mapping, b.batch.slot_mapping);
  EXPECT_EQ(a.batch.logit_rows, b.batch.logit_rows);
  EXPECT_EQ(a.routing.decode_tokens, b.routing.decode_tokens);
  EXPECT_EQ(a.routing.oea.enabled, b.routing.oea.enabled);
  EXPECT_EQ(a.routing.oea.k0, b.routing.oea.k0);
  EXPECT_EQ(a.routing.oea.kmax, b.routing.oea.kmax);
  EXPECT_EQ(b.routing.expert_stats, nullptr);
}

std::string error_of(const std::vector<int32_t>& w) {
  try {
    runtime::decode_step_plan(w);
  } catch (const Error& e) {
    return e.message();
  }
  return "(decoded)";
}

// The codec's checksum, written here again so that a test can forge a buffer whose header and checksum agree.
void reseal(std::vector<int32_t>& w) {
  w[2] = static_cast<int32_t>(w.size());
  uint32_t h = 2166136261u;
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    uint32_t u = static_cast<uint32_t>(w[i]);
    for (int k = 0; k < 4; ++k, u >>= 8) {
      h ^= u & 0xffu;
      h *= 16777619u;
    }
  }
  w.back() = static_cast<int32_t>(h);
}

TEST(StepPlan, RandomBatchesRoundTrip) {
  std::mt19937 rng(13);
  std::vector<int32_t> words;
  for (int i = 0; i < 300; ++i) {
    SCOPED_TRACE(i);
    const StepPlan p = random_plan(rng, int64_t{i} * 977 + (i % 3 == 0 ? (int64_t{1} << 40) : 0));
    runtime::encode_step_plan(StepOp::Run, p.step, &p.batch, &p.routing, words);  // buffer reused
    EXPECT_EQ(words[0], runtime::kStepPlanMagic);
    EXPECT_EQ(static_cast<size_t>(words[2]), words.size());
    expect_same(p, runtime::decode_step_plan(words));
  }
}

TEST(StepPlan, EmptyAndShutdown) {
  StepPlan empty;
  empty.step = 5;
  expect_same(empty, runtime::decode_step_plan(runtime::encode_step_plan(empty)));
  std::vector<int32_t> w;
  runtime::encode_step_plan(StepOp::Shutdown, 42, nullptr, nullptr, w);
  const StepPlan s = runtime::decode_step_plan(w);
  EXPECT_EQ(s.op, StepOp::Shutdown);
  EXPECT_EQ(s.step, 42);
  EXPECT_TRUE(s.batch.token_ids.empty());
  EXPECT_THROW(runtime::encode_step_plan(StepOp::Run, 0, nullptr, nullptr, w), Error);
  runtime::encode_step_plan(StepOp::Keepalive, 7, nullptr, nullptr, w);
  const StepPlan k = runtime::decode_step_plan(w);
  EXPECT_EQ(k.op, StepOp::Keepalive);
  EXPECT_EQ(k.step, 7);
  w[3] = 4;  // no such op (refused by the checksum first)
  EXPECT_THROW(runtime::decode_step_plan(w), Error);
}

TEST(StepPlan, ExpertStatsDoNotTravel) {
  std::mt19937 rng(1);
  StepPlan p = random_plan(rng, 0);
  p.routing.expert_stats = reinterpret_cast<moe::ExpertStats*>(&rng);  // any non-null pointer
  EXPECT_EQ(runtime::decode_step_plan(runtime::encode_step_plan(p)).routing.expert_stats, nullptr);
}

TEST(StepPlan, CorruptBuffersAreNamed) {
  std::mt19937 rng(7);
  StepPlan p = random_plan(rng, 3);
  const std::vector<int32_t> good = runtime::encode_step_plan(p);
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << msg;
  };

  EXPECT_TRUE(has(error_of({}), "shorter than its header"));
  std::vector<int32_t> w = good;
  w[0] ^= 1;
  EXPECT_TRUE(has(error_of(w), "not a step plan"));
  w = good;
  w[1] = runtime::kStepPlanVersion + 1;
  EXPECT_TRUE(has(error_of(w), "this build reads version 1"));
  w = good;
  w.pop_back();  // truncated in transit
  EXPECT_TRUE(has(error_of(w), fmt::format("the header says {} words, the buffer holds {}", good.size(),
                                           good.size() - 1)));
  // Every single flipped bit of the body is caught by the checksum.
  for (size_t i = 3; i + 1 < good.size(); ++i) {
    w = good;
    w[i] ^= 1 << (i % 31);
    ASSERT_TRUE(has(error_of(w), "(corrupt)")) << "word " << i;
  }
  w = good;
  w[3] = 9;
  reseal(w);
  EXPECT_TRUE(has(error_of(w), "unknown op 9"));
  // A plan cut inside an array, with a header and checksum that agree with the cut.
  w.assign(good.begin(), good.begin() + 14);
  w.push_back(0);
  reseal(w);
  EXPECT_TRUE(has(error_of(w), "step plan: truncated in"));
  // An element count that runs past the buffer (a forged, sealed buffer).
  w = good;
  w[10] = 1 << 30;  // token_ids' count
  reseal(w);
  EXPECT_TRUE(has(error_of(w), "truncated in token_ids"));
  w = good;
  w[10] = -2;
  reseal(w);
  EXPECT_TRUE(has(error_of(w), "token_ids has a negative element count -2"));
  // Words after the last field.
  w = good;
  w.insert(w.end() - 1, 77);
  reseal(w);
  EXPECT_TRUE(has(error_of(w), "1 words left over after the run plan"));
}

}  // namespace
}  // namespace ms
