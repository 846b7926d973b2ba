// The collectives tensor and expert parallelism need, behind one interface, so the model's forward names
// where ranks meet (after o_proj, after the MoE combine) without knowing how they meet:
//   - LocalGroup (dist/local_group.h): ranks are threads of one process over host memory (the CPU executor's
//     tensor / expert parallel runs, and the tests that prove a sharded forward equals the whole one);
//   - NcclComm (dist/nccl_comm.h): one rank per GPU over NCCL, on the executor's stream, capturable in
//   graphs.
// Every rank calls the same collectives in the same order with the same counts (the step plan is the same on
// every rank); a collective that cannot complete (a rank died, a timeout) throws ms::Error naming the rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ms::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local group of 2 threads", "NCCL 2.28, 4 ranks over 1 node": for logs and /metrics.
  virtual std::string describe() const = 0;

  // In place: data[i] = sum over ranks of data[i]. dtype F32 or BF16 (BF16 sums in f32 where the transport
  // allows). `stream` is the cudaStream_t of a device buffer (NcclComm), ignored by host transports.
  virtual void all_reduce_sum(void* data, int64_t count, DType dtype, void* stream) = 0;
  // out [size * count] = every rank's in [count], in rank order.
  virtual void all_gather(const void* in, void* out, int64_t count, DType dtype, void* stream) = 0;
  // out [count] = sum over ranks of their in [rank * count .. (rank + 1) * count).
  virtual void reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype, void* stream) = 0;
  // In place: every rank's data becomes root's.
  virtual void broadcast(void* data, int64_t count, DType dtype, int root, void* stream) = 0;
  // Element-wise max over ranks, in place (the OEA base set: one flag per expert). I32 or F32.
  virtual void all_reduce_max(void* data, int64_t count, DType dtype, void* stream) = 0;
  // Every rank has reached this point (host-side; device work already queued is not waited for).
  virtual void barrier() = 0;
  // Fails the group because this rank cannot go on (its step threw): the other ranks' pending and later
  // collectives throw instead of waiting for it, and so do this rank's. `reason` says why; a host transport
  // passes it on to the others (LocalComm), NCCL only to this rank's own later calls.
  virtual void abort(const std::string& reason) = 0;
};

// How a model is split over ranks: heads of attention and the dense MLPs over tp_size ranks, routed experts
// over ep_size ranks (rank r holds the experts its placement lists). tp_size == ep_size == world size when
// both are on (the usual TP+EP layout); either may be 1.
struct ShardSpec {
  int tp_rank = 0, tp_size = 1;
  int ep_rank = 0, ep_size = 1;
  bool sharded() const { return tp_size > 1 || ep_size > 1; }
};

}  // namespace ms::dist
