// The single-node launcher: children are this test binary re-executed; MS_LAUNCH_TEST_MODE (given through
// LaunchOptions::extra_env) makes them act before gtest starts.
#include "dist/local_launch.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace ms::dist {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Child side, run by a static initialiser when this binary is one of the launched ranks:
//   fail: rank 2 exits with status 3 after a moment, the others sleep (to be terminated);
//   kill: rank 1 kills itself with SIGKILL, the others sleep;
//   env:  writes its MOESERVE_* and NCCL_NVLS_ENABLE variables and argv to $MS_LAUNCH_TEST_DIR/rank<N>, exits
//   0; sleep: sleeps (the PDEATHSIG test kills its parent).
[[maybe_unused]] const bool kIsChild = [] {
  const char* mode = std::getenv("MS_LAUNCH_TEST_MODE");
  const char* rank_s = std::getenv("MOESERVE_RANK");
  if (!mode || !rank_s) return false;
  std::string m = mode;
  int rank = std::atoi(rank_s);
  if (m == "fail" && rank == 2) {
    std::this_thread::sleep_for(300ms);
    std::_Exit(3);
  }
  if (m == "kill" && rank == 1) {
    std::this_thread::sleep_for(300ms);
    raise(SIGKILL);
  }
  if (m == "env") {
    std::ofstream out(std::string(std::getenv("MS_LAUNCH_TEST_DIR")) + "/rank" + rank_s);
    for (const char* k : {"MOESERVE_RANK", "MOESERVE_WORLD_SIZE", "MOESERVE_LOCAL_RANK",
                          "MOESERVE_LOCAL_WORLD_SIZE", "MOESERVE_DIST_INIT_ADDR", "NCCL_NVLS_ENABLE"}) {
      const char* v = std::getenv(k);
      out << k << "=" << (v ? v : "(unset)") << "\n";
    }
    std::ifstream cmdline("/proc/self/cmdline");
    std::string arg;
    while (std::getline(cmdline, arg, '\0')) out << "argv=" << arg << "\n";
    out.close();
    std::_Exit(0);
  }
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(100ms);  // up to a minute: must be killed first
  std::_Exit(0);
}();

struct Recorder {
  std::mutex mu;
  std::vector<std::string> messages;
  LaunchOptions options(const std::string& mode) {
    LaunchOptions o;
    o.extra_env = {{"MS_LAUNCH_TEST_MODE", mode}};
    o.term_grace = 2s;
    o.on_failure = [this](const std::string& m) {
      std::lock_guard lk(mu);
      messages.push_back(m);
    };
    return o;
  }
};

RankInfo node_of(int world) {
  RankInfo r;
  r.world_size = world;
  r.local_world_size = world;
  return r;
}

// Gone, or a zombie no one reaped yet (its parent died: init reaps it eventually).
bool process_ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

const std::vector<std::string> kArgv = {"test_dist", "--gtest_filter=-*", "serve", "--tp-size", "4"};

