#include "cli/rank_processes.h"

#include <fmt/format.h>
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
  f.nnodes = o.nnodes;
  f.node_rank = o.node_rank;
  f.dist_init_addr = o.dist_init_addr;
  return f;
}

bool node_flags_given(const DeviceOptions& o) {
  return o.nnodes.value_or(1) != 1 || o.node_rank.value_or(0) != 0 || !o.dist_init_addr.empty();
}

// MOESERVE_TEST_KILL_RANK=R[:S]: {R, S}, S = -1 when absent (exit before following any step).
std::pair<int, int64_t> test_kill_rank() {
  const char* v = std::getenv("MOESERVE_TEST_KILL_RANK");
  if (!v || !*v) return {-1, -1};
  const std::string s(v);
  const auto colon = s.find(':');
  const int rank = std::atoi(s.substr(0, colon).c_str());
  const int64_t step = colon == std::string::npos ? -1 : std::atoll(s.substr(colon + 1).c_str());
  return {rank, step};
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
  if (o.rank_processes || node_flags_given(o)) return true;
  const auto env = dist::process_env();
  for (const char* v : {"MOESERVE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (env(v)) return true;
  return false;
}

void check_node_flags(const DeviceOptions& o) {
  if (std::max(o.tp_size, o.ep_size) > 1 || !node_flags_given(o)) return;
  MS_THROW(
      "--nnodes / --node-rank / --dist-init-addr spread the ranks of --tp-size / --ep-size over nodes; "
      "with neither above 1 there is one rank (got --nnodes {}, --node-rank {}, --dist-init-addr '{}')",
      o.nnodes.value_or(1), o.node_rank.value_or(0), o.dist_init_addr);
}

RankProcess* rank_process() {
  return holder().get();
}

RankProcess& start_rank_process(const DeviceOptions& o, const std::string& device) {
  if (holder()) return *holder();
  auto rp = std::make_unique<RankProcess>();
  rp->device = device;
  rp->info = dist::rank_info_from_env(dist_flags(o));
  const dist::RankInfo& in = rp->info;
  if (device == "cuda") dist::set_nccl_env_defaults();
  if (in.must_launch_local()) rp->workers = dist::launch_local_workers(own_argv(), rp->info);
  const std::chrono::milliseconds timeout(int64_t{o.dist_timeout_s} * 1000);
  rp->timeout = timeout;
  MS_LOG_INFO(
      "node {} of {}: rank {} of {} on {} (local rank {} of {}, from {}){}; joining rank 0 at {} "
      "(--dist-timeout {} s)",
      in.node_rank, in.nnodes, in.rank, in.world_size,
      device == "cuda" ? fmt::format("cuda:{}", in.local_rank) : std::string("cpu"), in.local_rank,
      in.local_world_size, dist::launcher_name(in.launcher),
      in.rank == 0 ? ": HTTP server, tokenizer and scheduler" : ": follows rank 0's steps", in.init_addr(),
      o.dist_timeout_s);
  try {
    if (device == "cuda") {
      dist::NcclOptions no;
      no.init_timeout = no.op_timeout = timeout;
      rp->comm = dist::connect_nccl(rp->info, no);
    } else {
      // The node's ranks share its cores: each takes its part unless OMP_NUM_THREADS says otherwise (two
      // 2-thread OpenMP teams spinning on 2 cores while a rank waits on the socket made decode ~700x
      // slower).
      if (!std::getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(std::max(1, omp_get_num_procs() / std::max(1, rp->info.local_world_size)));
      rp->comm = std::make_unique<dist::TcpComm>(rp->info, dist::TcpCommOptions{timeout, timeout});
    }
  } catch (const Error& e) {
    // This node's other ranks fail too once this one gives up, and their monitor may end the process
    // first: the cause (the ranks that never joined, or rank 0 out of reach) is logged before that.
    if (rp->workers) {
      MS_LOG_ERROR("{}", e.message());
      spdlog::default_logger()->flush();
      rp->workers->stop();
    }
    throw;
  }
  MS_LOG_INFO("rank {}: {}", rp->info.rank, rp->comm->describe());
  holder() = std::move(rp);
  return *holder();
}

std::unique_ptr<runtime::Engine> rank_process_engine(RankProcess& rp,
                                                     std::unique_ptr<runtime::Executor> local,
                                                     runtime::EngineConfig cfg,
                                                     std::unique_ptr<runtime::PlanStaging> staging) {
  if (rp.info.rank == 0) {
    auto leader = std::make_unique<runtime::LeaderExecutor>(*rp.comm, std::move(local), std::move(staging));
    // Every rank runs every step: after a failed one nothing can run, so the server must not stay up.
    leader->set_on_group_failure([](const std::string& message) {
      MS_LOG_ERROR("{}; the ranks cannot go on: ending the run", message);
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      std::_Exit(1);
    });
    leader->start_keepalive(std::min<std::chrono::milliseconds>(rp.timeout / 4, std::chrono::seconds(60)));
    return std::make_unique<runtime::Engine>(std::move(leader), cfg);
  }
  const auto [kill_rank, kill_step] = test_kill_rank();
  auto die = [rank = rp.info.rank](int64_t step) {
    std::fprintf(stderr, "rank %d: MOESERVE_TEST_KILL_RANK: exiting with status 3 before step %lld\n", rank,
                 static_cast<long long>(step));
    std::_Exit(3);
  };
  if (kill_rank == rp.info.rank && kill_step < 0) die(0);
  runtime::FollowHook hook;
  if (kill_rank == rp.info.rank)
    hook = [&, step = kill_step](int64_t s) {
      if (s == step) die(s);
    };
  MS_LOG_INFO("{}: no server here; following rank 0's step plan", rp.info.rank_name(rp.info.rank));
  runtime::FollowStats st = runtime::follow_steps(*rp.comm, *local, staging.get(), hook);
  MS_LOG_INFO("rank {}: followed {} steps; rank 0 is done", rp.info.rank, st.steps);
  staging.reset();  // its buffer lives on the executor's stream
  local.reset();
  holder().reset();
  std::fflush(nullptr);
  std::exit(0);
}

}  // namespace ms::cli
