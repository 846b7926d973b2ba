#include "profiler/summary.h"

#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include "core/error.h"
#include "fake_timer.h"
#include "profiler/floor.h"
#include "profiler/report.h"

namespace ms::profiler {
namespace {

using testing::FakeTimer;

// Ceilings chosen for round numbers: 100 GB/s = 1e5 bytes/us, 1000 GFLOP/s = 1e6 FLOP/us.
Ceilings given() {
  return parse_ceilings("100,1000");
}

class Synthetic : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = std::make_unique<FakeTimer>();
    timer = t.get();
    prof = std::make_unique<Profiler>(ProfilerOptions{.warmup_steps = 1}, std::move(t));
  }
  void op(std::string_view name, double us, OpCost cost) {
    OpScope s(prof.get(), OpInfo{name, {}, fmt::format("x f32[{}]", us), cost});
    timer->advance(us);
  }
  FakeTimer* timer = nullptr;
  std::unique_ptr<Profiler> prof;
};

// Two recorded steps (after one warm-up step that would skew every figure if it were counted):
//   gap 5 | layer.0.attn 10 | layer.1.attn 30 (50 in step 2) | gap 5 | layer.0.gemm 20
// attn: floor 1e6 bytes -> 10 us each; gemm: 1e5 bytes (1 us) but 1e7 FLOPs -> 10 us.
TEST_F(Synthetic, AggregationArithmetic) {
  const OpCost attn{1e6, 0, 2e6}, gemm{1e5, 0, 1e7};
  prof->begin_step();
  op("layer.0.attn", 1000, attn);  // warm-up
  prof->end_step();
  for (double attn1 : {30.0, 50.0}) {
    prof->begin_step();
    timer->advance(5);
    op("layer.0.attn", 10, attn);
    op("layer.1.attn", attn1, attn);
    timer->advance(5);
    op("layer.0.gemm", 20, gemm);
    prof->end_step();
  }

  Summary s = summarize(*prof, given());
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.warmup_steps, 1);
  EXPECT_EQ(s.timer, "fake");
  EXPECT_DOUBLE_EQ(s.step_us_mean, 80);
  EXPECT_DOUBLE_EQ(s.step_us_min, 70);
  EXPECT_DOUBLE_EQ(s.step_us_max, 90);
  EXPECT_DOUBLE_EQ(s.ops_us_per_step, 70);
  EXPECT_DOUBLE_EQ(s.outside_ops_us_per_step, 10);
  EXPECT_DOUBLE_EQ(s.floor_us_per_step, 30);
  EXPECT_DOUBLE_EQ(s.roofline, 30.0 / 80);

  ASSERT_EQ(s.ops.size(), 2u);
  const OpStats& a = s.ops[0];
  EXPECT_EQ(a.key, "attn");
  EXPECT_DOUBLE_EQ(a.calls_per_step, 2);
  EXPECT_DOUBLE_EQ(a.time_us_per_step, 50);
  EXPECT_DOUBLE_EQ(a.share, 50.0 / 80);
  EXPECT_DOUBLE_EQ(a.bytes_floor_per_step, 2e6);
  EXPECT_DOUBLE_EQ(a.bytes_moved_per_step, 2e6);
  EXPECT_DOUBLE_EQ(a.flops_per_step, 4e6);
  EXPECT_DOUBLE_EQ(a.time_floor_us_per_step, 20);
  EXPECT_DOUBLE_EQ(a.floor_share, 20.0 / 30);
  EXPECT_DOUBLE_EQ(a.gbps, 40);    // 2e6 bytes / 50 us
  EXPECT_DOUBLE_EQ(a.gflops, 80);  // 4e6 FLOP / 50 us
  EXPECT_DOUBLE_EQ(a.roofline, 0.4);
  EXPECT_DOUBLE_EQ(a.moved_over_floor, 1);
  EXPECT_FALSE(a.flagged());

  const OpStats& g = s.ops[1];
  EXPECT_EQ(g.key, "gemm");
  EXPECT_DOUBLE_EQ(g.calls_per_step, 1);
  EXPECT_DOUBLE_EQ(g.time_us_per_step, 20);
  EXPECT_DOUBLE_EQ(g.time_floor_us_per_step, 10);  // FLOP-bound: 1e7 / 1e6
  EXPECT_DOUBLE_EQ(g.gbps, 5);
  EXPECT_DOUBLE_EQ(g.gflops, 500);
  EXPECT_DOUBLE_EQ(g.roofline, 0.5);
  EXPECT_FALSE(g.flagged());

  Summary per_layer = summarize(*prof, given(), GroupBy::Name);
  ASSERT_EQ(per_layer.ops.size(), 3u);
  EXPECT_EQ(per_layer.ops[0].key, "layer.1.attn");
  EXPECT_DOUBLE_EQ(per_layer.ops[0].time_us_per_step, 40);
  EXPECT_DOUBLE_EQ(per_layer.ops[0].roofline, 0.25);
  EXPECT_EQ(per_layer.ops[1].key, "layer.0.gemm");
  EXPECT_EQ(per_layer.ops[2].key, "layer.0.attn");
  EXPECT_DOUBLE_EQ(per_layer.ops[2].time_us_per_step, 10);
  EXPECT_DOUBLE_EQ(per_layer.ops[2].roofline, 1);
  EXPECT_DOUBLE_EQ(per_layer.floor_us_per_step, s.floor_us_per_step);
}

