// `moeserve bench-one-batch` on the built-in model: one result per batch size, with the prefill in one step,
// output_len - 1 decode steps, and figures that agree with each other; the decode step's floor from the ops
// of the first decode step over the ceilings (measured, or given with --ceilings).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "run_command.h"

namespace {

std::string run(const std::string& args, int& status, bool with_stderr = false) {
  ms::test::CmdResult r = ms::test::run_moeserve(args, with_stderr);
  status = r.status;
  return r.out;
}

TEST(BenchOneBatch, BuiltinModelJson) {
  int status = -1;
  const std::string out =
      run("bench-one-batch --batch-size 1,4 --input-len 24 --output-len 5 --json", status);
  ASSERT_EQ(status, 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["results"].size(), 2u);
  int i = 0;
  for (const auto& r : j["results"]) {
    EXPECT_EQ(r["batch_size"], i == 0 ? 1 : 4);
    EXPECT_EQ(r["input_len"], 24);
    EXPECT_EQ(r["output_len"], 5);
    EXPECT_EQ(r["prefill_steps"], 1);
    EXPECT_EQ(r["decode_steps"], 4);
    const double prefill = r["prefill_latency_s"], step = r["median_decode_step_s"];
    EXPECT_GT(prefill, 0);
    EXPECT_GT(step, 0);
    EXPECT_NEAR(r["decode_tokens_per_s"].get<double>(), r["batch_size"].get<int>() / step, 1e-6 / step);
    EXPECT_GE(r["total_latency_s"].get<double>(), prefill);
    // The floor of the first decode step at the ceilings measured at start; that step is out of the medians.
    const double floor = r["decode_floor_s"];
    EXPECT_GT(floor, 0);
    EXPECT_NEAR(r["decode_step_over_floor"].get<double>(), step / floor, 1e-9 * step / floor);
    EXPECT_TRUE(r["floor_step_excluded"].get<bool>());
    ++i;
  }
  EXPECT_EQ(j["ceilings"]["source"], "measured");
  EXPECT_GT(j["ceilings"]["mem_gbps"].get<double>(), 0);
}

// Given ceilings scale the floor: ten times the bandwidth and the matrix rate, a tenth of the floor. With one
// decode step (output 2) that step is both timed and the floor's.
TEST(BenchOneBatch, FloorFollowsGivenCeilings) {
  auto floor_at = [](const std::string& ceilings, bool& excluded) {
    int status = -1;
    const std::string out = run(
        "bench-one-batch --batch-size 2 --input-len 16 --output-len 2 --json --ceilings " + ceilings, status);
    EXPECT_EQ(status, 0) << out;
    const auto r = nlohmann::json::parse(out)["results"][0];
    EXPECT_EQ(r["decode_steps"], 1);
    EXPECT_GT(r["median_decode_step_s"].get<double>(), 0);
    excluded = r["floor_step_excluded"];
    return r["decode_floor_s"].get<double>();
  };
  bool ex1 = true, ex2 = true;
  const double slow = floor_at("10,100", ex1), fast = floor_at("100,1000", ex2);
  EXPECT_GT(slow, 0);
  EXPECT_NEAR(fast, slow / 10, 1e-9 * slow);
  EXPECT_FALSE(ex1);
  EXPECT_FALSE(ex2);
}

TEST(BenchOneBatch, NoRooflineMeasuresNothing) {
  int status = -1;
  const std::string out =
      run("bench-one-batch --batch-size 1 --input-len 8 --output-len 4 --json --no-roofline", status);
  ASSERT_EQ(status, 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_FALSE(j.contains("ceilings"));
  const auto r = j["results"][0];
  EXPECT_EQ(r["decode_floor_s"], 0.0);
  EXPECT_FALSE(r["floor_step_excluded"].get<bool>());
  EXPECT_EQ(r["decode_steps"], 3);
}

TEST(BenchOneBatch, BadCeilingsNameTheFlag) {
  int status = -1;
  const std::string out = run("bench-one-batch --batch-size 1 --ceilings 10", status, true);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--ceilings '10'"), std::string::npos) << out;
}

TEST(BenchOneBatch, BadBatchSizeNamesTheFlag) {
  int status = -1;
  const std::string out = run("bench-one-batch --batch-size 1,x", status, true);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--batch-size: 'x'"), std::string::npos) << out;
}

}  // namespace
