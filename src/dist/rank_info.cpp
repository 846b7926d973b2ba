#include "dist/rank_info.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace ms::dist {
namespace {

// A fixed port for single-node runs under mpirun or srun, where the ranks cannot agree on a random one.
constexpr int kDefaultPort = 29517;

int parse_int(const std::string& name, const std::string& value) {
  int v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || p != end || value.empty()) MS_THROW("{}='{}' is not an integer", name, value);
  return v;
}

struct Reader {
  const EnvLookup& env;
  const char* launcher;
  std::optional<int> opt(const std::string& name) const {
    auto v = env(name);
    if (!v) return std::nullopt;
    return parse_int(name, *v);
  }
  int req(const std::string& name) const {
    auto v = opt(name);
    if (!v) MS_THROW("{} is not set ({} sets it)", name, launcher);
    return *v;
  }
  std::string req_str(const std::string& name, const std::string& hint) const {
    auto v = env(name);
    if (!v || v->empty()) MS_THROW("{} is not set ({})", name, hint);
    return *v;
  }
};

void check_range(const std::string& name, int v, int lo, const std::string& hi_name, int hi) {
  if (v < lo || v >= hi) {
    if (v < lo) MS_THROW("{}={} must be at least {}", name, v, lo);
    MS_THROW("{}={} is not below {}={}", name, v, hi_name, hi);
  }
}

}  // namespace

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::Self:
      return "none";
    case Launcher::Moeserve:
      return "moeserve";
    case Launcher::Torchrun:
      return "torchrun";
    case Launcher::Mpirun:
      return "mpirun";
    case Launcher::Slurm:
      return "srun";
  }
  return "?";
}

std::string RankInfo::init_addr() const {
  bool v6 = master_addr.find(':') != std::string::npos;
  return v6 ? fmt::format("[{}]:{}", master_addr, master_port)
            : fmt::format("{}:{}", master_addr, master_port);
}

std::string RankInfo::describe() const {
  return fmt::format("rank {} of {} (local {} of {}, node {} of {}, from {})", rank, world_size, local_rank,
                     local_world_size, node_rank, nnodes, launcher_name(launcher));
}

std::string RankInfo::rank_name(int rank) const {
  if (nnodes <= 1) return fmt::format("rank {}", rank);
  return fmt::format("rank {} (node {})", rank, node_of(rank));
}

std::string RankInfo::ranks_named(const std::vector<int>& ranks) const {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) {
      s += fmt::format(" and {} more", ranks.size() - 8);
      break;
    }
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  if (nnodes <= 1 || ranks.empty()) return s;
  std::vector<int> nodes;
  for (int r : ranks)
    if (nodes.empty() || nodes.back() != node_of(r)) nodes.push_back(node_of(r));
  s += nodes.size() == 1 ? " (node " : " (nodes ";
  for (size_t i = 0; i < nodes.size(); ++i) s += (i ? ", " : "") + std::to_string(nodes[i]);
  return s + ")";
}

std::pair<std::string, int> parse_host_port(const std::string& s, const std::string& what) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    MS_THROW("{}='{}' is not host:port", what, s);
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = parse_int(what + " port", s.substr(colon + 1));
  if (port < 1 || port > 65535) MS_THROW("{}='{}': port {} is not in 1..65535", what, s, port);
  return {host, port};
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

