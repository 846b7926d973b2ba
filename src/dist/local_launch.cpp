#include "dist/local_launch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "dist/id_exchange.h"

extern char** environ;

namespace ms::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> child_env(const RankInfo& info, int local_rank, const LaunchOptions& opt) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"MOESERVE_RANK", std::to_string(info.rank + local_rank)},
      {"MOESERVE_WORLD_SIZE", std::to_string(info.world_size)},
      {"MOESERVE_LOCAL_RANK", std::to_string(local_rank)},
      {"MOESERVE_LOCAL_WORLD_SIZE", std::to_string(info.local_world_size)},
      {"MOESERVE_DIST_INIT_ADDR", info.init_addr()},
  };
  for (auto& kv : opt.extra_env) set.push_back(kv);
  std::set<std::string> keys;
  for (auto& [k, v] : set) keys.insert(k);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos && keys.count(std::string(kv.substr(0, eq)))) continue;
    env.emplace_back(kv);
  }
  for (auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string describe_status(int rank, pid_t pid, int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return fmt::format("rank {} (pid {}) was killed by signal {} ({})", rank, pid, sig, strsignal(sig));
  }
  return fmt::format("rank {} (pid {}) exited with status {}", rank, pid, WEXITSTATUS(status));
}

}  // namespace

std::unique_ptr<LocalWorkers> launch_local_workers(const std::vector<std::string>& argv, RankInfo& info,
                                                   LaunchOptions options) {
  MS_CHECK(!argv.empty(), "no arguments to start the workers with");
  MS_CHECK(info.local_world_size >= 1 && info.local_rank == 0, "{} cannot start its node's ranks",
           info.describe());
  if (info.master_port == 0) info.master_port = pick_free_port();
  set_nccl_env_defaults();
  std::unique_ptr<LocalWorkers> w(new LocalWorkers());
  w->opt_ = std::move(options);
  w->rank_ = info.rank;
  std::vector<std::vector<std::string>> envs;
  for (int l = 1; l < info.local_world_size; ++l) {
    w->children_.push_back({info.rank + l, -1});
    envs.push_back(child_env(info, l, w->opt_));
  }
  w->ended_.assign(w->children_.size(), false);
  // The monitor thread forks: PR_SET_PDEATHSIG fires when the forking thread ends, and this one lives as
  // long as the children.
  w->monitor_ = std::thread(&LocalWorkers::monitor, w.get(), std::move(envs), argv);
  std::unique_lock lk(w->mu_);
  w->cv_.wait(lk, [&] { return w->started_; });
  if (!w->start_error_.empty()) {
    std::string err = w->start_error_;
    lk.unlock();
    w->stop();
    MS_THROW("{}", err);
  }
  std::string pids;
  for (auto& c : w->children_) pids += fmt::format(" {}:{}", c.rank, c.pid);
  MS_LOG_INFO("started {} local rank(s) of {} (rank:pid{}), id exchange on {}", w->children_.size(),
              info.world_size, pids, info.init_addr());
  return w;
}

