// EPLB-style expert placement as a user runs it: record the routing counts, replicate each layer's hottest
// experts over expert-parallel ranks (threads and rank processes), save and reload the placement; the greedy
// ids equal the unsplit model's. Flags that cannot work are refused with what to do.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "run_command.h"

namespace {

namespace fs = std::filesystem;

using ms::test::CmdResult;

CmdResult run(const std::string& args, bool with_stderr) {
  return ms::test::run_moeserve(args, with_stderr);
}

// The split needs the trained built-in model's checkpoint (the random one is made in code).
bool have_checkpoint() {
  return ms::test::have_trained_builtin();
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

const std::string kBase = "generate --prompt 'The package manager' --max-tokens 8 --print-ids --device cpu ";

TEST(ExpertPlacementCli, RecordReplicateSaveAndLoadGiveTheSameTokens) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const fs::path dir = fs::temp_directory_path() / "ms_eplb_cli_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string dist = (dir / "dist.json").string(), placement = (dir / "placement.json").string();

  const auto whole = run(kBase, false);
  ASSERT_EQ(whole.status, 0) << whole.out;
  ASSERT_NE(whole.out.find('['), std::string::npos) << whole.out;

  // Recording changes nothing in the output and writes every MoE layer's counts.
  const auto rec = run(kBase + "--expert-distribution-out " + dist, false);
  ASSERT_EQ(rec.status, 0) << run(kBase + "--expert-distribution-out " + dist, true).out;
  EXPECT_EQ(rec.out, whole.out);
  const auto d = read_json(dist);
  const int n_experts = d.at("n_experts").get<int>();
  ASSERT_EQ(n_experts, 16);
  ASSERT_FALSE(d.at("layers").empty());
  for (const auto& [layer, counts] : d.at("layers").items()) {
    ASSERT_EQ(counts.size(), 16u) << layer;
    uint64_t total = 0;
    for (const auto& c : counts) total += c.get<uint64_t>();
    EXPECT_GT(total, 0u) << layer;
  }

  // Threads: EP2 with 2 and EP4 with 8 redundant experts from the record; the first saves its placement.
  const std::string ep2 = "--ep-size 2 --ep-num-redundant-experts 2 --expert-distribution " + dist +
                          " --ep-placement-out " + placement;
  const auto t2 = run(kBase + ep2, false);
  ASSERT_EQ(t2.status, 0) << run(kBase + ep2, true).out;
  EXPECT_EQ(t2.out, whole.out);
  const auto p = read_json(placement);
  EXPECT_EQ(p.at("ep_size"), 2);
  EXPECT_EQ(p.at("layers").size(), d.at("layers").size());
  for (const auto& [layer, ranks] : p.at("layers").items())
    for (const auto& r : ranks) EXPECT_EQ(r.size(), 9u) << layer;  // 16 / 2 + 2 / 2
  const std::string ep4 = "--ep-size 4 --ep-num-redundant-experts 8 --expert-distribution " + dist;
  const auto t4 = run(kBase + ep4, false);
  ASSERT_EQ(t4.status, 0) << run(kBase + ep4, true).out;
  EXPECT_EQ(t4.out, whole.out);

  // Rank processes: the saved placement loaded by every rank, with EP alone and with TP2 + EP2; rank 0
  // records the same counts as the unsplit run (routing is replicated).
  const std::string dist2 = (dir / "dist2.json").string();
  for (const char* split : {"--ep-size 2", "--tp-size 2 --ep-size 2"}) {
    const std::string args = std::string(split) + " --ep-placement " + placement +
                             " --rank-processes --expert-distribution-out " + dist2;
    const auto r = run(kBase + args, false);
    ASSERT_EQ(r.status, 0) << split << ": " << run(kBase + args, true).out;
    EXPECT_EQ(r.out, whole.out) << split;
    EXPECT_EQ(read_json(dist2), d) << split;
  }
  fs::remove_all(dir);
}

TEST(ExpertPlacementCli, RefusalsSayWhatToDo) {
  if (!have_checkpoint()) GTEST_SKIP() << "the random built-in model has no checkpoint to split";
  const fs::path dir = fs::temp_directory_path() / "ms_eplb_cli_refusals";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string placement = (dir / "placement.json").string();
  auto fails_with = [&](const std::string& args, const std::string& want) {
    const auto r = run(kBase + args, true);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << ":\n" << r.out;
  };
  fails_with("--ep-size 2 --ep-num-redundant-experts 2", "record one first with --expert-distribution-out");
  fails_with("--ep-num-redundant-experts 2", "need --ep-size 2 or more");
  // A placement saved for EP2 (contiguous: --ep-placement-out alone) does not fit EP4.
  ASSERT_EQ(run(kBase + "--ep-size 2 --ep-placement-out " + placement, false).status, 0);
  fails_with("--ep-size 4 --ep-placement " + placement,
             "ep_size: the expert placement is for 2 ranks, --ep-size is 4");
  std::ofstream(dir / "dist.json") << R"({"n_experts": 8, "layers": {"1": [1, 2, 3, 4, 5, 6, 7, 8]}})";
  fails_with("--ep-size 2 --ep-num-redundant-experts 2 --expert-distribution " + (dir / "dist.json").string(),
             "n_experts: the expert distribution counts 8 experts, the model has 16");
  fails_with("--ep-size 2 --ep-num-redundant-experts 3 --expert-distribution " + (dir / "dist.json").string(),
             "must be a multiple of --ep-size 2");
  fs::remove_all(dir);
}

}  // namespace