RankInfo resolve_rank_info(const DistFlags& flags, const EnvLookup& env) {
  MS_CHECK(flags.world_size >= 1, "--tp-size/--ep-size ask for {} ranks", flags.world_size);
  const int nnodes_flag = flags.nnodes.value_or(1), node_rank_flag = flags.node_rank.value_or(0);
  if (nnodes_flag < 1) MS_THROW("--nnodes {} must be at least 1", nnodes_flag);
  if (node_rank_flag < 0 || node_rank_flag >= nnodes_flag)
    MS_THROW("--node-rank {} is not in 0..{} (--nnodes {})", node_rank_flag, nnodes_flag - 1, nnodes_flag);
  std::optional<std::pair<std::string, int>> addr;
  if (!flags.dist_init_addr.empty()) addr = parse_host_port(flags.dist_init_addr, "--dist-init-addr");

  RankInfo r;
  std::string world_var, rank_var, local_var, local_world_var;
  if (env("MOESERVE_RANK")) {
    Reader rd{env, "moeserve's launcher"};
    r.launcher = Launcher::Moeserve;
    world_var = "MOESERVE_WORLD_SIZE", rank_var = "MOESERVE_RANK", local_var = "MOESERVE_LOCAL_RANK";
    local_world_var = "MOESERVE_LOCAL_WORLD_SIZE";
    r.rank = rd.req(rank_var);
    r.world_size = rd.req(world_var);
    r.local_rank = rd.req(local_var);
    r.local_world_size = rd.opt(local_world_var).value_or(r.world_size / nnodes_flag);
    if (!addr)
      addr = parse_host_port(rd.req_str("MOESERVE_DIST_INIT_ADDR", "moeserve's launcher sets it"),
                             "MOESERVE_DIST_INIT_ADDR");
  } else if (env("RANK") && env("WORLD_SIZE")) {
    Reader rd{env, "torchrun"};
    r.launcher = Launcher::Torchrun;
    world_var = "WORLD_SIZE", rank_var = "RANK", local_var = "LOCAL_RANK",
    local_world_var = "LOCAL_WORLD_SIZE";
    r.rank = rd.req(rank_var);
    r.world_size = rd.req(world_var);
    r.local_rank = rd.req(local_var);
    r.local_world_size = rd.opt(local_world_var).value_or(r.world_size);
    if (!addr) {
      std::string host = rd.req_str("MASTER_ADDR", "torchrun sets it; or pass --dist-init-addr");
      int port =
          parse_int("MASTER_PORT", rd.req_str("MASTER_PORT", "torchrun sets it; or pass --dist-init-addr"));
      if (port < 1 || port >= 65535) MS_THROW("MASTER_PORT={} is not in 1..65534", port);
      addr = {host, port + 1};  // torchrun's own store holds MASTER_PORT
    }
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    Reader rd{env, "mpirun"};
    r.launcher = Launcher::Mpirun;
    world_var = "OMPI_COMM_WORLD_SIZE", rank_var = "OMPI_COMM_WORLD_RANK";
    local_var = "OMPI_COMM_WORLD_LOCAL_RANK", local_world_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
    r.rank = rd.req(rank_var);
    r.world_size = rd.req(world_var);
    r.local_rank = rd.req(local_var);
    r.local_world_size = rd.opt(local_world_var).value_or(r.world_size);
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    Reader rd{env, "srun"};
    r.launcher = Launcher::Slurm;
    world_var = "SLURM_NTASKS", rank_var = "SLURM_PROCID", local_var = "SLURM_LOCALID";
    local_world_var = "SLURM_NTASKS / SLURM_NNODES";
    r.rank = rd.req(rank_var);
    r.world_size = rd.req(world_var);
    r.local_rank = rd.req(local_var);
    int nnodes = rd.opt("SLURM_NNODES").value_or(1);
    if (nnodes < 1) MS_THROW("SLURM_NNODES={} must be at least 1", nnodes);
    if (r.world_size % nnodes != 0)
      MS_THROW("SLURM_NTASKS={} is not a multiple of SLURM_NNODES={} (use the same tasks on every node)",
               r.world_size, nnodes);
    r.local_world_size = r.world_size / nnodes;
    if (auto node = rd.opt("SLURM_NODEID")) {
      check_range("SLURM_NODEID", *node, 0, "SLURM_NNODES", nnodes);
      r.node_rank = *node;
    }
  } else {
    r.launcher = Launcher::Self;
    if (flags.world_size % nnodes_flag != 0)
      MS_THROW(
          "--tp-size/--ep-size ask for {} ranks, not a multiple of --nnodes {} (every node runs the same "
          "number of ranks)",
          flags.world_size, nnodes_flag);
    r.world_size = flags.world_size;
    r.nnodes = nnodes_flag;
    r.node_rank = node_rank_flag;
    r.local_world_size = r.world_size / r.nnodes;
    r.rank = r.node_rank * r.local_world_size;
    r.local_rank = 0;
    if (!addr && r.nnodes > 1)
      MS_THROW("--dist-init-addr host:port (rank 0's node) is needed with --nnodes {}", r.nnodes);
    if (addr) r.master_addr = addr->first, r.master_port = addr->second;
    return r;
  }

  if (r.world_size < 1) MS_THROW("{}={} must be at least 1", world_var, r.world_size);
  check_range(rank_var, r.rank, 0, world_var, r.world_size);
  if (r.local_world_size < 1 || r.local_world_size > r.world_size)
    MS_THROW("{}={} is not in 1..{}={}", local_world_var, r.local_world_size, world_var, r.world_size);
  check_range(local_var, r.local_rank, 0, local_world_var, r.local_world_size);
  if (r.world_size % r.local_world_size != 0)
    MS_THROW("{}={} is not a multiple of {}={} (use the same ranks on every node)", world_var, r.world_size,
             local_world_var, r.local_world_size);
  r.nnodes = r.world_size / r.local_world_size;
  if (r.launcher != Launcher::Slurm) r.node_rank = r.rank / r.local_world_size;
  if (r.world_size != flags.world_size)
    MS_THROW("{}={} ({}) but --tp-size/--ep-size ask for {} ranks", world_var, r.world_size,
             launcher_name(r.launcher), flags.world_size);
  // The launcher's variables say where each rank runs; flags that say otherwise are refused, not ignored.
  if (flags.nnodes && *flags.nnodes != r.nnodes)
    MS_THROW(
        "--nnodes {} but {} started {} nodes ({}={}, {}={}); under a launcher its variables win: drop "
        "--nnodes or make it agree",
        *flags.nnodes, launcher_name(r.launcher), r.nnodes, world_var, r.world_size, local_world_var,
        r.local_world_size);
  if (flags.node_rank && *flags.node_rank != r.node_rank)
    MS_THROW(
        "--node-rank {} but {} put this process on node {} ({}={}, {}={}); under a launcher its "
        "variables win: drop --node-rank or make it agree",
        *flags.node_rank, launcher_name(r.launcher), r.node_rank, rank_var, r.rank, local_world_var,
        r.local_world_size);
  if (!addr) {
    if (r.nnodes > 1)
      MS_THROW("--dist-init-addr host:port (rank 0's node) is needed: {} across {} nodes names no address",
               launcher_name(r.launcher), r.nnodes);
    addr = {"127.0.0.1", kDefaultPort};
  }
  r.master_addr = addr->first;
  r.master_port = addr->second;
  return r;
}

RankInfo rank_info_from_env(const DistFlags& flags) {
  return resolve_rank_info(flags, process_env());
}

void set_nccl_env_defaults() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
}

}  // namespace ms::dist
