// The `moeserve` command: one subcommand per job, each in its own cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"

namespace ms::cli {
std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}
}  // namespace ms::cli

int main(int argc, char** argv) {
  ms::log_init();
  CLI::App app{
      "moeserve: inference engine and OpenAI-compatible server for GLM-5 / DeepSeek-V3-family MoE models.\n"
      "Run `moeserve SUBCOMMAND --help` for the options of each subcommand."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moeserve 0.1.0");
  auto& registry = ms::cli::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::function<int()> run;
  std::vector<std::pair<CLI::App*, std::function<int()>>> subs;
  for (auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    subs.emplace_back(sub, spec.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, fn] : subs)
      if (sub->parsed()) return fn();
  } catch (const ms::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
