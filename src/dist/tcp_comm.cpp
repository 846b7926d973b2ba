#include "dist/tcp_comm.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist/bf16.h"

namespace ms::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kHello = 0x4d535443;  // "MSTC"
constexpr uint32_t kMsg = 0x4d53544d;    // "MSTM"
constexpr uint32_t kAbort = 100;         // Wire::kind of an abort; its payload is the reason
constexpr uint64_t kMaxPayload = uint64_t{1} << 36;

// One message's head; the payload (`bytes` long) follows. Host byte order: the ranks of a run share one
// architecture.
struct Wire {
  uint32_t magic = kMsg;
  uint32_t kind = 0;  // TcpComm::Op, or kAbort
  int64_t count = 0;
  int32_t dtype = 0;
  int32_t root = 0;
  uint64_t bytes = 0;
};

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// Poll one fd; 0 on timeout, else revents. Throws on a poll error.
short poll_one(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return p.revents;
    if (rc == 0) return 0;
    if (errno != EINTR) MS_THROW("poll: {}", std::strerror(errno));
  }
}

enum class Io { Ok, Timeout, Closed, Readable };

Io read_all(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    if (poll_one(fd, POLLIN, deadline) == 0) return Io::Timeout;
    ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return Io::Closed;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Io::Closed;
    }
    p += got, n -= static_cast<size_t>(got);
  }
  return Io::Ok;
}

// With watch_in, stops (Io::Readable) as soon as the peer has something to say: from rank 0 in the middle
// of a round, that can only be an abort.
Io write_all(int fd, const void* buf, size_t n, Clock::time_point deadline, bool watch_in = false) {
  auto* p = static_cast<const unsigned char*>(buf);
  while (n > 0) {
    short ev = poll_one(fd, static_cast<short>(POLLOUT | (watch_in ? POLLIN : 0)), deadline);
    if (ev == 0) return Io::Timeout;
    if (watch_in && (ev & POLLIN)) return Io::Readable;
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (put < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Io::Closed;
    }
    p += put, n -= static_cast<size_t>(put);
  }
  return Io::Ok;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

const char* op_name(TcpComm::Op op) {
  switch (op) {
    case TcpComm::Op::AllReduceSum:
      return "all_reduce_sum";
    case TcpComm::Op::AllGather:
      return "all_gather";
    case TcpComm::Op::ReduceScatterSum:
      return "reduce_scatter_sum";
    case TcpComm::Op::Broadcast:
      return "broadcast";
    case TcpComm::Op::AllReduceMax:
      return "all_reduce_max";
    case TcpComm::Op::Barrier:
      return "barrier";
  }
  return "?";
}

// acc[i] = sum over ranks, in rank order, of ins[r][off + i] (f32 or bf16 widened).
void sum_ranks(std::vector<float>& acc, const std::vector<const unsigned char*>& ins, DType dtype, size_t off,
               size_t n) {
  acc.resize(n);
  for (size_t r = 0; r < ins.size(); ++r) {
    if (dtype == DType::F32) {
      const float* x = reinterpret_cast<const float*>(ins[r]) + off;
      if (r == 0)
        std::copy(x, x + n, acc.begin());
      else
        for (size_t i = 0; i < n; ++i) acc[i] += x[i];
    } else {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(ins[r]) + off;
      for (size_t i = 0; i < n; ++i) acc[i] = r == 0 ? bf16_to_f32(x[i]) : acc[i] + bf16_to_f32(x[i]);
    }
  }
}

void store(const std::vector<float>& acc, DType dtype, void* out) {
  if (acc.empty()) return;
  if (dtype == DType::F32) {
    std::memcpy(out, acc.data(), acc.size() * sizeof(float));
  } else {
    uint16_t* o = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < acc.size(); ++i) o[i] = f32_to_bf16(acc[i]);
  }
}

