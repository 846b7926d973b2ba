// ops::remap_ids_replicated on the CPU: every (token, k) assignment of an expert with several copies lands on
// exactly one rank (the copy (t + k) mod copies), and the copies share the assignments evenly.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"
#include "dist/expert_placement.h"
#include "ops/ops.h"

namespace ms {
namespace {

Tensor i32(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// The tables of `rank` as the model builds them from a placement: copies [E], slots [E, R].
void tables(const dist::ExpertPlacement& p, int rank, std::vector<int32_t>& copies,
            std::vector<int32_t>& slots, int& R) {
  const int E = p.n_experts();
  R = 1;
  for (int e = 0; e < E; ++e) R = std::max(R, static_cast<int>(p.replicas(e).size()));
  copies.assign(static_cast<size_t>(E), 0);
  slots.assign(static_cast<size_t>(E * R), -1);
  for (int e = 0; e < E; ++e) {
    copies[static_cast<size_t>(e)] = static_cast<int32_t>(p.replicas(e).size());
    for (size_t c = 0; c < p.replicas(e).size(); ++c)
      if (p.replicas(e)[c].rank == rank) slots[static_cast<size_t>(e * R) + c] = p.replicas(e)[c].slot;
  }
}

TEST(RemapIdsReplicated, EachAssignmentRunsOnExactlyOneCopy) {
  const int E = 16, ep = 4, K = 4;
  const int64_t m = 37;
  std::vector<uint64_t> counts(E, 5);
  counts[3] = 900, counts[7] = 400, counts[8] = 300;  // 3 gets copies on every rank, 7 and 8 more than one
  const auto p = dist::ExpertPlacement::with_redundancy(E, ep, 8, counts);
  ASSERT_GE(p.replicas(3).size(), 3u);
  std::mt19937 rng(5);
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  for (auto& v : ids) v = static_cast<int32_t>(rng() % 4 == 0 ? 3 : rng() % E);
  ids[5] = -1;  // an empty slot stays empty everywhere
  const Tensor tid = i32(ids, {m, K});
  std::vector<int> hits(ids.size(), 0);
  std::vector<std::vector<int>> per_copy(E);
  for (int e = 0; e < E; ++e) per_copy[e].assign(p.replicas(e).size(), 0);
  for (int r = 0; r < ep; ++r) {
    std::vector<int32_t> copies, slots;
    int R = 0;
    tables(p, r, copies, slots, R);
    const Tensor out = Tensor::empty({m, K}, DType::I32);
    ops::remap_ids_replicated(ops::Ctx::cpu(), tid, i32(copies, {E}), i32(slots, {E, R}), out);
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t s = out.data<int32_t>()[i];
      if (s < 0) continue;
      ++hits[i];
      ASSERT_LT(s, static_cast<int32_t>(p.local_experts(r).size()));
      EXPECT_EQ(p.local_experts(r)[static_cast<size_t>(s)], ids[i]) << "rank " << r << " slot " << s;
      for (size_t c = 0; c < p.replicas(ids[i]).size(); ++c)
        if (p.replicas(ids[i])[c].rank == r) ++per_copy[static_cast<size_t>(ids[i])][c];
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(hits[i], ids[i] < 0 ? 0 : 1) << "assignment " << i;
  // Expert 3's assignments spread over its copies (none idle, none with twice its share).
  int n3 = 0;
  for (int32_t v : ids) n3 += v == 3;
  for (int c : per_copy[3]) {
    EXPECT_GT(c, 0);
    EXPECT_LE(c, 2 * n3 / static_cast<int>(per_copy[3].size()));
  }
}

TEST(RemapIdsReplicated, BadTablesAreNamed) {
  const Tensor ids = i32({0, 2, 1, 0}, {2, 2});
  const Tensor out = Tensor::empty({2, 2}, DType::I32);
  const Tensor slots = i32({0, -1, 1, -1}, {2, 2});
  try {
    ops::remap_ids_replicated(ops::Ctx::cpu(), ids, i32({1, 1}, {2}), slots, out);
    ADD_FAILURE() << "id 2 of a table of 2 experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 2 outside the table of 2"), std::string::npos) << e.what();
  }
  const Tensor ok = i32({0, 1, 1, 0}, {2, 2});
  EXPECT_THROW(ops::remap_ids_replicated(ops::Ctx::cpu(), ok, i32({3, 1}, {2}), slots, out), Error);
  EXPECT_THROW(ops::remap_ids_replicated(ops::Ctx::cpu(), ok, i32({1, 1, 1}, {3}), slots, out), Error);
}

// ops::append_expert_slot (the shared expert run as a routed one): every row keeps its k choices in order and
// gains (id, weight) last; shapes that do not match are named.
TEST(AppendExpertSlot, EveryRowGainsTheExpertLast) {
  const int64_t m = 5, k = 3;
  std::vector<int32_t> ids(static_cast<size_t>(m * k));
  std::vector<float> wts(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 7) % 11);
    wts[i] = 0.125f * static_cast<float>(i + 1);
  }
  const Tensor t_ids = i32(ids, {m, k});
  Tensor t_wts = Tensor::empty({m, k}, DType::F32);
  std::copy(wts.begin(), wts.end(), t_wts.data<float>());
  Tensor ids_out = Tensor::empty({m, k + 1}, DType::I32), wts_out = Tensor::empty({m, k + 1}, DType::F32);
  ops::append_expert_slot(ops::Ctx::cpu(), t_ids, t_wts, 11, 1.0f, ids_out, wts_out);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(ids_out.data<int32_t>()[t * (k + 1) + j], ids[static_cast<size_t>(t * k + j)]);
      EXPECT_EQ(wts_out.data<float>()[t * (k + 1) + j], wts[static_cast<size_t>(t * k + j)]);
    }
    EXPECT_EQ(ids_out.data<int32_t>()[t * (k + 1) + k], 11);
    EXPECT_EQ(wts_out.data<float>()[t * (k + 1) + k], 1.0f);
  }
  Tensor narrow = Tensor::empty({m, k}, DType::I32);
  try {
    ops::append_expert_slot(ops::Ctx::cpu(), t_ids, t_wts, 11, 1.0f, narrow, wts_out);
    ADD_FAILURE() << "an output of k columns was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids_out"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ms
