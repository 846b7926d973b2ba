// `moeserve bench-one-batch` on the built-in model: one result per batch size, with the prefill in one step,
// output_len - 1 decode steps, and figures that agree with each other.
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
    ++i;
  }
}

TEST(BenchOneBatch, BadBatchSizeNamesTheFlag) {
  int status = -1;
  const std::string out = run("bench-one-batch --batch-size 1,x", status, true);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--batch-size: 'x'"), std::string::npos) << out;
}

}  // namespace