// The KV-pool cast of the story: on every layer an op moves 10x its floor and eats the step.
TEST_F(Synthetic, PlantedWholePoolCopyIsFlaggedAndFirst) {
  for (int step = 0; step < 4; ++step) {  // the first is the warm-up
    prof->begin_step();
    for (int layer = 0; layer < 4; ++layer) {
      op(fmt::format("layer.{}.attn.mla_decode", layer), 10, {1e6, 0, 1e6});  // at its floor
      op(fmt::format("layer.{}.attn.kv_cast", layer), 100, {1e6, 1e7, 0});    // 10x its floor, at full speed
      op(fmt::format("layer.{}.moe.experts", layer), 12, {1e6, 0, 1e6});
    }
    prof->end_step();
  }
  Summary s = summarize(*prof, given());
  ASSERT_EQ(s.ops.size(), 3u);
  const OpStats& cast = s.ops[0];
  EXPECT_EQ(cast.key, "attn.kv_cast");
  EXPECT_TRUE(cast.flag_bytes);
  EXPECT_TRUE(cast.flag_time);  // 100/122 of the step vs 1/3 of the floor
  EXPECT_DOUBLE_EQ(cast.moved_over_floor, 10);
  EXPECT_DOUBLE_EQ(cast.gbps, 100);  // it streams at the ceiling: only the bytes give it away
  EXPECT_DOUBLE_EQ(cast.calls_per_step, 4);
  EXPECT_FALSE(s.ops[1].flagged());
  EXPECT_FALSE(s.ops[2].flagged());

  std::string table = format_table(s);
  std::istringstream lines(table);
  std::string line, first_row;
  while (std::getline(lines, line)) {
    if (line.starts_with("op ")) {
      std::getline(lines, first_row);
      break;
    }
  }
  EXPECT_TRUE(first_row.starts_with("attn.kv_cast")) << table;
  EXPECT_NE(first_row.find("!! bytes 10.0x floor"), std::string::npos) << table;
  EXPECT_NE(first_row.find("10.00x"), std::string::npos) << table;
  EXPECT_NE(table.find("(outside ops)"), std::string::npos) << table;
  EXPECT_NE(table.find("memory 100.0 GB/s, matrix 1000.0 GFLOP/s (given)"), std::string::npos) << table;

  nlohmann::json j = summary_json(s);
  EXPECT_EQ(j["ops"][0]["op"], "attn.kv_cast");
  EXPECT_EQ(j["ops"][0]["flags"], (nlohmann::json{"bytes", "time"}));
  EXPECT_DOUBLE_EQ(j["ops"][0]["moved_over_floor"].get<double>(), 10);
  EXPECT_EQ(j["ops"][1]["flags"].size(), 0u);
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["ceilings"]["source"], "given");
}

