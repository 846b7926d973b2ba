// `--rank-processes`: one process per rank on the CPU (ranks over TCP, rank 0 leads the step plan), run as a
// user runs it: greedy ids equal the unsplit model's; a worker that dies fails the command naming its rank.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

namespace fs = std::filesystem;

struct CmdResult {
  int status = -1;
  std::string out;
};

// `env` is prepended to the command line (VAR=value ...).
CmdResult run(const std::string& args, bool with_stderr, const std::string& env = {}) {
  const std::string cmd = env + (env.empty() ? "" : " ") + std::string(MS_BINARY) + " " + args +
                          (with_stderr ? " 2>&1" : " 2>/dev/null");
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = pclose(p);
  return r;
}

// The split needs the trained built-in model's checkpoint (the random one is made in code).
bool have_checkpoint() {
  if (const char* env = std::getenv("MOESERVE_BUILTIN_MODEL"); env && *env)
    return std::string(env) != "random";
  return fs::exists(fs::path(MS_TEST_DATA).parent_path().parent_path() / "models" / "builtin" /
                    "config.json");
}

const std::string kBase = "generate --prompt 'The package manager' --max-tokens 8 --print-ids --device cpu ";

TEST(RankProcesses, GiveTheSameTokensAsOneProcess) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const auto whole = run(kBase, false);
  ASSERT_EQ(whole.status, 0) << whole.out;
  ASSERT_NE(whole.out.find('['), std::string::npos) << whole.out;
  for (const char* split : {"--tp-size 2", "--ep-size 2", "--tp-size 2 --ep-size 2"}) {
    const auto r = run(kBase + split + " --rank-processes", false);
    ASSERT_EQ(r.status, 0) << split << ": " << run(kBase + split + " --rank-processes", true).out;
    EXPECT_EQ(r.out, whole.out) << split;  // stdout: rank 0's ids alone
  }
}

TEST(RankProcesses, AWorkerThatDiesFailsTheCommandNamingIt) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const auto r = run(kBase + "--tp-size 2 --rank-processes", true, "MOESERVE_TEST_KILL_RANK=1");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("finish:"), std::string::npos) << r.out;
}

TEST(RankProcesses, BenchOneBatchRunsEveryBatchSizeOnTheRanks) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const std::string model =
      (fs::path(MS_TEST_DATA).parent_path().parent_path() / "models" / "builtin").string();
  const auto r = run("bench-one-batch --device cpu --model " + model +
                         " --tp-size 2 --rank-processes --batch-size 1,3 --input-len 8 --output-len 3 --json",
                     false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("results").size(), 2u) << r.out;
  for (const auto& res : j.at("results")) {
    EXPECT_EQ(res.at("decode_steps").get<int>(), 2) << res.dump();  // 3 tokens: 1 from the prefill, 2 decode
    EXPECT_GT(res.at("median_decode_step_s").get<double>(), 0.0) << res.dump();
  }
  EXPECT_EQ(j.at("results")[1].at("batch_size").get<int>(), 3);
}

}  // namespace