void LocalWorkers::monitor(std::vector<std::vector<std::string>> envs, std::vector<std::string> argv) {
  pid_t parent = ::getpid();
  std::string start_error;
  for (size_t i = 0; i < children_.size() && start_error.empty(); ++i) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) {
      start_error = fmt::format("pipe: {}", std::strerror(errno));
      break;
    }
    std::vector<char*> cargv = c_strings(argv), cenv = c_strings(envs[i]);
    const char* exe = opt_.executable.c_str();
    pid_t pid = ::fork();
    if (pid == 0) {
      // Only async-signal-safe calls from here to exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::close(pipefd[0]);
      ::execve(exe, cargv.data(), cenv.data());
      int err = errno;
      ssize_t ignored = ::write(pipefd[1], &err, sizeof(err));
      (void)ignored;
      ::_exit(127);
    }
    ::close(pipefd[1]);
    if (pid < 0) {
      ::close(pipefd[0]);
      start_error = fmt::format("fork for rank {}: {}", children_[i].rank, std::strerror(errno));
      break;
    }
    children_[i].pid = pid;
    int err = 0;
    ssize_t got;
    do got = ::read(pipefd[0], &err, sizeof(err));
    while (got < 0 && errno == EINTR);
    ::close(pipefd[0]);
    if (got == sizeof(err)) {
      ::waitpid(pid, nullptr, 0);
      std::lock_guard lk(mu_);
      ended_[i] = true;
      start_error = fmt::format("cannot start rank {}: exec {}: {}", children_[i].rank, opt_.executable,
                                std::strerror(err));
    }
  }
  {
    std::lock_guard lk(mu_);
    start_error_ = start_error;
    started_ = true;
    if (!start_error.empty()) stopping_ = true;
  }
  cv_.notify_all();

  std::string failure;
  for (;;) {
    bool stopping, all_ended = true;
    {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(20), [&] { return stopping_; });
      stopping = stopping_;
    }
    if (stopping) break;
    for (size_t i = 0; i < children_.size(); ++i) {
      {
        std::lock_guard lk(mu_);
        if (ended_[i]) continue;
      }
      int status = 0;
      pid_t r = ::waitpid(children_[i].pid, &status, WNOHANG);
      if (r == 0) {
        all_ended = false;
        continue;
      }
      {
        std::lock_guard lk(mu_);
        ended_[i] = true;
      }
      if (r < 0) continue;  // not our child any more (someone else reaped it)
      if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0) {
        failure = describe_status(children_[i].rank, children_[i].pid, status);
        break;
      }
    }
    cv_.notify_all();
    if (!failure.empty() || all_ended) break;
  }
  if (!failure.empty()) {
    std::string others;
    {
      std::lock_guard lk(mu_);
      for (size_t i = 0; i < children_.size(); ++i)
        if (!ended_[i]) others += fmt::format("{}{}", others.empty() ? "" : ", ", children_[i].rank);
    }
    MS_LOG_ERROR("{}; stopping the other ranks{}", failure, others.empty() ? "" : " (" + others + ")");
  }
  terminate_running();
  {
    std::lock_guard lk(mu_);
    failure_ = failure;
    done_ = true;
  }
  cv_.notify_all();
  if (!failure.empty()) {
    if (opt_.on_failure) {
      opt_.on_failure(failure);
    } else {
      MS_LOG_ERROR("{}: ending rank {}", failure, rank_);
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      std::_Exit(1);
    }
  }
}

void LocalWorkers::terminate_running() {
  auto running = [&] {
    std::vector<size_t> r;
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < children_.size(); ++i)
      if (!ended_[i] && children_[i].pid > 0) r.push_back(i);
    return r;
  };
  auto reap = [&](bool block) {
    for (size_t i : running()) {
      int status = 0;
      pid_t r = ::waitpid(children_[i].pid, &status, block ? 0 : WNOHANG);
      if (r != 0) {
        std::lock_guard lk(mu_);
        ended_[i] = true;
      }
    }
  };
  for (size_t i : running()) ::kill(children_[i].pid, SIGTERM);
  auto deadline = Clock::now() + opt_.term_grace;
  while (!running().empty() && Clock::now() < deadline) {
    reap(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i : running()) ::kill(children_[i].pid, SIGKILL);
  reap(true);
}

void LocalWorkers::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (monitor_.joinable()) {
    if (monitor_.get_id() == std::this_thread::get_id())
      monitor_.detach();  // stop() from on_failure
    else
      monitor_.join();
  }
}

LocalWorkers::~LocalWorkers() {
  stop();
}

std::string LocalWorkers::failure() const {
  std::lock_guard lk(mu_);
  return failure_;
}

bool LocalWorkers::wait_all(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] {
    for (bool e : ended_)
      if (!e) return false;
    return true;
  });
}

}  // namespace ms::dist
