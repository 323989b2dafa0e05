#include <gtest/gtest.h>

#include "analysis/activity.hpp"
#include "analysis/stats.hpp"

namespace pipefill::analysis {
namespace {

TEST(Quantiles, LinearInterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {10, 20, 30, 40, 50};
  EXPECT_DOUBLE_EQ(quantile_linear(v, 0.0), 10);
  EXPECT_DOUBLE_EQ(quantile_linear(v, 0.1), 14);  // position 0.4
  EXPECT_DOUBLE_EQ(quantile_linear(v, 0.5), 30);
  EXPECT_DOUBLE_EQ(quantile_linear(v, 0.9), 46);  // position 3.6
  EXPECT_DOUBLE_EQ(quantile_linear(v, 1.0), 50);
  EXPECT_DOUBLE_EQ(quantile_linear({7}, 0.3), 7);
  EXPECT_DOUBLE_EQ(quantile_linear({}, 0.5), 0);
}

TEST(Quantiles, NearestRankPicksTheCeilRank) {
  const std::vector<double> v = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
  EXPECT_DOUBLE_EQ(quantile_nearest_rank(v, 0.1), 10);   // rank 1, not 2 despite 0.1*10 rounding
  EXPECT_DOUBLE_EQ(quantile_nearest_rank(v, 0.11), 20);  // rank ceil(1.1) = 2
  EXPECT_DOUBLE_EQ(quantile_nearest_rank(v, 0.5), 50);
  EXPECT_DOUBLE_EQ(quantile_nearest_rank(v, 1.0), 100);
  EXPECT_DOUBLE_EQ(quantile_nearest_rank({5, 9}, 0.01), 5);
  EXPECT_DOUBLE_EQ(quantile_nearest_rank({}, 0.5), 0);
}

TEST(Summary, SortsAndReportsEveryStatistic) {
  const Summary s = summarize({40, 10, 30, 20, 50});
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 150);
  EXPECT_DOUBLE_EQ(s.mean, 30);
  EXPECT_DOUBLE_EQ(s.min, 10);
  EXPECT_DOUBLE_EQ(s.p10, 14);
  EXPECT_DOUBLE_EQ(s.p50, 30);
  EXPECT_DOUBLE_EQ(s.p90, 46);
  EXPECT_DOUBLE_EQ(s.max, 50);
  EXPECT_EQ(summarize({}).count, 0u);
}

TEST(Intervals, MergeJoinsOverlappingAndTouchingAndDropsEmpty) {
  const auto merged = merge_intervals({{5, 8}, {0, 2}, {2, 3}, {7, 10}, {12, 12}, {1, 1.5}});
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_DOUBLE_EQ(merged[0].start_us, 0);
  EXPECT_DOUBLE_EQ(merged[0].end_us, 3);
  EXPECT_DOUBLE_EQ(merged[1].start_us, 5);
  EXPECT_DOUBLE_EQ(merged[1].end_us, 10);
}

TEST(Intervals, CoveredTimeClipsToTheWindow) {
  const auto merged = merge_intervals({{0, 10}, {20, 30}, {40, 50}});
  EXPECT_DOUBLE_EQ(covered_time(merged, 5, 45), 5 + 10 + 5);
  EXPECT_DOUBLE_EQ(covered_time(merged, 10, 20), 0);
  EXPECT_DOUBLE_EQ(covered_time(merged, 22, 28), 6);
  EXPECT_DOUBLE_EQ(covered_time(merged, 60, 70), 0);
  EXPECT_DOUBLE_EQ(covered_time(merged, 30, 25), 0);  // inverted window
}

TEST(ActivityNames, KindNamesAreDistinct) {
  EXPECT_STREQ(activity_kind_name(ActivityKind::Kernel), "kernel");
  EXPECT_STREQ(activity_kind_name(ActivityKind::Comm), "comm");
  EXPECT_STREQ(activity_kind_name(ActivityKind::Fill), "fill");
  EXPECT_STREQ(activity_kind_name(ActivityKind::Memcpy), "memcpy");
  EXPECT_STREQ(activity_kind_name(ActivityKind::Memset), "memset");
  EXPECT_STREQ(activity_kind_name(ActivityKind::MemoryAlloc), "memory_alloc");
  EXPECT_STREQ(activity_kind_name(ActivityKind::MemoryFree), "memory_free");
  EXPECT_STREQ(activity_kind_name(ActivityKind::Marker), "marker");
}

TEST(ActivityNames, NcclKernelsAreCommunication) {
  EXPECT_TRUE(is_communication_kernel_name("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"));
  EXPECT_TRUE(is_communication_kernel_name("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)"));
  EXPECT_TRUE(is_communication_kernel_name("void NCCLKernel_custom()"));
  EXPECT_TRUE(is_communication_kernel_name("rcclGenericKernel"));
  EXPECT_TRUE(is_communication_kernel_name("mscclKernel_Sum_half"));
  EXPECT_FALSE(is_communication_kernel_name("ampere_sgemm_128x64_tn"));
  EXPECT_FALSE(is_communication_kernel_name("void at::native::vectorized_elementwise_kernel<4>"));
  EXPECT_FALSE(is_communication_kernel_name(""));
}

}  // namespace
}  // namespace pipefill::analysis
