#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "moe/expert_stats.h"

using namespace ms::moe;

TEST(ExpertStats, BucketBoundsAreFixedAndEndAtNExperts) {
  const std::vector<double> b256 = ExpertStats::bucket_bounds(256);
  EXPECT_EQ(b256, (std::vector<double>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256}));
  EXPECT_EQ(ExpertStats::bucket_bounds(16), (std::vector<double>{1, 2, 4, 8, 16}));
  EXPECT_EQ(ExpertStats::bucket_bounds(20), (std::vector<double>{1, 2, 4, 8, 16, 20}));
  const std::vector<double> b1024 = ExpertStats::bucket_bounds(1024);
  EXPECT_EQ(b1024.back(), 1024);
  EXPECT_EQ(b1024[b1024.size() - 2], 512);
}

TEST(ExpertStats, MeansAndHistogramsPerLayerAndKind) {
  ExpertStats st(2, 64);
  st.record(0, RoutingKind::Baseline, 40);
  st.record(0, RoutingKind::Baseline, 50);
  st.record(0, RoutingKind::Oea, 20);
  st.record(1, RoutingKind::Baseline, 64);
  EXPECT_DOUBLE_EQ(st.mean(0, RoutingKind::Baseline), 45.0);
  EXPECT_DOUBLE_EQ(st.mean(0, RoutingKind::Oea), 20.0);
  EXPECT_DOUBLE_EQ(st.mean(1, RoutingKind::Oea), 0.0);
  EXPECT_DOUBLE_EQ(st.mean(RoutingKind::Baseline), (40 + 50 + 64) / 3.0);

  const DistinctExpertsHistogram h = st.histogram(RoutingKind::Baseline);
  // bounds 1 2 4 8 16 24 32 40 48 56 64: 40 -> le 40, 50 -> le 56, 64 -> le 64
  ASSERT_EQ(h.bounds.size(), 11u);
  EXPECT_EQ(h.counts[7], 1u);
  EXPECT_EQ(h.counts[9], 1u);
  EXPECT_EQ(h.counts[10], 1u);
  EXPECT_EQ(h.count, 3u);
  EXPECT_EQ(h.cumulative().back(), 3u);
  EXPECT_EQ(h.cumulative()[7], 1u);

  const std::vector<int32_t> ids = {1, 2, -1, 2, 9, -1};
  EXPECT_EQ(st.record_batch(1, RoutingKind::Oea, ids.data(), 2, 3), 3);
  EXPECT_EQ(st.histogram(1, RoutingKind::Oea).counts[1], 0u);
  EXPECT_EQ(st.histogram(1, RoutingKind::Oea).counts[2], 1u);  // 3 -> le 4

  EXPECT_THROW(st.record(2, RoutingKind::Oea, 1), ms::Error);
  EXPECT_THROW(st.record(0, RoutingKind::Oea, 65), ms::Error);
  st.reset();
  EXPECT_EQ(st.histogram(RoutingKind::Baseline).count, 0u);
}
