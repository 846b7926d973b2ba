// Recorded routing counts per MoE layer: counting, JSON round trip, and files that do not fit named by field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "moe/expert_distribution.h"

namespace ms::moe {
namespace {

using nlohmann::json;

std::string error_of(const json& j) {
  try {
    ExpertDistribution::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ExpertDistribution, CountsEveryAssignmentAndRoundTrips) {
  ExpertDistribution d(4, {1, 3});
  const int32_t a[] = {0, 1, 1, 3, -1, 2};  // 3 tokens x top-2; -1 is skipped
  d.record(1, a, 3, 2);
  d.record(1, a, 1, 2);
  d.record(3, a + 2, 2, 2);
  const auto c = d.counts();
  EXPECT_EQ(c.at(1), (std::vector<uint64_t>{2, 3, 1, 1}));
  EXPECT_EQ(c.at(3), (std::vector<uint64_t>{0, 1, 1, 1}));
  EXPECT_THROW(d.record(2, a, 1, 2), Error);  // not a MoE layer
  const int32_t bad[] = {4, 0};
  EXPECT_THROW(d.record(1, bad, 1, 2), Error);

  const auto path = std::filesystem::temp_directory_path() / "ms_expert_distribution_test.json";
  d.save(path);
  std::ifstream f(path);
  const json j = json::parse(f);
  EXPECT_EQ(j["n_experts"], 4);
  EXPECT_EQ(j["layers"]["1"], json({2, 3, 1, 1}));
  const ExpertDistribution back = ExpertDistribution::load(path);
  EXPECT_EQ(back.counts(), c);
  EXPECT_EQ(back.n_experts(), 4);
  back.check_model(4, {1, 3});
  EXPECT_THROW(back.check_model(8, {1, 3}), Error);
  EXPECT_THROW(back.check_model(4, {1, 2, 3}), Error);  // layer 2 not recorded
  EXPECT_THROW(back.check_model(4, {1}), Error);        // layer 3 not a MoE layer
  std::filesystem::remove(path);
}

TEST(ExpertDistribution, BadFilesNameTheField) {
  const json good = {{"n_experts", 2}, {"layers", {{"0", {1, 2}}}}};
  EXPECT_EQ(error_of(good), "");
  EXPECT_NE(error_of(json{{"layers", good["layers"]}}).find("missing field 'n_experts'"), std::string::npos);
  json j = good;
  j["layers"]["1"] = {1, 2, 3};
  EXPECT_NE(error_of(j).find("layers.1: 3 counts for n_experts 2"), std::string::npos) << error_of(j);
  j = good;
  j["layers"]["x"] = {1, 2};
  EXPECT_NE(error_of(j).find("layers.x: the key is not a layer index"), std::string::npos);
  j = good;
  j["layers"]["0"] = {1, -2};
  EXPECT_NE(error_of(j).find("layers.0[1]: not a non-negative integer"), std::string::npos) << error_of(j);
  j = good;
  j["n_experts"] = 0;
  EXPECT_NE(error_of(j).find("n_experts: not a positive integer"), std::string::npos);
  const auto path = std::filesystem::temp_directory_path() / "ms_expert_distribution_bad.json";
  std::ofstream(path) << "{ not json";
  EXPECT_THROW(ExpertDistribution::load(path), Error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ms::moe
