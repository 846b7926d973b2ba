#include "dist/dispatch_plan.h"

#include <algorithm>

#include "core/error.h"

namespace ms::dist {

namespace {

// The replica serving routed slot (t, j) of a token living on `rank`.
const ExpertSlot& pick_replica(const ExpertPlacement& p, int32_t expert, int64_t t, int j, int k, int rank) {
  const auto& copies = p.replicas(expert);
  for (const auto& c : copies)
    if (c.rank == rank) return c;
  return copies[static_cast<size_t>((t * k + j) % static_cast<int64_t>(copies.size()))];
}

void check_ids(std::span<const int32_t> routed, int64_t m, int k, const ExpertPlacement& p, const char* what,
               int rank) {
  MS_CHECK(k >= 1, "k {} must be at least 1", k);
  MS_CHECK(static_cast<int64_t>(routed.size()) == m * k, "{} of rank {}: {} ids for m {} x k {}", what, rank,
           routed.size(), m, k);
  for (size_t i = 0; i < routed.size(); ++i)
    if (routed[i] < 0 || routed[i] >= p.n_experts())
      MS_THROW("{} of rank {}: routed[{}][{}] = {} is out of range [0, {})", what, rank, i / k, i % k,
               routed[i], p.n_experts());
}

}  // namespace

int64_t AllToAllPlan::remote_recv_rows() const {
  MS_CHECK(static_cast<int>(recv_counts.size()) == ep_size, "recv counts not filled (fill_recv)");
  int64_t n = 0;
  for (int r = 0; r < ep_size; ++r)
    if (r != rank) n += recv_counts[r];
  return n;
}

AllToAllPlan plan_all_to_all(std::span<const int32_t> routed, int m, int k, const ExpertPlacement& placement,
                             int rank) {
  const int ep = placement.ep_size();
  MS_CHECK(rank >= 0 && rank < ep, "rank {} out of range for ep_size {}", rank, ep);
  MS_CHECK(m >= 0, "m {} is negative", m);
  check_ids(routed, m, k, placement, "routed", rank);
  AllToAllPlan p;
  p.rank = rank, p.ep_size = ep, p.m = m, p.k = k;
  const size_t mk = static_cast<size_t>(m) * k;
  p.dest_rank.resize(mk), p.dest_slot.resize(mk), p.dest_row.resize(mk);
  // Row of (t, r) within r's block; -1 until the token first routes to r.
  std::vector<int32_t> local_row(static_cast<size_t>(m) * ep, -1);
  std::vector<std::vector<int32_t>> block(ep);  // tokens per destination, in token order
  for (int t = 0; t < m; ++t)
    for (int j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(t) * k + j;
      const ExpertSlot& c = pick_replica(placement, routed[i], t, j, k, rank);
      p.dest_rank[i] = c.rank;
      p.dest_slot[i] = c.slot;
      int32_t& lr = local_row[static_cast<size_t>(t) * ep + c.rank];
      if (lr < 0) {
        lr = static_cast<int32_t>(block[c.rank].size());
        block[c.rank].push_back(t);
      }
    }
  p.send_counts.resize(ep), p.send_offsets.resize(ep);
  int64_t off = 0;
  for (int r = 0; r < ep; ++r) {
    p.send_offsets[r] = off;
    p.send_counts[r] = static_cast<int64_t>(block[r].size());
    p.send_token.insert(p.send_token.end(), block[r].begin(), block[r].end());
    off += p.send_counts[r];
  }
  for (size_t i = 0; i < mk; ++i) {
    const int r = p.dest_rank[i];
    p.dest_row[i] = static_cast<int32_t>(p.send_offsets[r] + local_row[(i / k) * ep + r]);
  }
  return p;
}

void fill_recv(std::vector<AllToAllPlan>& plans) {
  const int ep = static_cast<int>(plans.size());
  for (int r = 0; r < ep; ++r) {
    MS_CHECK(plans[r].rank == r && plans[r].ep_size == ep, "plans[{}]: rank {} of ep_size {}", r,
             plans[r].rank, plans[r].ep_size);
  }
  for (int r = 0; r < ep; ++r) {
    auto& p = plans[r];
    p.recv_counts.assign(ep, 0), p.recv_offsets.assign(ep, 0);
    int64_t off = 0;
    for (int s = 0; s < ep; ++s) {
      p.recv_offsets[s] = off;
      p.recv_counts[s] = plans[s].send_counts[r];
      off += p.recv_counts[s];
    }
  }
}

AllGatherPlan plan_all_gather(const std::vector<std::vector<int32_t>>& routed_by_rank, int k,
                              const ExpertPlacement& placement, int rank) {
  const int ep = placement.ep_size();
  MS_CHECK(static_cast<int>(routed_by_rank.size()) == ep, "routed ids for {} ranks, ep_size {}",
           routed_by_rank.size(), ep);
  MS_CHECK(rank >= 0 && rank < ep, "rank {} out of range for ep_size {}", rank, ep);
  AllGatherPlan p;
  p.rank = rank, p.ep_size = ep, p.k = k;
  p.rank_tokens.resize(ep);
  for (int s = 0; s < ep; ++s) {
    MS_CHECK(k >= 1 && routed_by_rank[s].size() % k == 0,
             "routed ids of rank {}: {} is not a multiple of k {}", s, routed_by_rank[s].size(), k);
    p.rank_tokens[s] = static_cast<int64_t>(routed_by_rank[s].size()) / k;
    check_ids(routed_by_rank[s], p.rank_tokens[s], k, placement, "routed", s);
    p.rows_per_rank = std::max(p.rows_per_rank, p.rank_tokens[s]);
  }
  for (int s = 0; s < ep; ++s)
    for (int64_t t = 0; t < p.rank_tokens[s]; ++t)
      for (int j = 0; j < k; ++j) {
        const ExpertSlot& c = pick_replica(placement, routed_by_rank[s][t * k + j], t, j, k, s);
        if (c.rank != rank) continue;
        p.work_row.push_back(s * p.rows_per_rank + t);
        p.work_slot.push_back(c.slot);
        p.work_k.push_back(j);
      }
  return p;
}

const char* exchange_name(Exchange e) {
  return e == Exchange::AllToAll ? "all_to_all" : "all_gather_reduce_scatter";
}

ExchangeCost choose_exchange(const std::vector<AllToAllPlan>& plans, int64_t hidden, int dtype_bytes,
                             uint64_t a2a_overhead_bytes) {
  MS_CHECK(!plans.empty(), "no plans");
  MS_CHECK(hidden > 0 && dtype_bytes > 0, "hidden {} and dtype_bytes {} must be positive", hidden,
           dtype_bytes);
  const uint64_t row = static_cast<uint64_t>(hidden) * static_cast<uint64_t>(dtype_bytes);
  const uint64_t ep = plans.size();
  ExchangeCost c;
  int64_t rows_per_rank = 0;  // the all-gather's pieces are padded to the largest rank's token count
  for (const auto& p : plans) {
    rows_per_rank = std::max<int64_t>(rows_per_rank, p.m);
    // What leaves this rank: its dispatch rows to other ranks, then the combined rows it returns to them.
    const uint64_t out_rows = static_cast<uint64_t>(p.remote_send_rows() + p.remote_recv_rows());
    c.all_to_all_bytes = std::max(c.all_to_all_bytes, out_rows * row);
  }
  // m_total = ep * rows_per_rank; each of the two collectives moves m_total * row * (ep - 1) / ep per rank.
  c.all_gather_bytes = 2 * static_cast<uint64_t>(rows_per_rank) * row * (ep - 1);
  c.choice = c.all_gather_bytes <= c.all_to_all_bytes + a2a_overhead_bytes ? Exchange::AllGather
                                                                           : Exchange::AllToAll;
  return c;
}

PaddedAllToAllPlan pad_all_to_all(const AllToAllPlan& plan, int64_t capacity) {
  MS_CHECK(capacity >= 0, "capacity {} is negative", capacity);
  PaddedAllToAllPlan p;
  p.ep_size = plan.ep_size;
  p.capacity = capacity;
  p.valid.assign(plan.ep_size, 0);
  p.row_position.assign(plan.send_token.size(), -1);
  for (int r = 0; r < plan.ep_size; ++r) {
    p.needed_capacity = std::max(p.needed_capacity, plan.send_counts[r]);
    p.valid[r] = std::min(plan.send_counts[r], capacity);
    p.overflow_rows += plan.send_counts[r] - p.valid[r];
    for (int64_t i = 0; i < p.valid[r]; ++i)
      p.row_position[plan.send_offsets[r] + i] = static_cast<int32_t>(r * capacity + i);
  }
  return p;
}

}  // namespace ms::dist
