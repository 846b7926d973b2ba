// The tcp group against the communicator conformance suite (ranks as threads of this process, each with its
// own sockets), its failure modes, and a group of forked processes.
#include "dist/tcp_comm.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "dist/id_exchange.h"
#include "unit/dist/communicator_conformance.h"

namespace ms::dist {
namespace {

RankInfo info_for(int rank, int n, int port) {
  RankInfo i;
  i.rank = rank;
  i.world_size = n;
  i.local_rank = rank;
  i.local_world_size = n;
  i.master_addr = "127.0.0.1";
  i.master_port = port;
  i.launcher = Launcher::Moeserve;
  return i;
}

// n ranks connected on threads (the constructors block until the group is whole).
std::vector<std::unique_ptr<Communicator>> connect_group(int n, std::chrono::milliseconds timeout) {
  const int port = pick_free_port();
  std::vector<std::unique_ptr<Communicator>> out(static_cast<size_t>(n));
  std::vector<std::string> errs(static_cast<size_t>(n));
  std::vector<std::thread> th;
  TcpCommOptions o;
  o.timeout = timeout;
  o.connect_timeout = std::chrono::seconds(20);
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        out[static_cast<size_t>(r)] = std::make_unique<TcpComm>(info_for(r, n, port), o);
      } catch (const std::exception& e) {
        errs[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; ++r)
    MS_CHECK(errs[static_cast<size_t>(r)].empty(), "{}", errs[static_cast<size_t>(r)]);
  return out;
}

test::CommHarness tcp_harness() {
  test::CommHarness h;
  h.make = connect_group;
  return h;
}

TEST(TcpComm, Conformance) {
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(n);
    test::check_communicator_conformance(tcp_harness(), n);
  }
}

TEST(TcpComm, ARankThatThrowsIsNamedAndNobodyHangs) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    test::check_communicator_failure(tcp_harness(), n);
  }
}

TEST(TcpComm, RankZeroMissingIsNamedByTheOthers) {
  auto cs = connect_group(3, std::chrono::milliseconds(200));
  auto errs = test::conformance::run_ranks(cs, [&](int rank, Communicator& c) {
    if (rank == 0) return;
    float x = 1;
    c.all_reduce_sum(&x, 1, DType::F32, nullptr);
  });
  for (int r : {1, 2})
    EXPECT_NE(errs[static_cast<size_t>(r)].find("rank 0 did not answer"), std::string::npos)
        << errs[static_cast<size_t>(r)];
}

TEST(TcpComm, AbortReachesTheOthersAtOnceAndTheGroupStaysFailed) {
  for (int bad : {0, 2}) {
    SCOPED_TRACE(bad);
    auto cs = connect_group(3, std::chrono::milliseconds(60000));
    const auto t0 = std::chrono::steady_clock::now();
    auto errs = test::conformance::run_ranks(cs, [&](int rank, Communicator& c) {
      if (rank == bad) {
        c.abort("out of memory in layer 3");
        return;
      }
      std::vector<float> x(100000, 1.0f);  // larger than a socket buffer: the abort must cut the send short
      c.all_reduce_sum(x.data(), static_cast<int64_t>(x.size()), DType::F32, nullptr);
    });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    for (int r = 0; r < 3; ++r) {
      if (r == bad) continue;
      EXPECT_NE(
          errs[static_cast<size_t>(r)].find(fmt::format("rank {} failed: out of memory in layer 3", bad)),
          std::string::npos)
          << errs[static_cast<size_t>(r)];
      EXPECT_THROW(cs[static_cast<size_t>(r)]->barrier(), Error);
    }
  }
}

TEST(TcpComm, MismatchedCallsAreNamed) {
  auto cs = connect_group(2, std::chrono::milliseconds(5000));
  auto errs = test::conformance::run_ranks(cs, [&](int rank, Communicator& c) {
    float x[4] = {};
    if (rank == 0)
      c.all_reduce_sum(x, 4, DType::F32, nullptr);
    else
      c.all_reduce_sum(x, 3, DType::F32, nullptr);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errs[static_cast<size_t>(r)].find("rank 1 called all_reduce_sum(count 3"), std::string::npos)
        << errs[static_cast<size_t>(r)];
}

TEST(TcpComm, RankZeroNamesTheRanksThatNeverConnect) {
  TcpCommOptions o;
  o.connect_timeout = std::chrono::milliseconds(300);
  try {
    TcpComm c(info_for(0, 3, pick_free_port()), o);
    FAIL() << "connected without its peers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1, 2"), std::string::npos) << e.what();
  }
}

// Each rank a process: rank r's sum of (r + 1) * i must come back identical everywhere; a child whose
// process ends before a collective is named by rank 0.
int child_rank(int rank, int n, int port, bool die) {
  try {
    TcpCommOptions o;
    o.timeout = std::chrono::seconds(20);
    o.connect_timeout = std::chrono::seconds(20);
    TcpComm c(info_for(rank, n, port), o);
    if (die) _exit(3);
    for (int round = 0; round < 5; ++round) {
      std::vector<float> x(3000);
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>(rank + 1) * static_cast<float>(i + round);
      c.all_reduce_sum(x.data(), static_cast<int64_t>(x.size()), DType::F32, nullptr);
      const float k = static_cast<float>(n * (n + 1) / 2);
      for (size_t i = 0; i < x.size(); ++i)
        if (x[i] != k * static_cast<float>(i + round)) return 1;
    }
    c.barrier();
    return 0;
  } catch (...) {
    return 2;
  }
}

TEST(TcpComm, ForkedProcesses) {
  for (bool die : {false, true}) {
    SCOPED_TRACE(die);
    const int n = 3, port = pick_free_port();
    std::vector<pid_t> kids;
    for (int r = 1; r < n; ++r) {
      pid_t p = fork();
      ASSERT_GE(p, 0);
      if (p == 0) _exit(child_rank(r, n, port, die && r == 2));
      kids.push_back(p);
    }
    int rc = -1;
    try {
      rc = child_rank(0, n, port, false);
    } catch (...) {
    }
    std::vector<int> status;
    for (pid_t p : kids) {
      int st = 0;
      waitpid(p, &st, 0);
      status.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    if (!die) {
      EXPECT_EQ(rc, 0);
      EXPECT_EQ(status, (std::vector<int>{0, 0}));
    } else {
      EXPECT_EQ(rc, 2);  // rank 0's collective threw
      EXPECT_EQ(status[1], 3);
      EXPECT_EQ(status[0], 2);  // told by rank 0
    }
  }
}

TEST(TcpComm, ForkedRankThatExitsIsNamed) {
  const int n = 2, port = pick_free_port();
  pid_t p = fork();
  ASSERT_GE(p, 0);
  if (p == 0) _exit(child_rank(1, n, port, true));
  TcpCommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.connect_timeout = std::chrono::seconds(20);
  std::string err;
  try {
    TcpComm c(info_for(0, n, port), o);
    float x = 1;
    c.all_reduce_sum(&x, 1, DType::F32, nullptr);
  } catch (const Error& e) {
    err = e.what();
  }
  int st = 0;
  waitpid(p, &st, 0);
  EXPECT_NE(err.find("rank 1 closed its connection"), std::string::npos) << err;
}

}  // namespace
}  // namespace ms::dist