int listen_on(const RankInfo& info) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) MS_THROW("rank 0: socket: {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<uint16_t>(info.master_port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, info.world_size) != 0) {
    const int e = errno;
    ::close(fd);
    MS_THROW(
        "rank 0: cannot listen on port {} for the tcp group at {} ({}); another run may hold it: choose "
        "another port with --dist-init-addr",
        info.master_port, info.init_addr(), std::strerror(e));
  }
  return fd;
}

// A connected socket to rank 0, retrying until the deadline; -1 with last_error on failure.
int connect_to(const RankInfo& info, Clock::time_point deadline, std::string& last_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  for (;;) {
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(info.master_addr.c_str(), std::to_string(info.master_port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (s < 0) continue;
        int rc = ::connect(s, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          auto attempt = std::min(deadline, Clock::now() + std::chrono::seconds(2));
          if (poll_one(s, POLLOUT, attempt) != 0) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (rc == 0) {
          ::freeaddrinfo(res);
          return s;
        }
        last_error = std::strerror(errno);
        ::close(s);
      }
      ::freeaddrinfo(res);
    }
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TcpComm::TcpComm(const RankInfo& info, TcpCommOptions options)
    : rank_(info.rank), size_(info.world_size), info_(info), addr_(info.init_addr()), opt_(options) {
  MS_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "tcp group: rank {} of {}", rank_, size_);
  MS_CHECK(opt_.timeout.count() > 0, "tcp group: the timeout must be positive");
  if (size_ == 1) return;
  MS_CHECK(info.master_port > 0, "tcp group: no port chosen for rank 0 ({})", addr_);
  const auto deadline = Clock::now() + opt_.connect_timeout;
  const double secs = opt_.connect_timeout.count() / 1000.0;
  if (rank_ == 0) {
    fds_.assign(static_cast<size_t>(size_), -1);
    const int lis = listen_on(info);
    int connected = 0;
    try {
      while (connected < size_ - 1) {
        if (poll_one(lis, POLLIN, deadline) == 0) {
          std::vector<int> missing;
          for (int r = 1; r < size_; ++r)
            if (fds_[static_cast<size_t>(r)] < 0) missing.push_back(r);
          MS_THROW("rank 0: timed out after {} s waiting on {} for {} of the tcp group ({} of {} connected)",
                   secs, addr_, info_.ranks_named(missing), connected + 1, size_);
        }
        int c = ::accept4(lis, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) continue;
        uint32_t hello[3];
        auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
        if (read_all(c, hello, sizeof(hello), hello_deadline) != Io::Ok || hello[0] != kHello) {
          ::close(c);
          continue;
        }
        const int r = static_cast<int>(hello[1]), w = static_cast<int>(hello[2]);
        if (w != size_ || r <= 0 || r >= size_ || fds_[static_cast<size_t>(r)] >= 0) {
          ::close(c);
          MS_THROW("rank 0: a peer at {} says it is rank {} of {}; this tcp group has {} ranks{}", addr_, r,
                   w, size_, r > 0 && r < size_ && w == size_ ? " and that rank has connected already" : "");
        }
        set_nodelay(c);
        fds_[static_cast<size_t>(r)] = c;
        ++connected;
      }
      const uint32_t ack = kHello;
      for (int r = 1; r < size_; ++r)
        if (write_all(fds_[static_cast<size_t>(r)], &ack, sizeof(ack), deadline) != Io::Ok)
          MS_THROW("rank 0: could not answer rank {} over {}", r, addr_);
    } catch (...) {
      ::close(lis);
      for (int& fd : fds_)
        if (fd >= 0) ::close(fd), fd = -1;
      throw;
    }
    ::close(lis);
    inbox_.resize(static_cast<size_t>(size_));
    return;
  }
  std::string last_error = "no attempt";
  const int c = connect_to(info, deadline, last_error);
  if (c < 0)
    MS_THROW("rank {}: could not reach rank 0 at {} within {} s (last error: {})", rank_, addr_, secs,
             last_error);
  fds_ = {c};
  set_nodelay(c);
  const uint32_t hello[3] = {kHello, static_cast<uint32_t>(rank_), static_cast<uint32_t>(size_)};
  uint32_t ack = 0;
  const Io w = write_all(c, hello, sizeof(hello), deadline);
  const Io r = w == Io::Ok ? read_all(c, &ack, sizeof(ack), deadline) : w;
  if (r != Io::Ok || ack != kHello) {
    ::close(c);
    fds_.clear();
    MS_THROW("rank {}: connected to rank 0 at {} but {} (rank 0 answers once all {} ranks have connected)",
             rank_, addr_,
             r == Io::Timeout ? fmt::format("had no answer within {} s", secs)
                              : std::string("rank 0 closed the connection (see rank 0's error)"),
             size_);
  }
}

TcpComm::~TcpComm() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

std::string TcpComm::describe() const {
  if (size_ == 1) return "tcp group of 1 process";
  return fmt::format("tcp group of {} processes via {}", size_, addr_);
}

std::string TcpComm::call_str(const Call& c) const {
  return fmt::format("{}(count {}, {}, root {})", op_name(c.op), c.count, dtype_name(c.dtype), c.root);
}

void TcpComm::check_open() const {
  if (failed_) MS_THROW("tcp group: {}", reason_);
}

void TcpComm::fail(const std::string& reason) {
  if (!failed_) {
    failed_ = true;
    reason_ = reason;
    if (rank_ == 0) {
      // Best effort, briefly: a peer that is gone or stuck must not hold up this rank's error.
      Wire w;
      w.kind = kAbort;
      w.bytes = reason.size();
      const auto deadline = Clock::now() + std::chrono::milliseconds(500);
      for (int fd : fds_)
        if (fd >= 0 && write_all(fd, &w, sizeof(w), deadline) == Io::Ok)
          write_all(fd, reason.data(), reason.size(), deadline);
    }
  }
  MS_THROW("tcp group: {}", reason_);
}

void TcpComm::abort(const std::string& reason) {
  if (failed_ || size_ == 1) {
    failed_ = true;
    if (reason_.empty()) reason_ = fmt::format("rank {} failed: {}", rank_, reason);
    return;
  }
  failed_ = true;
  reason_ = fmt::format("rank {} failed: {}", rank_, reason);
  Wire w;
  w.kind = kAbort;
  w.bytes = reason_.size();
  const auto deadline = Clock::now() + std::chrono::milliseconds(1000);
  for (int fd : fds_)
    if (fd >= 0 && write_all(fd, &w, sizeof(w), deadline) == Io::Ok)
      write_all(fd, reason_.data(), reason_.size(), deadline);
}

void TcpComm::round(const Call& c, const void* in, size_t in_bytes, void* out, size_t out_bytes) {
  // Peers only: send the call and input, receive the result.
  const int fd = fds_[0];
  Wire w;
  w.kind = static_cast<uint32_t>(c.op);
  w.count = c.count;
  w.dtype = static_cast<int32_t>(c.dtype);
  w.root = c.root;
  w.bytes = in_bytes;
  const auto deadline = Clock::now() + 2 * opt_.timeout;
  Io io = write_all(fd, &w, sizeof(w), deadline, true);
  if (io == Io::Ok && in_bytes) io = write_all(fd, in, in_bytes, deadline, true);
  if (io == Io::Timeout)
    fail(fmt::format("rank {} could not send {} to rank 0 within {} ms", rank_, call_str(c),
                     2 * opt_.timeout.count()));
  if (io == Io::Closed)
    fail(fmt::format("rank 0 closed its connection (its process ended?) while rank {} sent {}", rank_,
                     call_str(c)));
  Wire r;
  io = read_all(fd, &r, sizeof(r), deadline);
  if (io == Io::Timeout)
    fail(fmt::format("rank 0 did not answer {} within {} ms (rank {} waited)", call_str(c),
                     2 * opt_.timeout.count(), rank_));
  if (io == Io::Closed)
    fail(fmt::format("rank 0 closed its connection (its process ended?) during {} of rank {}", call_str(c),
                     rank_));
  if (r.magic != kMsg || r.bytes > kMaxPayload)
    fail(fmt::format("rank {}: a message from rank 0 that is not the tcp group's", rank_));
  if (r.kind == kAbort) {
    std::string why(r.bytes, '\0');
    if (read_all(fd, why.data(), why.size(), Clock::now() + std::chrono::seconds(5)) != Io::Ok)
      why = "rank 0 aborted the group (its reason was cut off)";
    fail(why);
  }
  if (r.kind != static_cast<uint32_t>(c.op) || r.bytes != out_bytes)
    fail(fmt::format("rank {}: rank 0 answered {} with {} bytes of op {}, expected {} bytes", rank_,
                     call_str(c), r.bytes, r.kind, out_bytes));
  if (out_bytes && read_all(fd, out, out_bytes, deadline) != Io::Ok)
    fail(fmt::format("rank {}: rank 0's answer to {} was cut off", rank_, call_str(c)));
}

namespace {

// Rank 0's side of a round, per peer.
struct Pending {
  Wire head;
  size_t got_head = 0, got = 0;
  bool done = false;
};

}  // namespace

std::vector<const unsigned char*> TcpComm::gather(const Call& c, const void* in,
                                                  const std::function<size_t(int)>& in_bytes) {
  std::vector<Pending> st(static_cast<size_t>(size_));
  const auto deadline = Clock::now() + opt_.timeout;
  int left = size_ - 1;
  std::vector<pollfd> pf;
  std::vector<int> who;
  while (left > 0) {
    pf.clear(), who.clear();
    for (int r = 1; r < size_; ++r)
      if (!st[static_cast<size_t>(r)].done) {
        pf.push_back({fds_[static_cast<size_t>(r)], POLLIN, 0});
        who.push_back(r);
      }
    int rc = ::poll(pf.data(), pf.size(), ms_left(deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      fail(fmt::format("rank 0: poll: {}", std::strerror(errno)));
    }
    if (rc == 0) {
      // Only those that have not begun their message: one caught mid-message is slow, not missing.
      fail(fmt::format("{} did not reach {} within {} ms (rank 0 waited)", info_.ranks_named(who),
                       call_str(c), opt_.timeout.count()));
    }
    for (size_t k = 0; k < pf.size(); ++k) {
      if (!pf[k].revents) continue;
      const int r = who[k];
      Pending& p = st[static_cast<size_t>(r)];
      auto& buf = inbox_[static_cast<size_t>(r)];
      void* dst;
      size_t want;
      if (p.got_head < sizeof(Wire)) {
        dst = reinterpret_cast<unsigned char*>(&p.head) + p.got_head;
        want = sizeof(Wire) - p.got_head;
      } else {
        dst = buf.data() + p.got;
        want = buf.size() - p.got;
      }
      ssize_t n = want ? ::recv(pf[k].fd, dst, want, MSG_DONTWAIT) : 0;
      if (want && n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (want && n <= 0)
        fail(fmt::format("{} closed its connection to rank 0 (its process ended?)", info_.rank_name(r)));
      if (p.got_head < sizeof(Wire)) {
        p.got_head += static_cast<size_t>(n);
        if (p.got_head == sizeof(Wire)) {
          const Wire& h = p.head;
          if (h.magic != kMsg || (h.kind == kAbort ? h.bytes > (1u << 20) : h.bytes > kMaxPayload))
            fail(fmt::format("rank {} sent rank 0 a message that is not the tcp group's", r));
          // A mismatched call is named before its input is read (its size may be anything).
          if (h.kind != kAbort) {
            if (h.kind != static_cast<uint32_t>(c.op) || h.count != c.count ||
                h.dtype != static_cast<int32_t>(c.dtype) || h.root != c.root)
              fail(fmt::format("rank {} called {}(count {}, {}, root {}) while rank 0 called {}", r,
                               h.kind >= 1 && h.kind <= 6 ? op_name(static_cast<Op>(h.kind)) : "?", h.count,
                               h.dtype >= 0 ? dtype_name(static_cast<DType>(h.dtype)) : "?", h.root,
                               call_str(c)));
            if (h.bytes != in_bytes(r))
              fail(fmt::format("rank {} sent {} bytes for {}, expected {}", r, h.bytes, call_str(c),
                               in_bytes(r)));
          }
          buf.resize(h.bytes);
        }
      } else {
        p.got += static_cast<size_t>(n);
      }
      if (p.got_head == sizeof(Wire) && p.got == buf.size()) {
        if (p.head.kind == kAbort) fail(std::string(buf.begin(), buf.end()));
        p.done = true;
        --left;
      }
    }
  }
  std::vector<const unsigned char*> ins(static_cast<size_t>(size_));
  ins[0] = static_cast<const unsigned char*>(in);
  for (int r = 1; r < size_; ++r) ins[static_cast<size_t>(r)] = inbox_[static_cast<size_t>(r)].data();
  return ins;
}

void TcpComm::reply(int r, const Call& c, const void* p, size_t n) {
  Wire w;
  w.kind = static_cast<uint32_t>(c.op);
  w.count = c.count;
  w.dtype = static_cast<int32_t>(c.dtype);
  w.root = c.root;
  w.bytes = n;
  const int fd = fds_[static_cast<size_t>(r)];
  const auto deadline = Clock::now() + opt_.timeout;
  Io io = write_all(fd, &w, sizeof(w), deadline);
  if (io == Io::Ok && n) io = write_all(fd, p, n, deadline);
  if (io == Io::Closed)
    fail(fmt::format("{} closed its connection to rank 0 (its process ended?)", info_.rank_name(r)));
  if (io != Io::Ok)
    fail(fmt::format("{} did not take rank 0's answer to {} within {} ms", info_.rank_name(r), call_str(c),
                     opt_.timeout.count()));
}

void TcpComm::all_reduce_sum(void* data, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype == DType::F32 || dtype == DType::BF16, "all_reduce_sum: dtype {} (f32 or bf16)",
           dtype_name(dtype));
  MS_CHECK(count >= 0, "all_reduce_sum: negative count {}", count);
  check_open();
  if (size_ == 1) return;
  const Call c{Op::AllReduceSum, count, dtype, 0};
  const size_t n = static_cast<size_t>(count), nb = dtype_bytes(dtype, n);
  if (rank_ != 0) return round(c, data, nb, data, nb);
  auto ins = gather(c, data, [&](int) { return nb; });
  sum_ranks(acc_, ins, dtype, 0, n);
  bytes_.resize(nb);
  store(acc_, dtype, bytes_.data());
  for (int r = 1; r < size_; ++r) reply(r, c, bytes_.data(), nb);
  if (nb) std::memcpy(data, bytes_.data(), nb);
}

void TcpComm::all_gather(const void* in, void* out, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype != DType::NVFP4, "all_gather: nvfp4 is not a per-element dtype");
  MS_CHECK(count >= 0, "all_gather: negative count {}", count);
  check_open();
  const size_t nb = dtype_bytes(dtype, static_cast<size_t>(count)), all = nb * static_cast<size_t>(size_);
  if (size_ == 1) {
    if (nb && in != out) std::memmove(out, in, nb);
    return;
  }
  const Call c{Op::AllGather, count, dtype, 0};
  if (rank_ != 0) return round(c, in, nb, out, all);
  auto ins = gather(c, in, [&](int) { return nb; });
  bytes_.resize(all);
  for (int r = 0; r < size_; ++r)
    if (nb) std::memcpy(bytes_.data() + nb * static_cast<size_t>(r), ins[static_cast<size_t>(r)], nb);
  for (int r = 1; r < size_; ++r) reply(r, c, bytes_.data(), all);
  if (all) std::memcpy(out, bytes_.data(), all);
}

void TcpComm::reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype == DType::F32 || dtype == DType::BF16, "reduce_scatter_sum: dtype {} (f32 or bf16)",
           dtype_name(dtype));
  MS_CHECK(count >= 0, "reduce_scatter_sum: negative count {}", count);
  check_open();
  const size_t n = static_cast<size_t>(count), nb = dtype_bytes(dtype, n),
               all = nb * static_cast<size_t>(size_);
  if (size_ == 1) {
    if (nb && in != out) std::memmove(out, in, nb);
    return;
  }
  const Call c{Op::ReduceScatterSum, count, dtype, 0};
  if (rank_ != 0) return round(c, in, all, out, nb);
  auto ins = gather(c, in, [&](int) { return all; });
  bytes_.resize(all);
  for (int r = 0; r < size_; ++r) {
    sum_ranks(acc_, ins, dtype, n * static_cast<size_t>(r), n);
    store(acc_, dtype, bytes_.data() + nb * static_cast<size_t>(r));
  }
  for (int r = 1; r < size_; ++r) reply(r, c, bytes_.data() + nb * static_cast<size_t>(r), nb);
  if (nb) std::memcpy(out, bytes_.data(), nb);
}

