// Every command that runs a model takes the shared engine flags, spelled, defaulted and documented alike
// (cli/engine_flags), and a bad --device is refused before any model loads.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct CmdResult {
  int status = -1;
  std::string out;
};

CmdResult run(const std::string& args) {
  const std::string cmd = std::string(MS_BINARY) + " " + args + " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = pclose(p);
  return r;
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

}  // namespace
