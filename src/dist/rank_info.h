// Who this process is in a parallel run: rank, world size, local rank (which GPU of its node), node count and
// where rank 0 listens for the NCCL unique-id exchange. Read from whichever launcher started the process, in
// this order (the first that has set its variables wins):
//   1. moeserve's own launcher (launch_local_workers): MOESERVE_RANK, MOESERVE_WORLD_SIZE,
//   MOESERVE_LOCAL_RANK,
//      MOESERVE_LOCAL_WORLD_SIZE, MOESERVE_DIST_INIT_ADDR (its children also inherit the variables of any
//      launcher above it, so its own come first);
//   2. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's own
//   store
//      listens on MASTER_PORT, so the exchange uses MASTER_PORT + 1);
//   3. mpirun (Open MPI): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (nodes filled rank by rank);
//   4. srun (Slurm): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES;
//   5. none: this process is the first rank of its node (--node-rank) and starts the node's other ranks
//      itself: ranks per node = world / --nnodes.
// --dist-init-addr host:port, when given, is where rank 0 listens, whatever the launcher; without it a
// single-node run uses 127.0.0.1 (port from the launcher, or chosen by the self-launching process) and a
// multi-node run under mpirun or srun is refused, naming the flag. Under a launcher its variables say which
// rank runs where: --nnodes and --node-rank, when given, must agree with them or are refused naming both.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ms::dist {

enum class Launcher { Self, Moeserve, Torchrun, Mpirun, Slurm };
const char* launcher_name(Launcher l);  // "moeserve", "torchrun", "mpirun", "srun", "none"

struct RankInfo {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;  // ranks on this node; local_rank is the CUDA device index
  int node_rank = 0, nnodes = 1;
  std::string master_addr = "127.0.0.1";  // where rank 0 listens for the unique-id exchange
  int master_port = 0;                    // 0: not chosen yet (the self-launching process picks one)
  Launcher launcher = Launcher::Self;
  // The process must start this node's other ranks itself (launch_local_workers).
  bool must_launch_local() const { return launcher == Launcher::Self && local_world_size > 1; }
  std::string init_addr() const;  // "host:port"
  std::string describe() const;   // "rank 1 of 4 (local 1 of 4, node 0 of 1, from torchrun)"
  // Ranks fill nodes in order, local_world_size each.
  int node_of(int rank) const { return local_world_size > 0 ? rank / local_world_size : 0; }
  // "rank 3" on one node, "rank 3 (node 1)" across nodes.
  std::string rank_name(int rank) const;
  // "rank 2" / "ranks 2, 3" (at most 8 listed), across nodes followed by " (node 1)" / " (nodes 1, 2)".
  std::string ranks_named(const std::vector<int>& ranks) const;
};

// The command line's share: --nnodes, --node-rank, --dist-init-addr, and the world the flags ask for
// (max(--tp-size, --ep-size)); a launcher's world must match it.
// Unset --nnodes / --node-rank: 1 and 0 without a launcher, the launcher's values under one.
struct DistFlags {
  int world_size = 1;
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::string dist_init_addr;  // "host:port" or empty
};

// name -> value of an environment variable, nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Throws ms::Error naming the variable or flag for a value that is missing, not a number, out of range or
// inconsistent with the others ("WORLD_SIZE=4 (torchrun) but --tp-size/--ep-size ask for 2 ranks").
RankInfo resolve_rank_info(const DistFlags& flags, const EnvLookup& env);
RankInfo rank_info_from_env(const DistFlags& flags);

// "host:port" -> (host, port); `what` names the source in errors ("--dist-init-addr").
std::pair<std::string, int> parse_host_port(const std::string& s, const std::string& what);

// NVLink multicast (NVLS) stays off unless the user set NCCL_NVLS_ENABLE: sets it to 0 when unset, before
// NCCL starts and before child ranks are started (they inherit it). Idempotent.
void set_nccl_env_defaults();

}  // namespace ms::dist