void TcpComm::broadcast(void* data, int64_t count, DType dtype, int root, void*) {
  MS_CHECK(root >= 0 && root < size_, "broadcast: root {} outside {} ranks", root, size_);
  MS_CHECK(dtype != DType::NVFP4, "broadcast: nvfp4 is not a per-element dtype");
  MS_CHECK(count >= 0, "broadcast: negative count {}", count);
  check_open();
  if (size_ == 1) return;
  const size_t nb = dtype_bytes(dtype, static_cast<size_t>(count));
  const Call c{Op::Broadcast, count, dtype, root};
  // Only the root's bytes travel to rank 0, and back to everyone but the root.
  if (rank_ != 0) return round(c, data, rank_ == root ? nb : 0, data, rank_ == root ? 0 : nb);
  auto ins = gather(c, data, [&](int r) { return r == root ? nb : size_t{0}; });
  if (root != 0) {
    bytes_.assign(ins[static_cast<size_t>(root)], ins[static_cast<size_t>(root)] + nb);
  } else {
    bytes_.resize(nb);
    if (nb) std::memcpy(bytes_.data(), data, nb);
  }
  for (int r = 1; r < size_; ++r) reply(r, c, bytes_.data(), r == root ? 0 : nb);
  if (nb) std::memcpy(data, bytes_.data(), nb);
}

