// `moeserve backends [--json] [--target PART]`: every attention, MoE and linear backend, what it supports,
// and whether it can run here (or on a named part), and if not why.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "ops/backends.h"

namespace ms::cli {

namespace {

struct BackendsOptions {
  bool json = false;
  std::string target;  // empty: this machine
};

int run_backends(const BackendsOptions& o) {
  std::optional<cuda::DeviceLimits> target;
  if (o.target == "h200" || o.target == "h100")
    target = cuda::limits_h200();
  else if (o.target == "b200")
    target = cuda::limits_b200();
  else if (o.target == "rtx-pro-6000")
    target = cuda::limits_rtx_pro_6000();
  else
    MS_CHECK(o.target.empty(), "--target '{}' is not one of h100, h200, b200, rtx-pro-6000", o.target);
  const auto list = ops::list_backends(target ? &*target : nullptr);
  if (o.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& b : list)
      j.push_back({{"kind", b.kind},
                   {"name", b.name},
                   {"device", b.device},
                   {"formats", b.formats},
                   {"shapes", b.shapes},
                   {"arch", b.arch},
                   {"smem_bytes", b.smem_bytes},
                   {"usable", b.usable},
                   {"why", b.why}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-10s %-15s %-6s %-7s %s\n", "kind", "backend", "device", "usable", "supports / why not");
  for (const auto& b : list) {
    std::printf("%-10s %-15s %-6s %-7s %s; %s; %s%s\n", b.kind.c_str(), b.name.c_str(), b.device.c_str(),
                b.usable ? "yes" : "no", b.formats.c_str(), b.shapes.c_str(), b.arch.c_str(),
                b.smem_bytes
                    ? fmt::format("; {} KiB shared memory per block", (b.smem_bytes + 1023) / 1024).c_str()
                    : "");
    if (!b.usable) std::printf("%-10s %-15s %-6s %-7s -> %s\n", "", "", "", "", b.why.c_str());
  }
  return 0;
}

const Registration reg(
    "backends", "Every attention, MoE and linear backend, what it supports, and whether it can run here",
    [](CLI::App& app) {
      auto o = std::make_shared<BackendsOptions>();
      app.add_flag("--json", o->json, "Print the list as JSON");
      app.add_option("--target", o->target,
                     "Judge the CUDA backends for a part instead of this machine: h100, h200, b200 "
                     "or rtx-pro-6000 (limits from kernels/cuda/common/kernel_fit.h)");
      return [o]() { return run_backends(*o); };
    });

}  // namespace

}  // namespace ms::cli