TEST_F(Synthetic, FlagThresholds) {
  prof->begin_step();  // warm-up
  prof->end_step();
  prof->begin_step();
  op("bytes_ok", 14, {1e6, 1.4e6, 0});   // 1.4x: within the rule
  op("bytes_bad", 16, {1e6, 1.6e6, 0});  // 1.6x
  op("slow", 200, {1e6, 0, 0});          // at 1x bytes, 20x slower than its floor
  op("slow_but_small", 9, {1e4, 0, 0});  // 0.1 us floor, 9 us: far above, but < 5% of the step
  op("no_cost", 30, {});                 // no floor at all and 11% of the step
  prof->end_step();
  Summary s = summarize(*prof, given());
  auto find = [&](std::string_view key) -> const OpStats& {
    for (const auto& o : s.ops)
      if (o.key == key) return o;
    throw std::runtime_error("missing op");
  };
  EXPECT_FALSE(find("bytes_ok").flagged());
  EXPECT_TRUE(find("bytes_bad").flag_bytes);
  EXPECT_FALSE(find("bytes_bad").flag_time);
  EXPECT_TRUE(find("slow").flag_time);
  EXPECT_FALSE(find("slow").flag_bytes);
  EXPECT_FALSE(find("slow_but_small").flagged());
  EXPECT_TRUE(find("no_cost").flag_time);
  EXPECT_DOUBLE_EQ(find("no_cost").moved_over_floor, 0);
  EXPECT_DOUBLE_EQ(find("no_cost").gbps, 0);
  EXPECT_EQ(s.ops[0].key, "slow");
  EXPECT_NE(format_table(s).find("time, no floor"), std::string::npos);
}

TEST_F(Synthetic, BadInputsAreErrors) {
  EXPECT_THROW(summarize(*prof, given()), Error);  // nothing recorded
  prof->begin_step();
  op("a", 1, {1, 0, 1});
  prof->end_step();  // the warm-up step
  EXPECT_THROW(summarize(*prof, given()), Error);
  prof->begin_step();
  op("a", 1, {1, 0, 1});
  prof->end_step();
  Ceilings zero;
  EXPECT_THROW(summarize(*prof, zero), Error);
  EXPECT_NO_THROW(summarize(*prof, given()));
}

TEST(Ceilings, ParseGivenCeilings) {
  Ceilings c = parse_ceilings("3350.5, 989");
  EXPECT_DOUBLE_EQ(c.mem_gbps, 3350.5);
  EXPECT_DOUBLE_EQ(c.matrix_gflops, 989);
  EXPECT_EQ(c.source, "given");
  for (const char* bad : {"", "100", "100,", ",5", "a,b", "100,0", "-1,5", "1,2,3", "1e400,5", "5x,5"}) {
    try {
      parse_ceilings(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--ceilings"), std::string::npos) << e.what();
    }
  }
}

// The floor a benchmark sums from one forward pass: per op the larger of its bytes and FLOPs times, the same
// charge summarize() makes; nothing is timed.
TEST(FloorSink, SumsEachOpsLargerTime) {
  FloorSink sink(given());  // 1e5 bytes/us, 1e6 FLOP/us
  {
    OpScope a(&sink, OpInfo{"layer.0.attn.o_proj", {}, "", {2e5, 0, 1e6}});  // bytes: 2 us (FLOPs 1 us)
  }
  {
    OpScope b(&sink, OpInfo{"lm_head", {}, "", {1e5, 3e5, 5e6}});  // FLOPs: 5 us (bytes 1 us)
  }
  EXPECT_DOUBLE_EQ(sink.floor_us(), 7.0);
  EXPECT_DOUBLE_EQ(sink.bytes_floor(), 3e5);
  EXPECT_EQ(sink.ops(), 2);
  EXPECT_DOUBLE_EQ(op_time_floor_us({2e5, 0, 1e6}, given()), 2.0);
}

TEST(FloorSink, RefusesNonPositiveCeilings) {
  Ceilings c = given();
  c.mem_gbps = 0;
  EXPECT_THROW(FloorSink{c}, Error);
}

}  // namespace
}  // namespace ms::profiler