void TcpComm::all_reduce_max(void* data, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype == DType::F32 || dtype == DType::I32, "all_reduce_max: dtype {} (i32 or f32)",
           dtype_name(dtype));
  MS_CHECK(count >= 0, "all_reduce_max: negative count {}", count);
  check_open();
  if (size_ == 1) return;
  const Call c{Op::AllReduceMax, count, dtype, 0};
  const size_t n = static_cast<size_t>(count), nb = n * 4;
  if (rank_ != 0) return round(c, data, nb, data, nb);
  auto ins = gather(c, data, [&](int) { return nb; });
  bytes_.assign(ins[0], ins[0] + nb);
  for (int r = 1; r < size_; ++r) {
    if (dtype == DType::F32) {
      float* a = reinterpret_cast<float*>(bytes_.data());
      const float* x = reinterpret_cast<const float*>(ins[static_cast<size_t>(r)]);
      for (size_t i = 0; i < n; ++i) a[i] = std::max(a[i], x[i]);
    } else {
      int32_t* a = reinterpret_cast<int32_t*>(bytes_.data());
      const int32_t* x = reinterpret_cast<const int32_t*>(ins[static_cast<size_t>(r)]);
      for (size_t i = 0; i < n; ++i) a[i] = std::max(a[i], x[i]);
    }
  }
  for (int r = 1; r < size_; ++r) reply(r, c, bytes_.data(), nb);
  if (nb) std::memcpy(data, bytes_.data(), nb);
}

void TcpComm::barrier() {
  check_open();
  if (size_ == 1) return;
  const Call c{Op::Barrier, 0, DType::F32, 0};
  if (rank_ != 0) return round(c, nullptr, 0, nullptr, 0);
  gather(c, nullptr, [](int) { return size_t{0}; });
  for (int r = 1; r < size_; ++r) reply(r, c, nullptr, 0);
}

}  // namespace ms::dist
