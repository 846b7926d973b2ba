// The profiler on the built-in model, driven through the Engine and the ProfileController as the server
// drives it: a planted op that casts the whole KV pool on every layer must come out on top, flagged for its
// bytes; without it no op moves more than its floor allows.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <set>
#include <thread>

#include "model/builtin_model.h"
#include "model/weight_loader.h"
#include "profiler/profile_controller.h"
#include "runtime/engine.h"
#include "test_executor.h"

namespace ms {
namespace {

constexpr int kBatch = 2, kContext = 48, kWarmup = 1, kSteps = 4;
constexpr int64_t kPoolTokens = 65536;  // far more slots than the batch uses, as in serving
constexpr int32_t kPage = 16;

std::shared_ptr<model::Model> builtin(bool plant) {
  io::ModelConfig cfg = model::builtin_model_config();
  auto src = model::builtin_model_weights(cfg);
  model::ModelWeights w = model::load_weights(cfg, *src);
  model::ModelOptions opt;
  opt.debug_cast_whole_pool = plant;
  return std::make_shared<model::Model>(std::move(cfg), std::move(w), opt);
}

profiler::ProfileRequest request(int steps, int warmup = 0) {
  profiler::ProfileRequest r;
  r.steps = steps;
  r.warmup_steps = warmup;
  return r;
}

// Fills kBatch sequences to kContext tokens, then records kSteps decode steps after kWarmup.
profiler::ProfileResult profile_decode(std::shared_ptr<model::Model> m) {
  runtime::EngineConfig ec;
  ec.page_size = kPage;
  ec.kv_cache_tokens = kPoolTokens;
  ec.kv_cache_dtype = kv::KvCacheDType::BF16;
  ec.max_running = kBatch;
  ec.max_prefill_tokens = kBatch * kContext;
  runtime::Engine engine(std::move(m), ec);
  profiler::ProfileController ctl({profiler::parse_ceilings("20,100"), {}, {}});
  engine.set_step_hook(&ctl);
  for (int s = 0; s < kBatch; ++s) {
    runtime::Request r;
    for (int i = 0; i < kContext; ++i) r.prompt_ids.push_back((s * 131 + i * 7) % 512);
    r.max_tokens = 1 + kWarmup + kSteps;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.submit(std::move(r));
  }
  engine.step();  // the whole batch prefilled in one step
  EXPECT_EQ(engine.stats().generation_tokens_total, kBatch);
  ctl.start(request(kSteps, kWarmup));
  while (!ctl.done() && engine.has_work()) engine.step();
  EXPECT_TRUE(ctl.done());
  return ctl.stop();
}

TEST(ModelProfile, PlantedWholePoolCastIsOnTopAndFlagged) {
  // One thread: on a busy machine an OpenMP barrier can wait milliseconds for a descheduled thread, which
  // lands on whichever small op it hits; a single thread is charged only for its own work.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  profiler::ProfileResult r = profile_decode(builtin(true));
  omp_set_num_threads(threads);
  std::cout << r.table;
  const profiler::Summary& s = r.summary;
  ASSERT_EQ(s.steps, kSteps);
  ASSERT_FALSE(s.ops.empty());
  const profiler::OpStats& top = s.ops.front();
  EXPECT_EQ(top.key, "attn.debug_pool_cast");
  EXPECT_EQ(top.calls_per_step, 3);  // every layer
  EXPECT_TRUE(top.flag_bytes);
  // Floor: the batch's rows (2 sequences of 49 + k tokens at decode step k = 1..4); moved: every slot.
  double ctx_rows = 0;
  for (int k = kWarmup; k < kWarmup + kSteps; ++k) ctx_rows += kBatch * (kContext + 1 + k);
  const double expect = kSteps * static_cast<double>(kPoolTokens) / ctx_rows;
  EXPECT_NEAR(top.moved_over_floor, expect, 1e-9 * expect);
  std::cout << "planted op: " << top.key << " moves " << top.moved_over_floor << "x its floor, "
            << 100 * top.share << "% of the step\n";
  EXPECT_NE(r.table.find("!! bytes " + fmt::format("{:.1f}", top.moved_over_floor) + "x floor"),
            std::string::npos);
  // Only the planted op is flagged for bytes.
  for (size_t i = 1; i < s.ops.size(); ++i) EXPECT_FALSE(s.ops[i].flag_bytes) << s.ops[i].key;
}

TEST(ModelProfile, WithoutThePlantNoOpIsFlaggedForBytes) {
  profiler::ProfileResult r = profile_decode(builtin(false));
  std::cout << r.table;
  std::set<std::string> kinds;
  for (const auto& o : r.summary.ops) {
    kinds.insert(o.key);
    EXPECT_FALSE(o.flag_bytes) << o.key << " moves " << o.moved_over_floor << "x its floor";
    EXPECT_GT(o.bytes_floor_per_step, 0) << o.key << " has no byte floor";
  }
  EXPECT_EQ(kinds.count("attn.debug_pool_cast"), 0u);
  for (const char* k : {"embed", "attn.mla_decode", "indexer.topk", "moe.experts", "moe.shared.gate_up",
                        "mlp.down", "attn.residual", "lm_head"})
    EXPECT_EQ(kinds.count(k), 1u) << k;
}

TEST(ModelProfile, EnvironmentVariablePlantsTheOp) {
  ::setenv("MOESERVE_DEBUG_PLANT_POOL_CAST", "1", 1);
  std::unique_ptr<model::Model> m = model::make_builtin_model();
  ::unsetenv("MOESERVE_DEBUG_PLANT_POOL_CAST");
  test::ExecPool pool(*m, 8, 16, kv::KvCacheDType::BF16);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.allocator().allocate(1, pages));
  const std::vector<int32_t> ids = {1, 2, 3};
  kv::ForwardBatchBuilder bb(16);
  bb.add_sequence(pages, 0, ids.data(), 3, true);
  profiler::Profiler prof;
  prof.begin_step();
  pool.forward(bb.finish(), {}, &prof);
  prof.end_step();
  int planted = 0;
  for (const auto& id : prof.identities()) planted += id.kind == "attn.debug_pool_cast";
  EXPECT_EQ(planted, 3);
}

// The HTTP side: start() from one thread while another runs the engine loop; stop() before the requested
// steps ends the profile with what was recorded.
TEST(ModelProfile, ControllerStartsAndStopsFromAnotherThread) {
  runtime::EngineConfig ec;
  ec.page_size = kPage;
  ec.kv_cache_tokens = 4096;
  ec.max_running = 1;
  runtime::Engine engine(builtin(false), ec);
  profiler::ProfileController ctl({profiler::parse_ceilings("20,100"), {}, {}});
  engine.set_step_hook(&ctl);
  runtime::Request r;
  r.prompt_ids = {5, 6, 7, 8};
  r.max_tokens = 3000;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  engine.submit(r);
  // The loop never runs dry: a request that reaches the model's context is followed by another, so the
  // profiles below always see steps however fast the engine is.
  std::atomic<bool> quit{false};
  std::thread loop([&] {
    while (!quit) {
      if (!engine.has_work()) engine.submit(r);
      engine.step();
    }
  });
  EXPECT_THROW(ctl.stop(), Error);  // nothing started
  ctl.start(request(0));            // until stop()
  EXPECT_THROW(ctl.start(request(1)), Error);
  while (ctl.steps_recorded() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  profiler::ProfileResult res = ctl.stop();
  EXPECT_GE(res.summary.steps, 3);
  // A step slice and 67 ops per step: each residual add carries the norm after it (attn.residual: ffn norm;
  // ffn.residual: the next layer's attn norm), so attn.norm runs in layer 0 only and ffn.norm not at all.
  EXPECT_EQ(res.trace["traceEvents"].size(), static_cast<size_t>(res.summary.steps) * (1 + 67));
  ctl.start(request(2));
  EXPECT_TRUE(ctl.wait_done(std::chrono::seconds(60)));
  EXPECT_EQ(ctl.stop().summary.steps, 2);
  quit = true;
  loop.join();
}

}  // namespace
}  // namespace ms
