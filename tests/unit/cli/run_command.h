// Running the moeserve binary (MS_BINARY) from a CLI test as a user runs it, through the shell.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ms::test {

struct CmdResult {
  int status = -1;  // pclose's status (WEXITSTATUS gives the exit code)
  std::string out;  // stdout, and stderr too when asked for
};

// `env` goes before the command (VAR=value ...), `redirect` after it (e.g. "< file"); stdout only unless
// `with_stderr`.
inline CmdResult run_moeserve(const std::string& args, bool with_stderr, const std::string& env = {},
                              const std::string& redirect = {}) {
  std::string cmd = env + (env.empty() ? "" : " ") + std::string(MS_BINARY) + " " + args;
  if (!redirect.empty()) cmd += " " + redirect;
  cmd += with_stderr ? " 2>&1" : " 2>/dev/null";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = pclose(p);
  return r;
}

// The trained built-in model's checkpoint in the source tree (models/builtin).
inline std::filesystem::path trained_builtin_dir() {
  return std::filesystem::path(MS_TEST_DATA).parent_path().parent_path() / "models" / "builtin";
}

// Whether the commands' default model is the trained built-in checkpoint (the random built-in model, made in
// code, has none to split or load): $MOESERVE_BUILTIN_MODEL=random says it is not.
inline bool have_trained_builtin() {
  if (const char* env = std::getenv("MOESERVE_BUILTIN_MODEL"); env && *env)
    return std::string(env) != "random";
  return std::filesystem::exists(trained_builtin_dir() / "config.json");
}

}  // namespace ms::test
