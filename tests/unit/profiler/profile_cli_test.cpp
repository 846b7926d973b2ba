// `moeserve profile` on the built-in model: exit status, the table, and the trace checked against the Trace
// Event Format (a JSON object with traceEvents of complete "X" events), with one event per op per step.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct CliRun {
  int rc = -1;
  std::string out, err;
};

CliRun run_binary(const std::string& args, const fs::path& dir) {
  CliRun r;
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd =
      std::string("'") + MS_BINARY + "' " + args + " > '" + out.string() + "' 2> '" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

class ProfileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(MS_BINARY)) << MS_BINARY << " is missing: build the moeserve target first";
    dir = fs::temp_directory_path() /
          ("ms_profile_cli_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

// Checks one trace file: every event complete and well-typed, op events inside their step, and each step
// holding the same set of op names, each once. Returns the op names of a step.
std::set<std::string> check_trace(const fs::path& path, int steps) {
  json t = json::parse(slurp(path));  // throws on malformed JSON
  EXPECT_TRUE(t.is_object());
  EXPECT_TRUE(t["traceEvents"].is_array());
  std::vector<json> step_events;
  std::map<int, std::vector<json>> ops_of_step;
  for (const json& e : t["traceEvents"]) {
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_TRUE(e.at("name").is_string());
    EXPECT_TRUE(e.at("ts").is_number());
    EXPECT_TRUE(e.at("dur").is_number());
    EXPECT_GE(e.at("dur").get<double>(), 0);
    EXPECT_TRUE(e.at("pid").is_number_integer());
    EXPECT_TRUE(e.at("tid").is_number_integer());
    if (e.at("cat") == "step") {
      step_events.push_back(e);
    } else {
      EXPECT_EQ(e.at("cat"), "op");
      const json& a = e.at("args");
      EXPECT_TRUE(a.at("shapes").is_string());
      EXPECT_GT(a.at("bytes_floor").get<double>(), 0) << e["name"];
      EXPECT_GE(a.at("bytes_moved").get<double>(), a.at("bytes_floor").get<double>()) << e["name"];
      EXPECT_GE(a.at("flops").get<double>(), 0);
      ops_of_step[a.at("step").get<int>()].push_back(e);
    }
  }
  EXPECT_EQ(static_cast<int>(step_events.size()), steps);
  std::set<std::string> first;
  for (int s = 0; s < static_cast<int>(step_events.size()); ++s) {
    const json& st = step_events[static_cast<size_t>(s)];
    const double b = st["ts"].get<double>(), e = b + st["dur"].get<double>();
    std::set<std::string> names;
    for (const json& op : ops_of_step[s]) {
      EXPECT_TRUE(names.insert(op["name"].get<std::string>()).second)
          << "op twice in step " << s << ": " << op["name"];
      EXPECT_GE(op["ts"].get<double>(), b);
      EXPECT_LE(op["ts"].get<double>() + op["dur"].get<double>(), e + 1e-6);
    }
    EXPECT_EQ(st["args"]["ops"].get<size_t>(), ops_of_step[s].size());
    if (s == 0)
      first = names;
    else
      EXPECT_EQ(names, first) << "step " << s << " ran other ops than step 0";
  }
  return first;
}

TEST_F(ProfileCli, BuiltinModelTableAndTrace) {
  const fs::path trace = dir / "trace.json";
  CliRun r = run_binary(
      "profile --batch 2 --context 40 --steps 3 --warmup 1 --ceilings 20,100 --prefill-tokens 24 "
      "--trace '" +
          trace.string() + "'",
      dir);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("== decode =="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory 20.0 GB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attn.mla_decode"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("== prefill: one step of 24 tokens =="), std::string::npos) << r.out;
  // Decode moves no more than its floors; the prefill step may (its attention re-reads keys per query).
  const std::string decode = r.out.substr(0, r.out.find("== prefill"));
  EXPECT_EQ(decode.find("!! bytes"), std::string::npos) << "a decode op moves more than its floor:\n"
                                                        << r.out;

  const std::set<std::string> names = check_trace(trace, 3);
  for (const char* n :
       {"embed", "layer.0.attn.mla_decode", "layer.0.indexer.topk", "layer.0.mlp.gate_up",
        "layer.1.moe.experts", "layer.2.indexer.topk", "layer.2.moe.shared.down", "final_norm", "lm_head"})
    EXPECT_EQ(names.count(n), 1u) << n;
  EXPECT_EQ(names.count("layer.1.indexer.topk"), 0u) << "layer 1 shares layer 0's selection";
  for (int l = 0; l < 3; ++l) EXPECT_EQ(names.count("layer." + std::to_string(l) + ".attn.o_proj"), 1u);

  const std::set<std::string> prefill = check_trace(dir / "trace.prefill.json", 1);
  EXPECT_EQ(prefill.count("layer.0.attn.mla"), 1u);  // a prefill step runs the non-decode attention
}

TEST_F(ProfileCli, JsonAndPerLayer) {
  CliRun r = run_binary(
      "profile --batch 1 --context 8 --steps 2 --warmup 0 --ceilings 20,100 --per-layer --json", dir);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  json j = json::parse(r.out);
  ASSERT_TRUE(j.contains("decode"));
  bool per_layer = false;
  for (const json& op : j["decode"]["ops"]) per_layer |= op["op"] == "layer.2.moe.experts";
  EXPECT_TRUE(per_layer) << j.dump(1);
}

TEST_F(ProfileCli, BadOptionsNameTheField) {
  CliRun r = run_binary("profile --batch 0", dir);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--batch"), std::string::npos) << r.err;
  r = run_binary("profile --context 5000 --ceilings 20,100", dir);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

}  // namespace
