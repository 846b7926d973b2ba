// The unique-id exchange over TCP: random bytes from rank 0 reach every rank (threads of this process, and a
// forked child), and a missing rank is named rather than waited for forever.
#include "dist/id_exchange.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <random>
#include <thread>

#include "core/error.h"

namespace ms::dist {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

RankInfo info(int rank, int world, int port) {
  RankInfo r;
  r.rank = rank;
  r.world_size = world;
  r.local_rank = rank;
  r.local_world_size = world;
  r.master_addr = "127.0.0.1";
  r.master_port = port;
  return r;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

TEST(IdExchange, ThreadsOfOneProcess) {
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(world);
    int port = pick_free_port();
    auto id = random_bytes(128, 100 + world);
    std::vector<std::future<std::vector<uint8_t>>> got;
    // The other ranks start first: they must retry until rank 0 listens.
    for (int r = world - 1; r >= 0; --r) {
      got.push_back(std::async(std::launch::async, [&, r] {
        if (r == 0) std::this_thread::sleep_for(200ms);
        return exchange_unique_id(info(r, world, port), r == 0 ? id : std::vector<uint8_t>{}, 20s);
      }));
    }
    for (auto& g : got) EXPECT_EQ(g.get(), id);
  }
}

TEST(IdExchange, ForkedChildReceivesTheParentsBytes) {
  int port = pick_free_port();
  auto id = random_bytes(128, 7);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    try {
      auto got = exchange_unique_id(info(1, 2, port), {}, 20s);
      if (write(fds[1], got.data(), got.size()) != static_cast<ssize_t>(got.size())) code = 2;
    } catch (...) {
      code = 1;
    }
    _exit(code);
  }
  close(fds[1]);
  EXPECT_EQ(exchange_unique_id(info(0, 2, port), id, 20s), id);
  std::vector<uint8_t> child(256);
  ssize_t n = 0, got;
  while ((got = read(fds[0], child.data() + n, child.size() - n)) > 0) n += got;
  close(fds[0]);
  child.resize(n);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(child, id);
}

TEST(IdExchange, RankZeroNamesTheMissingRanks) {
  int port = pick_free_port();
  auto id = random_bytes(128, 9);
  // World 4: only ranks 0 and 2 come.
  auto rank2 = std::async(std::launch::async,
                          [&] { return error_of([&] { exchange_unique_id(info(2, 4, port), {}, 5s); }); });
  std::string e0 = error_of([&] { exchange_unique_id(info(0, 4, port), id, 1s); });
  EXPECT_THAT(e0, HasSubstr("rank 0: timed out after 1 s waiting on 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(e0, HasSubstr("ranks 1, 3 (1 of 3 connected)"));
  // Rank 2 hears that rank 0 gave up, well before its own deadline.
  std::string e2 = rank2.get();
  EXPECT_THAT(e2,
              HasSubstr("rank 2: rank 0 at 127.0.0.1:" + std::to_string(port) + " closed the connection"));
}

TEST(IdExchange, UnreachableRankZeroIsNamed) {
  int port = pick_free_port();  // nobody listens there
  std::string e = error_of([&] { exchange_unique_id(info(3, 4, port), {}, 500ms); });
  EXPECT_THAT(e, HasSubstr("rank 3: could not reach rank 0 at 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(e, HasSubstr("Connection refused"));
}

TEST(IdExchange, PortInUseIsReported) {
  int port = pick_free_port();
  auto id = random_bytes(16, 1);
  // A first rank 0 holds the port while it waits for its peer.
  auto first = std::async(std::launch::async, [&] {
    return error_of([&] { exchange_unique_id(info(0, 2, port), id, 1500ms); });
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_THAT(error_of([&] { exchange_unique_id(info(0, 2, port), id, 1s); }),
              HasSubstr("rank 0: cannot listen on port " + std::to_string(port)));
  EXPECT_THAT(first.get(), HasSubstr("timed out"));
}

}  // namespace
}  // namespace ms::dist
