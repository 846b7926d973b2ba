#include "dist/id_exchange.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.h"

namespace ms::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x4d534944;  // "MSID"
constexpr size_t kMaxPayload = 1 << 20;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// false on timeout; throws on a socket error or the peer closing.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) MS_THROW("poll: {}", std::strerror(errno));
  }
}

// Reads exactly n bytes; false on timeout or on the peer closing (eof set).
bool read_all(int fd, void* buf, size_t n, Clock::time_point deadline, bool& eof) {
  auto* p = static_cast<uint8_t*>(buf);
  eof = false;
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) return eof = true, false;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return eof = true, false;
    }
    p += got, n -= static_cast<size_t>(got);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    p += put, n -= static_cast<size_t>(put);
  }
  return true;
}

double seconds(std::chrono::milliseconds t) {
  return t.count() / 1000.0;
}

std::vector<uint8_t> serve_rank0(const RankInfo& info, std::span<const uint8_t> payload,
                                 std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  Fd lis(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (lis.get() < 0) MS_THROW("rank 0: socket: {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(lis.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<uint16_t>(info.master_port));
  if (::bind(lis.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    MS_THROW(
        "rank 0: cannot listen on port {} for {} ({}); another run may hold it: choose another port with "
        "--dist-init-addr",
        info.master_port, info.init_addr(), std::strerror(errno));
  if (::listen(lis.get(), info.world_size) != 0) MS_THROW("rank 0: listen: {}", std::strerror(errno));

  std::vector<Fd> peers(info.world_size);
  int connected = 0;
  while (connected < info.world_size - 1) {
    if (!wait_fd(lis.get(), POLLIN, deadline)) {
      std::vector<int> missing;
      for (int r = 1; r < info.world_size; ++r)
        if (peers[r].get() < 0) missing.push_back(r);
      MS_THROW("rank 0: timed out after {} s waiting on {} for {} ({} of {} connected)", seconds(timeout),
               info.init_addr(), info.ranks_named(missing), connected, info.world_size - 1);
    }
    Fd c(::accept4(lis.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (c.get() < 0) continue;
    uint32_t hello[3];
    bool eof = false;
    // A stranger that connects and says nothing must not hold up the others for long.
    auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    if (!read_all(c.get(), hello, sizeof(hello), hello_deadline, eof) || ntohl(hello[0]) != kMagic) continue;
    int r = static_cast<int>(ntohl(hello[1])), w = static_cast<int>(ntohl(hello[2]));
    if (w != info.world_size)
      MS_THROW("rank 0: rank {} connected to {} with world size {}, this run has {}", r, info.init_addr(), w,
               info.world_size);
    if (r <= 0 || r >= info.world_size)
      MS_THROW("rank 0: a peer says it is rank {} of {}", r, info.world_size);
    if (peers[r].get() >= 0) MS_THROW("rank 0: two processes say they are rank {}", r);
    peers[r] = std::move(c);
    ++connected;
  }
  uint32_t len = htonl(static_cast<uint32_t>(payload.size()));
  for (int r = 1; r < info.world_size; ++r) {
    if (!write_all(peers[r].get(), &len, sizeof(len), deadline) ||
        !write_all(peers[r].get(), payload.data(), payload.size(), deadline))
      MS_THROW("rank 0: could not send the id to rank {} over {}", r, info.init_addr());
  }
  return {payload.begin(), payload.end()};
}

std::vector<uint8_t> join(const RankInfo& info, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::string where = info.init_addr();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  Fd c;
  while (c.get() < 0) {
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(info.master_addr.c_str(), std::to_string(info.master_port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a && c.get() < 0; a = a->ai_next) {
        Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (s.get() < 0) continue;
        int rc = ::connect(s.get(), a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          auto attempt = std::min(deadline, Clock::now() + std::chrono::seconds(2));
          if (wait_fd(s.get(), POLLOUT, attempt)) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (rc == 0)
          c = std::move(s);
        else
          last_error = std::strerror(errno);
      }
      ::freeaddrinfo(res);
    }
    if (c.get() >= 0) break;
    if (Clock::now() >= deadline)
      MS_THROW("rank {}: could not reach rank 0 at {} within {} s (last error: {})", info.rank, where,
               seconds(timeout), last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  uint32_t hello[3] = {htonl(kMagic), htonl(static_cast<uint32_t>(info.rank)),
                       htonl(static_cast<uint32_t>(info.world_size))};
  if (!write_all(c.get(), hello, sizeof(hello), deadline))
    MS_THROW("rank {}: could not send its hello to rank 0 at {}", info.rank, where);
  uint32_t len = 0;
  bool eof = false;
  auto fail = [&](const char* what) {
    if (eof)
      MS_THROW("rank {}: rank 0 at {} closed the connection before sending the id (see rank 0's error)",
               info.rank, where);
    MS_THROW(
        "rank {}: connected to rank 0 at {} but received no {} within {} s (rank 0 sends it once all {} "
        "ranks have connected)",
        info.rank, where, what, seconds(timeout), info.world_size);
  };
  if (!read_all(c.get(), &len, sizeof(len), deadline, eof)) fail("id");
  len = ntohl(len);
  if (len == 0 || len > kMaxPayload)
    MS_THROW("rank {}: rank 0 at {} sent a {}-byte id", info.rank, where, len);
  std::vector<uint8_t> out(len);
  if (!read_all(c.get(), out.data(), len, deadline, eof)) fail("complete id");
  return out;
}

}  // namespace

std::vector<uint8_t> exchange_unique_id(const RankInfo& info, std::span<const uint8_t> payload,
                                        std::chrono::milliseconds timeout) {
  MS_CHECK(info.world_size >= 1 && info.rank >= 0 && info.rank < info.world_size, "rank {} of {}", info.rank,
           info.world_size);
  if (info.rank == 0) {
    MS_CHECK(!payload.empty() && payload.size() <= kMaxPayload, "rank 0's id has {} bytes", payload.size());
    if (info.world_size == 1) return {payload.begin(), payload.end()};
    MS_CHECK(info.master_port > 0, "no port chosen for the id exchange ({})", info.init_addr());
    return serve_rank0(info, payload, timeout);
  }
  MS_CHECK(info.master_port > 0, "no port chosen for the id exchange ({})", info.init_addr());
  return join(info, timeout);
}

int pick_free_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.get() < 0) MS_THROW("socket: {}", std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = 0;
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    MS_THROW("bind to a free port: {}", std::strerror(errno));
  socklen_t len = sizeof(sa);
  ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  return ntohs(sa.sin_port);
}

}  // namespace ms::dist
