// Ranks as processes over TCP, host memory: the Communicator of the CPU's one-process-per-rank runs (the
// layout GPUs use, with NcclComm swapped in) and of any run where NCCL is not there.
//
// A star through rank 0: for every collective each other rank sends rank 0 its call (op, count, dtype, root)
// and its input; rank 0 checks that every rank made the same call, computes each rank's result (sums in rank
// order, in f32, so every rank gets bit-identical results, as LocalComm does) and sends it back. Rank 0 waits
// on all its peers at once, so a rank that aborts (its message arrives in place of its call), closes its
// connection (its process ended) or does not come within the timeout is named to rank 0, which passes the
// reason on to the others; a rank that hears nothing from rank 0 within twice the timeout names rank 0.
// After a failure every call throws the first reason.
//
// Bootstrap: rank 0 listens on RankInfo::init_addr() (the port of the NCCL unique-id exchange, so never both
// in one run), the other ranks connect (retrying until connect_timeout, since rank 0 may start later) and say
// who they are; once every rank has connected rank 0 answers each, and only then do constructors return.
// Collectives and abort() are called from one thread per rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/rank_info.h"

namespace ms::dist {

struct TcpCommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};          // per collective
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};  // the bootstrap
};

class TcpComm final : public Communicator {
 public:
  // Blocks until the whole group is connected; throws ms::Error naming this rank, the address and (on rank
  // 0) the ranks that did not connect. World size 1 opens no socket.
  explicit TcpComm(const RankInfo& info, TcpCommOptions options = {});
  ~TcpComm() override;
  TcpComm(const TcpComm&) = delete;
  TcpComm& operator=(const TcpComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override;  // "tcp group of 2 processes via 127.0.0.1:29500"

  void all_reduce_sum(void* data, int64_t count, DType dtype, void* stream) override;
  void all_gather(const void* in, void* out, int64_t count, DType dtype, void* stream) override;
  void reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype, void* stream) override;
  void broadcast(void* data, int64_t count, DType dtype, int root, void* stream) override;
  void all_reduce_max(void* data, int64_t count, DType dtype, void* stream) override;
  void barrier() override;
  // Tells the group (rank 0 passes it on): the others' pending and later collectives throw
  // "rank R failed: reason".
  void abort(const std::string& reason) override;

  enum class Op : uint32_t {
    AllReduceSum = 1,
    AllGather,
    ReduceScatterSum,
    Broadcast,
    AllReduceMax,
    Barrier
  };

 private:
  struct Call {
    Op op;
    int64_t count;
    DType dtype;
    int root;
  };
  // A rank > 0's round: its call and input bytes to rank 0, its result (out_bytes) back into `out`.
  void round(const Call& c, const void* in, size_t in_bytes, void* out, size_t out_bytes);
  // Rank 0: every rank's input for `c` in rank order (its own is `in`; rank r must send in_bytes(r)),
  // waiting on all peers at once.
  std::vector<const unsigned char*> gather(const Call& c, const void* in,
                                           const std::function<size_t(int)>& in_bytes);
  // Rank 0: rank r's result.
  void reply(int r, const Call& c, const void* p, size_t n);
  [[noreturn]] void fail(const std::string& reason);  // rank 0 tells the peers; every rank throws
  void check_open() const;
  std::string call_str(const Call& c) const;

  int rank_ = 0, size_ = 1;
  RankInfo info_;  // names ranks with their node in messages
  std::string addr_;
  TcpCommOptions opt_;
  std::vector<int> fds_;  // rank 0: [size] (its own slot -1); others: [1], the connection to rank 0
  bool failed_ = false;
  std::string reason_;
  std::vector<std::vector<unsigned char>> inbox_;  // rank 0: each rank's input of the current round
  std::vector<float> acc_;
  std::vector<unsigned char> bytes_;
};

}  // namespace ms::dist
