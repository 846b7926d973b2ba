// Every command that runs a model takes the shared engine flags, spelled, defaulted and documented alike
// (cli/engine_flags), and a bad --device is refused before any model loads.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "run_command.h"

namespace {

using ms::test::CmdResult;

CmdResult run(const std::string& args) {
  return ms::test::run_moeserve(args, true);
}

// The --help line of `flag`, or "" when the command has no such flag.
std::string help_line(const std::string& help, const std::string& flag) {
  for (size_t at = help.find("  " + flag + " "); at != std::string::npos;
       at = help.find("  " + flag + " ", at + 1)) {
    const size_t end = help.find('\n', at);
    return help.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }
  return {};
}

const char* const kEngineCommands[] = {"serve",   "generate", "chat",       "bench-one-batch",
                                       "profile", "logits",   "perplexity", "moe-eval"};

TEST(EngineFlags, EveryEngineCommandTakesTheSharedFlags) {
  for (const char* c : kEngineCommands) {
    SCOPED_TRACE(c);
    const CmdResult r = run(std::string(c) + " --help");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(help_line(r.out, "--model").find("Hugging Face checkpoint directory"), std::string::npos)
        << r.out;
    EXPECT_NE(help_line(r.out, "--device").find("{auto,cuda,cpu}=auto"), std::string::npos) << r.out;
    EXPECT_NE(help_line(r.out, "--disable-cuda-graph"), "") << r.out;
    EXPECT_NE(help_line(r.out, "--disable-pdl"), "") << r.out;
    // Help says what the option accepts, f32 included (#15).
    const std::string kv = help_line(r.out, "--kv-cache-dtype");
    EXPECT_NE(kv.find("f32 (exact), bf16 or fp8_e4m3"), std::string::npos) << r.out;
    // logits and moe-eval compare exactly by default; the rest take what the checkpoint asks for.
    const std::string want = std::string(c) == "logits" || std::string(c) == "moe-eval" ? "=f32" : "=auto";
    EXPECT_NE(kv.find(want), std::string::npos) << kv;
  }
}

TEST(EngineFlags, GroupsOnlyWhereTheyApply) {
  const std::string serve = run("serve --help").out, generate = run("generate --help").out,
                    logits = run("logits --help").out, profile = run("profile --help").out;
  EXPECT_NE(help_line(serve, "--max-running-requests"), "");
  EXPECT_NE(help_line(serve, "--oea-k0"), "");
  EXPECT_NE(help_line(generate, "--oea-kmax"), "");
  EXPECT_EQ(help_line(generate, "--max-running-requests"), "");
  EXPECT_NE(help_line(profile, "--kv-cache-tokens"), "");
  EXPECT_EQ(help_line(logits, "--page-size"), "");
  EXPECT_EQ(help_line(logits, "--oea-k0"), "");
}

TEST(EngineFlags, BadDeviceIsRefused) {
  for (const char* c : {"logits --prompt-ids 1,2 --out /dev/null", "moe-eval --batch 2 --k0 1",
                        "perplexity --text /dev/null"}) {
    SCOPED_TRACE(c);
    const CmdResult r = run(std::string(c) + " --device tpu");
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.out.find("--device"), std::string::npos) << r.out;
  }
}

// --load-format dummy and --quantization on the commands that time a model, and only there.
TEST(EngineFlags, LoadFormatOnTheTimingCommands) {
  for (const char* c : {"serve", "generate", "bench-one-batch", "profile"}) {
    SCOPED_TRACE(c);
    const std::string h = run(std::string(c) + " --help").out;
    EXPECT_NE(help_line(h, "--load-format").find("=auto"), std::string::npos) << h;
    EXPECT_NE(help_line(h, "--quantization").find("nvfp4, fp8"), std::string::npos) << h;
  }
  for (const char* c : {"logits", "perplexity", "moe-eval"}) {
    SCOPED_TRACE(c);
    EXPECT_EQ(help_line(run(std::string(c) + " --help").out, "--load-format"), "");
  }
}

// A dummy model from a config alone runs through generate and bench-one-batch on the CPU, logging what was
// made; bad values are refused naming their flag.
TEST(EngineFlags, LoadFormatDummyRuns) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("moeserve_flags_dummy_" + std::to_string(getpid()));
  fs::remove_all(dir);
  ASSERT_EQ(run("gen-model --preset tiny --out '" + dir.string() + "'").status, 0);
  // The config alone: the dummy load must not need the safetensors.
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != "config.json") fs::remove(e.path());
  const std::string m = " --device cpu --model '" + dir.string() + "'";

  CmdResult r =
      run("generate --load-format dummy --quantization nvfp4 --prompt-ids 1,2,3 --max-tokens 3 "
          "--print-ids" +
          m);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("dummy weights (glm_moe_dsa nvfp4, seed 0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("params"), std::string::npos) << r.out;

  r =
      run("bench-one-batch --load-format dummy --quantization fp8 --batch-size 1 --input-len 8 --output-len 2"
          " --json" +
          m);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("glm_moe_dsa fp8"), std::string::npos) << r.out;

  r = run("generate --load-format dummy --quantization int4 --prompt-ids 1,2 --max-tokens 1" + m);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--quantization 'int4'"), std::string::npos) << r.out;

  r = run("generate --load-format random --prompt-ids 1,2 --max-tokens 1" + m);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--load-format 'random'"), std::string::npos) << r.out;

  // Without --load-format dummy a checkpoint keeps its own format.
  r = run("generate --quantization fp8 --prompt-ids 1,2 --max-tokens 1" + m);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--load-format dummy"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
