// Communicator over NCCL: one rank per GPU, collectives on device buffers and the caller's cudaStream_t,
// capturable in CUDA graphs (no host synchronisation inside a collective; under capture NCCL records graph
// nodes). The communicator is non-blocking (ncclConfig_t::blocking = 0): every NCCL call returns at once and
// is polled with ncclCommGetAsyncError against a deadline, so start-up and enqueueing never hang.
//
// Failure handling: a watchdog thread polls ncclCommGetAsyncError and the completion of every collective
// enqueued outside graph capture (an event recorded after it); an NCCL error, or a collective not done
// within op_timeout (a rank died or hung), aborts the communicator (ncclCommAbort, which also ends NCCL
// kernels spinning on the GPU) and the next call on this communicator throws ms::Error naming the rank and
// NCCL's message. Graph replays are watched by calling watch(stream) after the launch.
//
// nccl_comm.cpp is compiled with NCCL only when CMake found it (MOESERVE_HAVE_NCCL); without it
// nccl_available() is false and connect_nccl / nccl_unique_id throw ("NCCL is missing ..."), so that
// `--tp-size 2` fails with a message, not a link error. NcclComm's members exist only in NCCL builds.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/rank_info.h"

namespace ms::dist {

struct NcclOptions {
  std::chrono::milliseconds init_timeout{std::chrono::minutes(5)};  // ncclCommInitRankConfig, all ranks
  std::chrono::milliseconds op_timeout{std::chrono::minutes(5)};    // one collective / watched work to finish
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(50)};  // the watchdog's period
};

bool nccl_available();
std::string nccl_version();  // "2.28.9" (the library loaded), or "missing"
// A fresh ncclUniqueId as bytes (rank 0 only; 128 bytes), for exchange_unique_id.
std::vector<uint8_t> nccl_unique_id();

class NcclComm final : public Communicator {
 public:
  // For the current CUDA device. unique_id: rank 0's nccl_unique_id(), the same bytes on every rank.
  // Sets NCCL_NVLS_ENABLE=0 first unless the user set it. Throws ms::Error naming the rank on an NCCL error
  // or when the ranks do not all join within init_timeout (then aborts the half-made communicator).
  NcclComm(std::span<const uint8_t> unique_id, int rank, int size, NcclOptions options = {});
  ~NcclComm() override;  // waits (bounded) for queued work, then destroys; aborts when that fails
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override;
  int size() const override;
  std::string describe() const override;  // "NCCL 2.28.9, rank 1 of 2 on cuda:1"
  int device() const;

  void all_reduce_sum(void* data, int64_t count, DType dtype, void* stream) override;
  void all_gather(const void* in, void* out, int64_t count, DType dtype, void* stream) override;
  void reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype, void* stream) override;
  void broadcast(void* data, int64_t count, DType dtype, int root, void* stream) override;
  void all_reduce_max(void* data, int64_t count, DType dtype, void* stream) override;
  // A one-element all-reduce on an internal stream, waited for by polling (deadline op_timeout).
  void barrier() override;

  // Puts the work queued on `stream` so far (a graph replay with collectives inside) under the watchdog:
  // not finished within op_timeout aborts the communicator. Not for use while `stream` is capturing.
  void watch(void* stream);
  // Throws the watchdog's error, if it has seen one.
  void check() const;
  // Aborts now (a peer is known to be gone); later calls throw `reason`.
  void abort(const std::string& reason) override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// What a rank does to join its group: selects CUDA device info.local_rank, has rank 0 make the unique id,
// exchanges it over TCP (exchange_unique_id, timeout options.init_timeout) and creates the NcclComm.
// Throws ms::Error saying NCCL is missing in a build without it.
std::unique_ptr<Communicator> connect_nccl(const RankInfo& info, NcclOptions options = {});

}  // namespace ms::dist
