#include "profiler/trace.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "core/error.h"
#include "fake_timer.h"

namespace ms::profiler {
namespace {

using nlohmann::json;
using testing::FakeTimer;

// Three recorded steps of 2 layers x 2 ops after one warm-up step.
std::unique_ptr<Profiler> three_steps() {
  auto t = std::make_unique<FakeTimer>();
  FakeTimer* timer = t.get();
  auto p = std::make_unique<Profiler>(ProfilerOptions{.warmup_steps = 1}, std::move(t));
  for (int step = 0; step < 4; ++step) {
    p->begin_step(step == 2 ? "decode bs=2" : "");
    timer->advance(3);
    for (int layer = 0; layer < 2; ++layer) {
      {
        OpScope s(
            p.get(),
            OpInfo{fmt::format("layer.{}.attn.mla_decode", layer), {}, "q bf16[2,64,576]", {1000, 0, 2e6}});
        timer->advance(10 + layer);
      }
      {
        OpScope s(
            p.get(),
            OpInfo{
                fmt::format("layer.{}.moe.experts", layer), {}, "w nvfp4[8,4096,6144]", {5000, 8000, 1e7}});
        timer->advance(20);
      }
      timer->advance(1);
    }
    p->end_step();
    timer->advance(100);
  }
  return p;
}

// Checks the Trace Event Format rules this exporter promises: every event a complete "X" event with name,
// cat, numeric ts >= 0 and dur >= 0 (microseconds), integer pid and tid, and object args.
void expect_well_formed(const json& trace) {
  ASSERT_TRUE(trace.is_object());
  ASSERT_TRUE(trace.contains("traceEvents"));
  ASSERT_TRUE(trace["traceEvents"].is_array());
  for (const json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.is_object()) << e;
    EXPECT_EQ(e.at("ph"), "X") << e;
    EXPECT_TRUE(e.at("name").is_string()) << e;
    EXPECT_TRUE(e.at("cat").is_string()) << e;
    EXPECT_TRUE(e.at("ts").is_number()) << e;
    EXPECT_TRUE(e.at("dur").is_number()) << e;
    EXPECT_GE(e.at("ts").get<double>(), 0) << e;
    EXPECT_GE(e.at("dur").get<double>(), 0) << e;
    EXPECT_TRUE(e.at("pid").is_number_integer()) << e;
    EXPECT_TRUE(e.at("tid").is_number_integer()) << e;
    EXPECT_TRUE(e.at("args").is_object()) << e;
  }
}

TEST(Trace, WellFormedOneSlicePerOpPerStep) {
  auto p = three_steps();
  auto path = std::filesystem::temp_directory_path() / fmt::format("moeserve_trace_{}.json", ::getpid());
  write_trace(*p, path.string(), {.pid = 3, .tid = 7});
  std::ifstream f(path);
  json trace = json::parse(f);  // throws on malformed JSON
  std::filesystem::remove(path);
  expect_well_formed(trace);

  std::map<std::string, int> op_count;
  std::vector<json> step_events;
  for (const json& e : trace["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    EXPECT_EQ(e["tid"], 7);
    if (e["cat"] == "step") {
      step_events.push_back(e);
    } else {
      ASSERT_EQ(e["cat"], "op");
      ++op_count[e["name"].get<std::string>()];
    }
  }
  ASSERT_EQ(step_events.size(), 3u);  // the warm-up step is not in the trace
  EXPECT_EQ(op_count.size(), 4u);
  for (const auto& [name, count] : op_count) EXPECT_EQ(count, 3) << name;
  EXPECT_EQ(step_events[1]["name"], "decode bs=2");
  EXPECT_EQ(step_events[0]["name"], "step 0");

  // Times in microseconds from the first recorded step; the step is 3 + (10+20+1) + (11+20+1) = 66 us.
  EXPECT_DOUBLE_EQ(step_events[0]["ts"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(step_events[0]["dur"].get<double>(), 66);
  EXPECT_DOUBLE_EQ(step_events[1]["ts"].get<double>(), 166);

  // Every op slice lies inside its step's slice (so viewers nest them), and carries its cost.
  for (const json& e : trace["traceEvents"]) {
    if (e["cat"] != "op") continue;
    const json& st = step_events.at(e["args"]["step"].get<size_t>());
    double ts = e["ts"], dur = e["dur"], sts = st["ts"], sdur = st["dur"];
    EXPECT_GE(ts, sts) << e;
    EXPECT_LE(ts + dur, sts + sdur) << e;
    const json& args = e["args"];
    if (e["name"] == "layer.1.moe.experts") {
      EXPECT_EQ(args["kind"], "moe.experts");
      EXPECT_EQ(args["shapes"], "w nvfp4[8,4096,6144]");
      EXPECT_DOUBLE_EQ(args["bytes_floor"].get<double>(), 5000);
      EXPECT_DOUBLE_EQ(args["bytes_moved"].get<double>(), 8000);
      EXPECT_DOUBLE_EQ(args["flops"].get<double>(), 1e7);
      EXPECT_DOUBLE_EQ(dur, 20);
    }
    if (e["name"] == "layer.1.attn.mla_decode") {
      EXPECT_DOUBLE_EQ(dur, 11);
      EXPECT_DOUBLE_EQ(args["bytes_moved"].get<double>(), 1000);  // unset: the floor
    }
  }
}

TEST(Trace, EmptyProfilerGivesAnEmptyValidTrace) {
  Profiler p;
  json t = trace_json(p);
  expect_well_formed(t);
  EXPECT_TRUE(t["traceEvents"].empty());
}

TEST(Trace, UnwritablePathIsAnErrorNamingIt) {
  auto p = three_steps();
  try {
    write_trace(*p, "/nonexistent-dir/x/trace.json");
    FAIL() << "wrote to a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x/trace.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ms::profiler
