// Subcommands register themselves: each cmd_*.cpp defines one static ms::cli::Registration.
// The files of src/cli are compiled straight into the executable, so every registration is linked.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace ms::cli {

// setup adds the subcommand's options to `sub` and returns the function that runs it (its exit code).
using Setup = std::function<std::function<int()>(CLI::App& sub)>;

struct CommandSpec {
  std::string name, help;
  Setup setup;
};

std::vector<CommandSpec>& command_registry();

struct Registration {
  Registration(std::string name, std::string help, Setup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace ms::cli
