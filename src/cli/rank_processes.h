// One process per rank (--rank-processes, or whenever a launcher's environment names this process's rank):
// the layout GPUs need, run on the CPU with dist::TcpComm in place of NCCL. load_engine_model calls
// start_rank_process (rank info from the environment, the node's other ranks started when this process is
// the first, the communicator connected) and loads only this rank's shard; make_engine then builds this
// rank's executor over that communicator and
//   - on rank 0 returns an Engine over a runtime::LeaderExecutor: the command goes on as usual (only rank 0
//     prints results or serves HTTP);
//   - on ranks > 0 runs runtime::follow_steps until rank 0's Engine ends and exits 0, or prints the error and
//     exits 1, so that rank 0's launcher monitor names the rank.
// Across nodes (--nnodes N --node-rank R --dist-init-addr host:port) each node's first process is rank
// R x ranks-per-node and starts its node's other ranks; nodes > 0 run no server, only follow_steps. When a
// step fails after its plan went out (a rank died, hung past --dist-timeout or threw), rank 0 logs the
// failure, which names the rank (and its node), and ends with status 1: the group cannot go on. While idle,
// rank 0 broadcasts a keepalive plan every quarter of --dist-timeout (at most every 60 s), so the followers'
// bounded wait for the next plan holds for a server without requests, and a rank lost meanwhile is found.
// Test hook: MOESERVE_TEST_KILL_RANK=R[:S] (R > 0) makes rank R exit with status 3 where it would start
// following steps (or before it runs step S), the way a worker that dies looks to rank 0.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "dist/local_launch.h"
#include "dist/rank_info.h"
#include "runtime/engine.h"
#include "runtime/executor.h"
#include "runtime/leader_executor.h"

namespace ms::cli {

struct DeviceOptions;

struct RankProcess {
  dist::RankInfo info;
  std::unique_ptr<dist::LocalWorkers> workers;  // rank 0 of a self-launched node: the node's other ranks
  std::unique_ptr<dist::Communicator> comm;
  std::string device;                         // "cpu" or "cuda"
  std::chrono::milliseconds timeout{300000};  // --dist-timeout
  ~RankProcess();  // rank 0: waits (bounded) for the workers to end, then stops them
};

// Whether this run of a sharded model is one process per rank: --rank-processes, --nnodes / --node-rank /
// --dist-init-addr, or a launcher's environment (MOESERVE_RANK, torchrun, mpirun, srun) is present.
bool wants_rank_processes(const DeviceOptions& o);

// The node flags of a run with one rank (no --tp-size/--ep-size above 1) are refused, naming them; the rest
// (address, range, divisibility, agreement with a launcher) is checked by start_rank_process.
void check_node_flags(const DeviceOptions& o);

// Sets up this process's rank once (later calls return the same); `device` is the resolved device.
RankProcess& start_rank_process(const DeviceOptions& o, const std::string& device);
// The rank set up by start_rank_process, or null.
RankProcess* rank_process();

// The Engine of a rank process (see above): rank 0 gets it, ranks > 0 never return.
// staging: where the step plan is broadcast from (null: host memory, for TcpComm; the CUDA executor's
// stream for NCCL).
std::unique_ptr<runtime::Engine> rank_process_engine(RankProcess& rp,
                                                     std::unique_ptr<runtime::Executor> local,
                                                     runtime::EngineConfig cfg,
                                                     std::unique_ptr<runtime::PlanStaging> staging);

}  // namespace ms::cli
