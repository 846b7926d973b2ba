#include "cli/rank_processes.h"

#include <omp.h>

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "cli/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/nccl_comm.h"
#include "dist/tcp_comm.h"
#include "runtime/leader_executor.h"

namespace ms::cli {
namespace {

std::unique_ptr<RankProcess>& holder() {
  static std::unique_ptr<RankProcess> rp;
  return rp;
}

dist::DistFlags dist_flags(const DeviceOptions& o) {
  dist::DistFlags f;
  f.world_size = std::max(o.tp_size, o.ep_size);
  return f;
}

// This process's own arguments, for the node's other ranks to run the same command.
std::vector<std::string> own_argv() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == '\0') {
      argv.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  MS_CHECK(!argv.empty(), "cannot read this process's arguments to start the other ranks");
  return argv;
}

}  // namespace

RankProcess::~RankProcess() {
  comm.reset();  // ranks still reading from rank 0 see it close
  if (workers && !workers->wait_all(std::chrono::seconds(10)))
    MS_LOG_WARN("rank processes: the other ranks did not end within 10 s of rank 0's; stopping them");
  workers.reset();
}

bool wants_rank_processes(const DeviceOptions& o) {
  if (o.rank_processes) return true;
  const auto env = dist::process_env();
  for (const char* v : {"MOESERVE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (env(v)) return true;
  return false;
}

RankProcess* rank_process() {
  return holder().get();
}

RankProcess& start_rank_process(const DeviceOptions& o, const std::string& device) {
  if (holder()) return *holder();
  auto rp = std::make_unique<RankProcess>();
  rp->device = device;
  rp->info = dist::rank_info_from_env(dist_flags(o));
  if (device == "cuda") dist::set_nccl_env_defaults();
  if (rp->info.must_launch_local()) rp->workers = dist::launch_local_workers(own_argv(), rp->info);
  MS_LOG_INFO("{}: connecting to rank 0 at {}", rp->info.describe(), rp->info.init_addr());
  if (device == "cuda") {
    rp->comm = dist::connect_nccl(rp->info);
  } else {
    // The node's ranks share its cores: each takes its part unless OMP_NUM_THREADS says otherwise (two
    // 2-thread OpenMP teams spinning on 2 cores while a rank waits on the socket made decode ~700x slower).
    if (!std::getenv("OMP_NUM_THREADS"))
      omp_set_num_threads(std::max(1, omp_get_num_procs() / std::max(1, rp->info.local_world_size)));
    rp->comm = std::make_unique<dist::TcpComm>(rp->info);
  }
  MS_LOG_INFO("rank {}: {}", rp->info.rank, rp->comm->describe());
  holder() = std::move(rp);
  return *holder();
}

std::unique_ptr<runtime::Engine> rank_process_engine(RankProcess& rp,
                                                     std::unique_ptr<runtime::Executor> local,
                                                     runtime::EngineConfig cfg,
                                                     std::unique_ptr<runtime::PlanStaging> staging) {
  if (rp.info.rank == 0)
    return std::make_unique<runtime::Engine>(
        std::make_unique<runtime::LeaderExecutor>(*rp.comm, std::move(local), std::move(staging)), cfg);
  if (const char* kill = std::getenv("MOESERVE_TEST_KILL_RANK"); kill && std::atoi(kill) == rp.info.rank) {
    std::fprintf(stderr, "rank %d: MOESERVE_TEST_KILL_RANK: exiting with status 3\n", rp.info.rank);
    std::_Exit(3);
  }
  runtime::FollowStats st = runtime::follow_steps(*rp.comm, *local, staging.get());
  MS_LOG_INFO("rank {}: followed {} steps; rank 0 is done", rp.info.rank, st.steps);
  staging.reset();  // its buffer lives on the executor's stream
  local.reset();
  holder().reset();
  std::fflush(nullptr);
  std::exit(0);
}

}  // namespace ms::cli
