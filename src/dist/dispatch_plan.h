// The host-side plan of one MoE layer's expert-parallel exchange for one step: which token rows each rank
// sends where, the counts and offsets an all-to-all needs, the all-gather + reduce-scatter alternative for
// small decode batches, a chooser between them by bytes moved, and a fixed-shape (CUDA-graph-safe) padded
// all-to-all with a per-rank capacity.
//
// Bytes model (what choose_exchange compares, per rank, both directions, self-copies excluded):
//   bytes per token row = hidden * dtype_bytes;
//   all-to-all:   dispatch sends each distinct (token, remote rank) pair one row, combine sends it back
//                 (the remote rank sums its experts' weighted outputs for that token first):
//                 2 * remote_rows * row_bytes, the slowest rank counting;
//   all-gather + reduce-scatter: every rank receives the other ranks' tokens and sends back partial sums:
//                 2 * m_total * row_bytes * (ep - 1) / ep, m_total the tokens of all ranks together
//                 (NCCL's ring moves (ep-1)/ep of the buffer per rank for each collective).
// Rows of a token routed to several experts on one rank travel once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dist/expert_placement.h"

namespace ms::dist {

// One rank's side of an all-to-all for its own m tokens. Rows are (token, destination rank) pairs.
struct AllToAllPlan {
  int rank = 0, ep_size = 1, m = 0, k = 0;
  std::vector<int32_t> dest_rank;     // [m * k] rank serving routed slot (t, j)
  std::vector<int32_t> dest_slot;     // [m * k] local expert slot on that rank
  std::vector<int32_t> dest_row;      // [m * k] index of (t, dest_rank) in the send buffer
  std::vector<int32_t> send_token;    // [send rows] token of each row, grouped by destination rank
  std::vector<int64_t> send_counts;   // [ep] rows to each rank (self included: a local copy)
  std::vector<int64_t> send_offsets;  // [ep] first row for each rank
  std::vector<int64_t> recv_counts;   // [ep] rows from each rank (fill_recv)
  std::vector<int64_t> recv_offsets;  // [ep]
  int64_t send_rows() const { return static_cast<int64_t>(send_token.size()); }
  int64_t remote_send_rows() const { return send_rows() - send_counts[rank]; }
  int64_t remote_recv_rows() const;  // needs fill_recv
};

// routed: [m, k] expert ids of this rank's tokens (row-major, host). A routed slot uses the replica on
// `rank` when there is one, else replica (t * k + j) % copies. Throws naming the slot for an id out of range.
AllToAllPlan plan_all_to_all(std::span<const int32_t> routed, int m, int k, const ExpertPlacement& placement,
                             int rank);
// Sets recv_counts / recv_offsets of every rank's plan from the others' send_counts (what the count exchange
// before a real all-to-all delivers). plans: [ep], plans[r].rank == r.
void fill_recv(std::vector<AllToAllPlan>& plans);

// All-gather + reduce-scatter: every rank gathers all ranks' tokens (padded to the largest rank's count, as
// NCCL's all-gather needs equal pieces), runs its local experts on the rows routed to them and
// reduce-scatters the partial sums back.
struct AllGatherPlan {
  int rank = 0, ep_size = 1, k = 0;
  int64_t rows_per_rank = 0;         // padded piece: max over ranks of m_r
  std::vector<int64_t> rank_tokens;  // [ep] m_r
  // This rank's work on the gathered buffer [ep * rows_per_rank, hidden]: one entry per routed slot served
  // here, in gathered-row order.
  std::vector<int64_t> work_row;   // gathered row (src_rank * rows_per_rank + t)
  std::vector<int32_t> work_slot;  // local expert slot
  std::vector<int32_t> work_k;     // which of the token's k choices (for its routing weight)
};
// routed_by_rank[r]: rank r's [m_r, k] ids. Each routed slot is served by exactly one rank: the replica on
// the token's own rank when there is one, else (t * k + j) % copies, as plan_all_to_all picks.
AllGatherPlan plan_all_gather(const std::vector<std::vector<int32_t>>& routed_by_rank, int k,
                              const ExpertPlacement& placement, int rank);

enum class Exchange { AllToAll, AllGather };
const char* exchange_name(Exchange e);

struct ExchangeCost {
  Exchange choice = Exchange::AllToAll;
  uint64_t all_to_all_bytes = 0;  // slowest rank, dispatch + combine (overhead not included)
  uint64_t all_gather_bytes = 0;  // per rank, all-gather + reduce-scatter
};
// plans: every rank's plan with fill_recv done. By bytes alone the all-to-all never moves more (a rank sends
// a token at most min(k, ep - 1) remote rows against the all-gather's ep - 1), so its fixed costs decide
// small batches: a2a_overhead_bytes is the byte-equivalent of the all-to-all's count exchange and launch
// latency (latency x link bandwidth, from measurement), added to its side. Ties go to the all-gather (fixed
// shapes, no count exchange).
ExchangeCost choose_exchange(const std::vector<AllToAllPlan>& plans, int64_t hidden, int dtype_bytes,
                             uint64_t a2a_overhead_bytes = 0);

// Fixed shapes for CUDA graphs: every (source, destination) pair gets `capacity` rows whatever the routing,
// so the all-to-all's counts never change; the valid rows per pair travel as data. capacity == m (this
// rank's token count) can never overflow, since a token sends at most one row to each rank.
struct PaddedAllToAllPlan {
  int ep_size = 1;
  int64_t capacity = 0;
  std::vector<int64_t> valid;         // [ep] rows used in each destination's block
  std::vector<int32_t> row_position;  // [send rows of the plan] dest * capacity + index, or -1 (overflow)
  int64_t overflow_rows = 0;          // rows that did not fit
  int64_t needed_capacity = 0;        // max valid: the capacity that would fit them all
};
PaddedAllToAllPlan pad_all_to_all(const AllToAllPlan& plan, int64_t capacity);

}  // namespace ms::dist
