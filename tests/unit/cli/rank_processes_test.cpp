// `--rank-processes`: one process per rank on the CPU (ranks over TCP, rank 0 leads the step plan), run as a
// user runs it: greedy ids equal the unsplit model's; a worker that dies fails the command naming its rank.
// `--nnodes 2`: two "nodes" as two commands on this machine, joined through --dist-init-addr 127.0.0.1:port.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "run_command.h"

namespace {

namespace fs = std::filesystem;

using ms::test::CmdResult;

// `env` is prepended to the command line (VAR=value ...).
CmdResult run(const std::string& args, bool with_stderr, const std::string& env = {}) {
  return ms::test::run_moeserve(args, with_stderr, env);
}

// The split needs the trained built-in model's checkpoint (the random one is made in code).
bool have_checkpoint() {
  return ms::test::have_trained_builtin();
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

// Every rank prints its memory plan (weights by role, workspace, KV pages, budget) before it loads.
TEST(RankProcesses, EveryRankPrintsItsMemoryPlanBeforeLoading) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const auto r = run(kBase + "--tp-size 2 --ep-size 2 --rank-processes", true);
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* who : {"rank 0 (host memory", "rank 1 (host memory"})
    EXPECT_NE(r.out.find(who), std::string::npos) << who << "\n" << r.out;
  EXPECT_NE(r.out.find("memory plan per rank (tp 2, ep 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("routed_experts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv cache"), std::string::npos) << r.out;
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
  const std::string model = ms::test::trained_builtin_dir().string();
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

// A port that was free a moment ago, for rank 0's node to listen on.
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return 0;
  ::close(s);
  return ntohs(sa.sin_port);
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Each "node" runs all its ranks on this machine's 2 cores: one OpenMP thread each keeps them from
// starving one another.
const std::string kOneThread = "OMP_NUM_THREADS=1";

struct TwoNodes {
  CmdResult node0, node1;
};

// Node 1 is started first (it retries until node 0 listens), as a second machine would.
TwoNodes run_two_nodes(const std::string& args, const std::string& node1_env = {},
                       bool node0_stderr = false) {
  const std::string addr = "--dist-init-addr 127.0.0.1:" + std::to_string(free_port());
  TwoNodes r;
  std::thread n1(
      [&] { r.node1 = run(args + " --nnodes 2 --node-rank 1 " + addr, true, kOneThread + " " + node1_env); });
  r.node0 = run(args + " --nnodes 2 --node-rank 0 " + addr, node0_stderr, kOneThread);
  n1.join();
  return r;
}

TEST(RankProcesses, TwoNodesGiveTheSameTokensAsOneProcess) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const auto whole = run(kBase, false);
  ASSERT_EQ(whole.status, 0) << whole.out;
  // EP4: two ranks a node, node 1's first process starting rank 3; TP2+EP2: one rank a node.
  for (const char* split : {"--ep-size 4", "--tp-size 2 --ep-size 2"}) {
    const TwoNodes r = run_two_nodes(kBase + split);
    ASSERT_EQ(r.node0.status, 0) << split << ": " << r.node1.out;
    EXPECT_EQ(r.node0.out, whole.out) << split;  // stdout: rank 0's ids alone
    EXPECT_EQ(r.node1.status, 0) << split << ": " << r.node1.out;
    EXPECT_EQ(r.node1.out.find("finish:"), std::string::npos) << "node 1 printed results: " << r.node1.out;
    EXPECT_NE(r.node1.out.find("following rank 0's step plan"), std::string::npos) << r.node1.out;
  }
  const TwoNodes ep4 = run_two_nodes(kBase + "--ep-size 4");
  EXPECT_NE(ep4.node1.out.find("node 1 of 2: rank 3 of 4 on cpu (local rank 1 of 2"), std::string::npos)
      << ep4.node1.out;
}

TEST(RankProcesses, ANodeThatNeverJoinsFailsNodeZeroNamingItWithinTheTimeout) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const auto t0 = std::chrono::steady_clock::now();
  const auto r =
      run(kBase + "--ep-size 4 --nnodes 2 --node-rank 0 --dist-timeout 2 --dist-init-addr 127.0.0.1:" +
              std::to_string(free_port()),
          true, kOneThread);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(exit_code(r.status), 1) << r.out;
  EXPECT_NE(r.out.find("timed out after 2 s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ranks 2, 3 (node 1)"), std::string::npos) << r.out;
  EXPECT_LT(secs, 30.0) << r.out;
  EXPECT_EQ(r.out.find("finish:"), std::string::npos) << r.out;
}

TEST(RankProcesses, ANodeThatDiesMidRunFailsNodeZeroNamingIt) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const TwoNodes r = run_two_nodes(kBase + "--tp-size 2", "MOESERVE_TEST_KILL_RANK=1:3", true);
  EXPECT_EQ(exit_code(r.node1.status), 3) << r.node1.out;
  EXPECT_NE(r.node1.out.find("before step 3"), std::string::npos) << r.node1.out;
  EXPECT_EQ(exit_code(r.node0.status), 1) << r.node0.out;
  EXPECT_NE(r.node0.out.find("step 3: tcp group: rank 1 (node 1) closed its connection"), std::string::npos)
      << r.node0.out;
  EXPECT_NE(r.node0.out.find("the ranks cannot go on"), std::string::npos) << r.node0.out;
  EXPECT_EQ(r.node0.out.find("finish:"), std::string::npos) << r.node0.out;
}

TEST(RankProcesses, NodeFlagsAreCheckedNamingTheFlag) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const std::string g = "generate --prompt hi --max-tokens 2 --device cpu ";
  struct Case {
    std::string args, env, want;
  };
  const Case cases[] = {
      {"--tp-size 2 --nnodes 2 --dist-init-addr nohost", "", "--dist-init-addr='nohost' is not host:port"},
      {"--tp-size 2 --nnodes 2 --node-rank 2 --dist-init-addr h:1", "", "--node-rank 2 is not in 0..1"},
      {"--ep-size 4 --nnodes 3 --dist-init-addr h:1", "", "not a multiple of --nnodes 3"},
      {"--tp-size 2 --nnodes 2", "", "--dist-init-addr host:port (rank 0's node) is needed with --nnodes 2"},
      {"--nnodes 2 --dist-init-addr h:1", "", "with neither above 1 there is one rank"},
      {"--tp-size 2 --nnodes 2 --dist-init-addr h:1",
       "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=5000",
       "--nnodes 2 but torchrun started 1 nodes"},
  };
  for (const Case& c : cases) {
    const auto r = run(g + c.args, true, c.env);
    EXPECT_EQ(exit_code(r.status), 1) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.want), std::string::npos) << c.args << ": " << r.out;
  }
  // bench-one-batch takes the node flags too (it runs on rank processes) and checks them the same way.
  const auto b = run("bench-one-batch --device cpu --model " + ms::test::trained_builtin_dir().string() +
                         " --tp-size 2 --nnodes 2 --dist-init-addr nohost --batch-size 1",
                     true);
  EXPECT_EQ(exit_code(b.status), 1) << b.out;
  EXPECT_NE(b.out.find("--dist-init-addr='nohost' is not host:port"), std::string::npos) << b.out;
}

}  // namespace
