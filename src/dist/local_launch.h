// Single-node self-launch: the process the user started is the first rank of its node and starts the node's
// other ranks as children running the same binary with the same arguments, told who they are through
// MOESERVE_RANK / MOESERVE_WORLD_SIZE / MOESERVE_LOCAL_RANK / MOESERVE_LOCAL_WORLD_SIZE /
// MOESERVE_DIST_INIT_ADDR (rank_info.h reads them; the local rank is the CUDA device index) and with
// NCCL_NVLS_ENABLE=0 unless the user set it.
//
// A monitor thread forks the children and reaps them. When one dies or exits with a non-zero status it
// reports "rank 2 (pid 4711) exited with status 3" (or "was killed by signal 9 (Killed)"), takes the group
// down (SIGTERM to the other children, SIGKILL after a grace period) and calls on_failure; the default
// logs the message and ends this process with status 1, since the model's collectives cannot go on without
// that rank. A child that exits with status 0 is reaped silently. Children get SIGKILL when the monitor
// thread's process dies (PR_SET_PDEATHSIG), so no rank outlives the group's first rank.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dist/rank_info.h"

namespace ms::dist {

struct LaunchOptions {
  std::string executable = "/proc/self/exe";  // the binary the children run
  std::vector<std::pair<std::string, std::string>> extra_env;
  std::chrono::milliseconds term_grace{std::chrono::seconds(5)};  // SIGTERM -> SIGKILL
  // Called once, on the monitor thread, after the other children are down. Empty: log it and _Exit(1).
  std::function<void(const std::string& message)> on_failure;
};

class LocalWorkers {
 public:
  struct Child {
    int rank = 0;  // global rank
    pid_t pid = -1;
  };
  ~LocalWorkers();  // stop()
  LocalWorkers(const LocalWorkers&) = delete;
  LocalWorkers& operator=(const LocalWorkers&) = delete;

  const std::vector<Child>& children() const { return children_; }
  // Orderly end (the server shuts down): SIGTERM to the children still running, SIGKILL after the grace
  // period, all reaped; nothing is reported as a failure. Idempotent.
  void stop();
  // The failure message once a child has failed, else empty.
  std::string failure() const;
  // Blocks until every child has ended (and been reaped) or the timeout passes; true when all have ended.
  bool wait_all(std::chrono::milliseconds timeout);

 private:
  friend std::unique_ptr<LocalWorkers> launch_local_workers(const std::vector<std::string>&, RankInfo&,
                                                            LaunchOptions);
  LocalWorkers() = default;
  void monitor(std::vector<std::vector<std::string>> envs, std::vector<std::string> argv);
  void terminate_running();  // monitor thread only

  LaunchOptions opt_;
  int rank_ = 0;  // this process's rank
  std::vector<Child> children_;
  std::vector<bool> ended_;  // guarded by mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, stopping_ = false, done_ = false;
  std::string start_error_, failure_;
  std::thread monitor_;
};

// info: this process's RankInfo with must_launch_local() (rank = first rank of this node). Starts local ranks
// 1 .. local_world_size - 1 with argv (argv[0] included, passed as is). Chooses info.master_port when it
// is 0 (pick_free_port) so that this process and its children agree on it. Throws ms::Error when a child
// cannot be started (and stops those already started).
std::unique_ptr<LocalWorkers> launch_local_workers(const std::vector<std::string>& argv, RankInfo& info,
                                                   LaunchOptions options = {});

}  // namespace ms::dist