TEST(LocalLaunch, ChildrenGetTheirRanksAndTheSameArguments) {
  auto dir = std::filesystem::temp_directory_path() / ("ms_launch_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Recorder rec;
  LaunchOptions o = rec.options("env");
  o.extra_env.push_back({"MS_LAUNCH_TEST_DIR", dir.string()});
  RankInfo info = node_of(4);
  auto workers = launch_local_workers(kArgv, info, o);
  ASSERT_GT(info.master_port, 0);  // chosen by the launcher
  ASSERT_EQ(workers->children().size(), 3u);
  ASSERT_TRUE(workers->wait_all(20s));
  EXPECT_EQ(workers->failure(), "");
  for (int r = 1; r < 4; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    SCOPED_TRACE(s);
    EXPECT_THAT(s, HasSubstr("MOESERVE_RANK=" + std::to_string(r) + "\n"));
    EXPECT_THAT(s, HasSubstr("MOESERVE_WORLD_SIZE=4\n"));
    EXPECT_THAT(s, HasSubstr("MOESERVE_LOCAL_RANK=" + std::to_string(r) + "\n"));
    EXPECT_THAT(s, HasSubstr("MOESERVE_LOCAL_WORLD_SIZE=4\n"));
    EXPECT_THAT(s, HasSubstr("MOESERVE_DIST_INIT_ADDR=127.0.0.1:" + std::to_string(info.master_port) + "\n"));
    EXPECT_THAT(s, HasSubstr("NCCL_NVLS_ENABLE=0\n"));
    EXPECT_THAT(s, HasSubstr("argv=test_dist\nargv=--gtest_filter=-*\nargv=serve\nargv=--tp-size\nargv=4\n"));
  }
  EXPECT_TRUE(rec.messages.empty());
  std::filesystem::remove_all(dir);
}

TEST(LocalLaunch, AFailingRankTakesTheGroupDown) {
  Recorder rec;
  RankInfo info = node_of(4);
  auto start = std::chrono::steady_clock::now();
  auto workers = launch_local_workers(kArgv, info, rec.options("fail"));
  auto children = workers->children();
  ASSERT_EQ(children.size(), 3u);
  ASSERT_TRUE(workers->wait_all(20s));
  // The sleepers would live a minute: they were terminated.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  for (auto& c : children) EXPECT_TRUE(process_ended(c.pid)) << "rank " << c.rank;
  for (int i = 0; i < 100 && workers->failure().empty(); ++i) std::this_thread::sleep_for(20ms);
  std::string expected = "rank 2 (pid " + std::to_string(children[1].pid) + ") exited with status 3";
  EXPECT_EQ(workers->failure(), expected);
  workers.reset();
  ASSERT_EQ(rec.messages.size(), 1u);
  EXPECT_EQ(rec.messages[0], expected);
}

TEST(LocalLaunch, AKilledRankIsReportedWithItsSignal) {
  Recorder rec;
  RankInfo info = node_of(3);
  auto workers = launch_local_workers(kArgv, info, rec.options("kill"));
  auto children = workers->children();
  ASSERT_TRUE(workers->wait_all(20s));
  workers.reset();
  ASSERT_EQ(rec.messages.size(), 1u);
  EXPECT_EQ(rec.messages[0],
            "rank 1 (pid " + std::to_string(children[0].pid) + ") was killed by signal 9 (Killed)");
  EXPECT_TRUE(process_ended(children[1].pid));
}

TEST(LocalLaunch, StopEndsTheChildrenWithoutAFailure) {
  Recorder rec;
  RankInfo info = node_of(3);
  auto workers = launch_local_workers(kArgv, info, rec.options("sleep"));
  auto children = workers->children();
  std::this_thread::sleep_for(200ms);
  workers->stop();
  for (auto& c : children) EXPECT_TRUE(process_ended(c.pid));
  EXPECT_EQ(workers->failure(), "");
  EXPECT_TRUE(rec.messages.empty());
}

TEST(LocalLaunch, ChildrenDieWithTheirParent) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);  // the grandchildren must not hold the write end
  pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    close(fds[0]);
    RankInfo info = node_of(3);
    LaunchOptions o;
    o.extra_env = {{"MS_LAUNCH_TEST_MODE", "sleep"}};
    auto workers = launch_local_workers(kArgv, info, o);
    for (auto& c : workers->children()) (void)!write(fds[1], &c.pid, sizeof(c.pid));
    close(fds[1]);
    for (;;) pause();  // killed by the test
  }
  close(fds[1]);
  std::vector<pid_t> pids;
  pid_t p;
  while (read(fds[0], &p, sizeof(p)) == sizeof(p)) pids.push_back(p);
  close(fds[0]);
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t c : pids) EXPECT_FALSE(process_ended(c));
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  bool all = false;
  for (int i = 0; i < 200 && !all; ++i) {
    all = true;
    for (pid_t c : pids) all = all && process_ended(c);
    if (!all) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(all);
}

TEST(LocalLaunch, AMissingExecutableIsAnError) {
  RankInfo info = node_of(2);
  LaunchOptions o;
  o.executable = "/nonexistent/moeserve";
  try {
    launch_local_workers(kArgv, info, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("cannot start rank 1: exec /nonexistent/moeserve"));
  }
}

}  // namespace
}  // namespace ms::dist
