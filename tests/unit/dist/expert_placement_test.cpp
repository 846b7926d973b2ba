// Expert placement: contiguous blocks, EPLB-style replicas of the hottest experts, JSON round trip and
// validation messages.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "core/error.h"
#include "dist/expert_placement.h"

namespace ms::dist {
namespace {

using nlohmann::json;

std::string error_of(const json& j) {
  try {
    ExpertPlacement::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every expert placed, each (rank, slot) used once and consistent with local_experts.
void expect_consistent(const ExpertPlacement& p) {
  std::set<std::pair<int, int>> seen;
  for (int e = 0; e < p.n_experts(); ++e) {
    ASSERT_FALSE(p.replicas(e).empty()) << e;
    std::set<int> ranks;
    for (const auto& c : p.replicas(e)) {
      EXPECT_TRUE(seen.insert({c.rank, c.slot}).second);
      EXPECT_TRUE(ranks.insert(c.rank).second) << "expert " << e << " twice on rank " << c.rank;
      EXPECT_EQ(p.local_experts(c.rank).at(c.slot), e);
    }
  }
  size_t slots = 0;
  for (int r = 0; r < p.ep_size(); ++r) slots += p.local_experts(r).size();
  EXPECT_EQ(slots, seen.size());
}

TEST(ExpertPlacement, ContiguousBlocks) {
  auto p = ExpertPlacement::contiguous(256, 4);
  EXPECT_EQ(p.ep_size(), 4);
  EXPECT_EQ(p.slots_per_rank(), 64);
  EXPECT_EQ(p.replicas(0), (std::vector<ExpertSlot>{{0, 0}}));
  EXPECT_EQ(p.replicas(64), (std::vector<ExpertSlot>{{1, 0}}));
  EXPECT_EQ(p.replicas(255), (std::vector<ExpertSlot>{{3, 63}}));
  EXPECT_EQ(p.local_experts(2).front(), 128);
  expect_consistent(p);
  EXPECT_THROW(ExpertPlacement::contiguous(256, 3), Error);
}

TEST(ExpertPlacement, RedundantReplicasGoToHottestExpertsAndLowerImbalance) {
  // Experts 0..7 (all on rank 0) take most of the traffic.
  std::vector<uint64_t> counts(64, 10);
  for (int e = 0; e < 8; ++e) counts[e] = 1000 - e;
  auto base = ExpertPlacement::contiguous(64, 4);
  auto p = ExpertPlacement::with_redundancy(64, 4, 8, counts);
  expect_consistent(p);
  EXPECT_EQ(p.slots_per_rank(), 18);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p.local_experts(r).size(), 18u) << r;
  for (int e = 0; e < 8; ++e) EXPECT_EQ(p.replicas(e).size(), 2u) << e;  // each hot expert once more
  for (int e = 8; e < 64; ++e) EXPECT_EQ(p.replicas(e).size(), 1u) << e;
  // The 16 hot copies spread evenly: 4 per rank.
  for (int r = 0; r < 4; ++r) {
    int hot = 0;
    for (int e : p.local_experts(r)) hot += e < 8;
    EXPECT_EQ(hot, 4) << r;
  }
  EXPECT_GT(base.imbalance(counts), 3.0);
  EXPECT_LT(p.imbalance(counts), base.imbalance(counts) * 0.6);
  EXPECT_THROW(ExpertPlacement::with_redundancy(64, 4, 6, counts), Error);  // not a multiple of ep
  EXPECT_THROW(ExpertPlacement::with_redundancy(64, 4, 8, std::vector<uint64_t>(63, 1)), Error);
}

TEST(ExpertPlacement, OneExpertHotterThanAllCanBeOnEveryRank) {
  std::vector<uint64_t> counts(16, 1);
  counts[5] = 1'000'000;
  auto p = ExpertPlacement::with_redundancy(16, 4, 4, counts);
  expect_consistent(p);
  EXPECT_EQ(p.replicas(5).size(), 4u);  // capped at one copy per rank; the fourth replica goes elsewhere
  int extra = 0;
  for (int e = 0; e < 16; ++e) extra += static_cast<int>(p.replicas(e).size()) - 1;
  EXPECT_EQ(extra, 4);
}

TEST(ExpertPlacement, RandomSkewedCountsAlwaysPack) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    const int ep = 1 << (rng() % 4);     // 1..8
    const int n = ep * (1 + rng() % 6);  // few experts per rank: packing is tight
    const int k = ep * static_cast<int>(rng() % (n / ep + 1));
    std::vector<uint64_t> counts(n);
    for (auto& c : counts) c = rng() % 4 == 0 ? 1000 + rng() % 5000 : rng() % 20;
    SCOPED_TRACE(::testing::Message() << "n " << n << " ep " << ep << " K " << k);
    if (k > n * (ep - 1)) continue;
    auto p = ExpertPlacement::with_redundancy(n, ep, k, counts);
    expect_consistent(p);
    for (int r = 0; r < ep; ++r) EXPECT_EQ(p.local_experts(r).size(), static_cast<size_t>((n + k) / ep));
  }
}

TEST(ExpertPlacement, JsonRoundTripThroughFile) {
  std::vector<uint64_t> counts(32);
  for (int e = 0; e < 32; ++e) counts[e] = static_cast<uint64_t>((e * 37) % 11 + 1);
  auto p = ExpertPlacement::with_redundancy(32, 4, 4, counts);
  auto path = std::filesystem::temp_directory_path() / "ms_dist_placement_test.json";
  p.save(path);
  auto q = ExpertPlacement::load(path);
  std::filesystem::remove(path);
  EXPECT_EQ(q.to_json(), p.to_json());
  for (int e = 0; e < 32; ++e) EXPECT_EQ(q.replicas(e), p.replicas(e));
}

TEST(ExpertPlacement, JsonValidationNamesTheBadField) {
  json ok = {{"n_experts", 4}, {"ep_size", 2}, {"rank_experts", {{0, 1}, {2, 3}}}};
  EXPECT_EQ(error_of(ok), "");
  json j = ok;
  j["rank_experts"] = {{0, 1}, {2, 2}};
  EXPECT_NE(error_of(j).find("rank_experts[1][1]: expert 2 is already in slot 0 of rank 1"),
            std::string::npos)
      << error_of(j);
  j["rank_experts"] = {{0, 1}, {2}};
  EXPECT_NE(error_of(j).find("expert 3 is placed on no rank"), std::string::npos) << error_of(j);
  j["rank_experts"] = {{0, 1}, {2, 4}};
  EXPECT_NE(error_of(j).find("rank_experts[1][1]: expert 4 out of range [0, 4)"), std::string::npos);
  j["rank_experts"] = {{0, 1}, {2, "x"}};
  EXPECT_NE(error_of(j).find("rank_experts[1][1]: not an integer"), std::string::npos);
  j["rank_experts"] = {{0, 1, 2, 3}};
  EXPECT_NE(error_of(j).find("rank_experts: 1 ranks listed, ep_size is 2"), std::string::npos);
  j = ok;
  j.erase("n_experts");
  EXPECT_NE(error_of(j).find("missing field 'n_experts'"), std::string::npos);
  j = ok;
  j["ep_size"] = "2";
  EXPECT_NE(error_of(j).find("ep_size: not an integer"), std::string::npos);
}

std::string layer_error_of(const json& j) {
  try {
    LayerPlacements::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Each layer's own hot experts get its replicas; every rank of every layer holds n/ep + K/ep slots.
TEST(LayerPlacements, EachLayerReplicatesItsOwnHottestExperts) {
  std::map<int, std::vector<uint64_t>> counts;
  counts[1].assign(16, 10);
  counts[2].assign(16, 10);
  counts[1][0] = 500, counts[1][1] = 400;    // both on rank 0 of the contiguous blocks
  counts[2][14] = 700, counts[2][15] = 300;  // both on rank 3
  const auto p = LayerPlacements::with_redundancy(16, 4, 4, counts);
  EXPECT_EQ(p.slots_per_rank(), 5);
  ASSERT_NE(p.layer(1), nullptr);
  ASSERT_NE(p.layer(2), nullptr);
  EXPECT_EQ(p.layer(0), nullptr);
  for (int l : {1, 2}) {
    expect_consistent(*p.layer(l));
    for (int r = 0; r < 4; ++r) EXPECT_EQ(p.layer(l)->local_experts(r).size(), 5u) << l << " " << r;
    EXPECT_LT(p.layer(l)->imbalance(counts[l]), ExpertPlacement::contiguous(16, 4).imbalance(counts[l]));
  }
  // Layer 1: experts 0 and 1 hold the 4 extra copies between them; layer 2: experts 14 and 15.
  EXPECT_EQ(p.layer(1)->replicas(0).size() + p.layer(1)->replicas(1).size(), 6u);
  EXPECT_EQ(p.layer(2)->replicas(14).size() + p.layer(2)->replicas(15).size(), 6u);
  EXPECT_EQ(p.layer(1)->replicas(14).size(), 1u);
  EXPECT_EQ(p.layer(2)->replicas(0).size(), 1u);
  p.check(16, 4, {1, 2});
  EXPECT_THROW(LayerPlacements::with_redundancy(16, 4, 3, counts), Error);  // not a multiple of ep
}

TEST(LayerPlacements, SaveLoadRoundTripAndChecksAgainstTheModel) {
  std::map<int, std::vector<uint64_t>> counts;
  for (int l : {0, 3}) {
    counts[l].assign(8, 1);
    counts[l][static_cast<size_t>(l)] = 100;
  }
  const auto p = LayerPlacements::with_redundancy(8, 2, 2, counts);
  const auto path = std::filesystem::temp_directory_path() / "ms_layer_placements_test.json";
  p.save(path);
  const auto q = LayerPlacements::load(path);
  EXPECT_EQ(q.to_json(), p.to_json());
  for (int l : {0, 3})
    for (int e = 0; e < 8; ++e) EXPECT_EQ(q.layer(l)->replicas(e), p.layer(l)->replicas(e));
  auto check_error = [&](int n, int ep, std::vector<int> layers) {
    try {
      q.check(n, ep, layers);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(check_error(8, 2, {0, 3}), "");
  EXPECT_NE(
      check_error(16, 2, {0, 3}).find("n_experts: the expert placement is for 8 experts, the model has 16"),
      std::string::npos);
  EXPECT_NE(check_error(8, 4, {0, 3}).find("ep_size: the expert placement is for 2 ranks, --ep-size is 4"),
            std::string::npos);
  EXPECT_NE(check_error(8, 2, {0, 1, 3}).find("no entry for MoE layer 1"), std::string::npos);
  EXPECT_NE(check_error(8, 2, {3}).find("layers.0: layer 0 is not a MoE layer"), std::string::npos);
  std::ofstream(path) << "[1, 2";
  EXPECT_THROW(LayerPlacements::load(path), Error);
  std::filesystem::remove(path);
}

TEST(LayerPlacements, JsonValidationNamesTheLayerAndField) {
  const json ok = {{"n_experts", 4},
                   {"ep_size", 2},
                   {"layers", {{"1", {{0, 1, 3}, {2, 3, 0}}}, {"2", {{0, 1, 2}, {2, 3, 1}}}}}};
  EXPECT_EQ(layer_error_of(ok), "");
  json j = ok;
  j["layers"]["2"] = {{0, 1, 2}, {2, 2, 3}};
  EXPECT_NE(layer_error_of(j).find("layers.2.rank_experts[1][1]: expert 2 is already in slot 0 of rank 1"),
            std::string::npos)
      << layer_error_of(j);
  j = ok;
  j["layers"]["2"] = {{0, 1}, {2, 3}};  // 2 slots where layer 1 has 3
  EXPECT_NE(layer_error_of(j).find("other ranks and layers hold"), std::string::npos) << layer_error_of(j);
  j = ok;
  j["layers"]["1"] = {{0, 1, 3}, {2, 3, 9}};
  EXPECT_NE(layer_error_of(j).find("layers.1.rank_experts[1][2]: expert 9 out of range [0, 4)"),
            std::string::npos)
      << layer_error_of(j);
  j = ok;
  j["layers"]["one"] = j["layers"]["1"];
  EXPECT_NE(layer_error_of(j).find("layers.one: the key is not a layer index"), std::string::npos);
  j = ok;
  j["layers"]["1"] = {{0, 1, 2, 3}};
  EXPECT_NE(layer_error_of(j).find("layers.1.rank_experts: 1 ranks listed, ep_size is 2"), std::string::npos)
      << layer_error_of(j);
  j = ok;
  j.erase("layers");
  EXPECT_NE(layer_error_of(j).find("missing field 'layers'"), std::string::npos);
}

}  // namespace
}  // namespace ms::dist
