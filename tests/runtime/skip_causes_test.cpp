// pfRuntimeGetSkipCounts and pfRuntimeGetClassStats: every skipped bubble is counted under the
// cause the runtime skipped it for (no samples yet, too short, no memory, no job, optimizer
// bubble unfilled), the causes sum to pfStats_t.bubbles_skipped, and each bubble class carries
// its own counts, durations and items. Checked in both launch modes.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <numeric>
#include <string>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

class SkipCauses : public ::testing::TestWithParam<int> {  // the launch mode
 protected:
  void SetUp() override { stage.init(); }

  pfRuntime_t make_runtime(int min_samples = 2) {
    pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
    config.launch_mode = GetParam();
    config.min_samples = min_samples;
    return stage.runtime(&config);
  }

  static std::array<uint64_t, PF_SKIP_CAUSE_COUNT> skips(pfRuntime_t rt) {
    std::array<uint64_t, PF_SKIP_CAUSE_COUNT> counts{};
    EXPECT_EQ(pfRuntimeGetSkipCounts(rt, counts.data(), counts.size()), pfSuccess)
        << pfGetLastErrorMessage();
    return counts;
  }

  static pfStats_t stats_of(pfRuntime_t rt) {
    pfStats_t stats{};
    EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess);
    EXPECT_EQ(pfRuntimeGetStatsV2(rt, &stats, sizeof stats), pfSuccess);
    return stats;
  }

  static pfClassStats_t class_of(pfRuntime_t rt, size_t index) {
    pfClassStats_t c{};
    c.size = sizeof c;
    EXPECT_EQ(pfRuntimeGetClassStats(rt, index, &c), pfSuccess) << pfGetLastErrorMessage();
    return c;
  }

  ManualStage stage;
};

TEST_P(SkipCauses, NoSamplesYetThenNoJob) {
  pfRuntime_t rt = make_runtime(/*min_samples=*/2);
  ASSERT_NE(rt, nullptr);
  for (int i = 0; i < 5; ++i) stage.step(rt, 300.0);
  const pfStats_t stats = stats_of(rt);
  const auto counts = skips(rt);
  EXPECT_EQ(stats.bubbles, 5u);
  EXPECT_EQ(stats.bubbles_skipped, 5u);
  // The class "#0" needs 2 samples; from the third bubble on it has them but no job exists.
  EXPECT_EQ(counts[pfSkipNoHistory], 2u);
  EXPECT_EQ(counts[pfSkipNoJob], 3u);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), uint64_t{0}), stats.bubbles_skipped);
  pfRuntimeDestroy(rt);
}

TEST_P(SkipCauses, TooShortNoMemoryAndOptimizerBubbles) {
  pfRuntime_t rt = make_runtime(/*min_samples=*/1);
  ASSERT_NE(rt, nullptr);
  CountingJob job;  // 10 us items
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  pfBubbleHint_t shorter = PF_BUBBLE_HINT_INITIALIZER;
  shorter.label = "short";
  shorter.expected_duration_us = 4.0;  // shorter than one item
  stage.step(rt, 4.0, &shorter, /*iteration_end=*/false);
  pfBubbleHint_t optimizer = PF_BUBBLE_HINT_INITIALIZER;
  optimizer.kind = pfBubbleOptimizer;
  optimizer.label = "optimizer";
  optimizer.expected_duration_us = 400.0;
  stage.step(rt, 400.0, &optimizer, /*iteration_end=*/false);
  pfBubbleHint_t usual = PF_BUBBLE_HINT_INITIALIZER;
  usual.label = "usual";
  usual.expected_duration_us = 400.0;
  stage.step(rt, 400.0, &usual);
  pfStats_t stats = stats_of(rt);
  auto counts = skips(rt);
  EXPECT_EQ(stats.bubbles, 3u);
  EXPECT_EQ(stats.bubbles_filled, 1u);
  EXPECT_EQ(counts[pfSkipTooShort], 1u);
  EXPECT_EQ(counts[pfSkipOptimizer], 1u);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), uint64_t{0}), stats.bubbles_skipped);

  // Per class, in the order first harvested: "short" (skipped, too short), "optimizer"
  // (skipped by kind), "usual" (filled with every item it ran).
  size_t classes = 0;
  PF_ASSERT_OK(pfRuntimeGetClassCount(rt, &classes));
  ASSERT_EQ(classes, 3u);
  const pfClassStats_t too_short = class_of(rt, 0);
  EXPECT_STREQ(too_short.key, "short");
  EXPECT_EQ(too_short.bubbles, 1u);
  EXPECT_EQ(too_short.bubbles_filled, 0u);
  EXPECT_EQ(too_short.skips[pfSkipTooShort], 1u);
  EXPECT_NEAR(too_short.bubble_time_us, 4.0, 0.5);
  const pfClassStats_t opt = class_of(rt, 1);
  EXPECT_STREQ(opt.key, "optimizer");
  EXPECT_EQ(opt.kind, pfBubbleOptimizer);
  EXPECT_EQ(opt.skips[pfSkipOptimizer], 1u);
  EXPECT_EQ(opt.items_completed, 0u);
  const pfClassStats_t filled = class_of(rt, 2);
  EXPECT_STREQ(filled.key, "usual");
  EXPECT_EQ(filled.bubbles_filled, 1u);
  EXPECT_EQ(filled.bubbles_timed, 1u);
  EXPECT_EQ(filled.items_completed, job.items_run());
  EXPECT_GT(filled.items_completed, 0u);
  EXPECT_GT(filled.filled_time_us, 0.0);
  EXPECT_LE(filled.filled_time_us, filled.bubble_time_us + 1e-6);
  EXPECT_NEAR(filled.p10_us, filled.bubble_time_us, 1e-6);  // one sample: every quantile is it

  // A job whose per-item workspace can never fit the 64 MiB arena: no memory.
  PF_ASSERT_OK(pfJobDestroy(handle));
  CountingJob big;
  pfJobDesc_t big_desc = big.desc();
  big_desc.workspace_bytes_per_item = size_t{1} << 30;
  PF_ASSERT_OK(pfJobCreate(rt, &big_desc, &handle));
  // Inline mode may still hold the class's plan made for the destroyed job at the first bubble
  // (its job gone: no job); the plan made after that bubble's harvest is the big job's.
  stage.step(rt, 400.0, &usual);
  stage.step(rt, 400.0, &usual);
  stats = stats_of(rt);
  counts = skips(rt);
  EXPECT_GE(counts[pfSkipNoMemory], 1u);
  EXPECT_EQ(counts[pfSkipNoMemory] + counts[pfSkipNoJob], 2u);
  EXPECT_EQ(class_of(rt, 2).skips[pfSkipNoMemory], counts[pfSkipNoMemory]);
  EXPECT_EQ(stats.bubbles_filled, 1u);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), uint64_t{0}), stats.bubbles_skipped);
  pfJobDestroy(handle);
  pfRuntimeDestroy(rt);
}

TEST_P(SkipCauses, BadArgumentsAreRefusedAndLargerBuffersZeroed) {
  pfRuntime_t rt = make_runtime(/*min_samples=*/2);
  ASSERT_NE(rt, nullptr);
  stage.step(rt, 300.0);
  stats_of(rt);
  uint64_t one = 0;
  EXPECT_EQ(pfRuntimeGetSkipCounts(rt, nullptr, 4), pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeGetSkipCounts(rt, &one, 0), pfErrorInvalidArgument);
  // A caller with fewer causes gets those; one with more (a newer header) reads 0 past ours.
  PF_ASSERT_OK(pfRuntimeGetSkipCounts(rt, &one, 1));
  EXPECT_EQ(one, 1u);  // pfSkipNoHistory
  std::array<uint64_t, PF_SKIP_CAUSE_COUNT + 4> more;
  more.fill(77);
  PF_ASSERT_OK(pfRuntimeGetSkipCounts(rt, more.data(), more.size()));
  for (size_t i = PF_SKIP_CAUSE_COUNT; i < more.size(); ++i) EXPECT_EQ(more[i], 0u);

  pfClassStats_t c{};
  c.size = sizeof c;
  EXPECT_EQ(pfRuntimeGetClassStats(rt, 1, &c), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("index 1"), std::string::npos)
      << pfGetLastErrorMessage();
  // Below the first layout (the struct grew after it: issue 34 appended the planner's view).
  c.size = PF_CLASS_STATS_V1_SIZE - 1;
  EXPECT_EQ(pfRuntimeGetClassStats(rt, 0, &c), pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeGetClassStats(rt, 0, nullptr), pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeGetClassCount(rt, nullptr), pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeGetSkipCounts(nullptr, &one, 1), pfErrorInvalidArgument);
  pfRuntimeDestroy(rt);
}

INSTANTIATE_TEST_SUITE_P(LaunchModes, SkipCauses,
                         ::testing::Values(static_cast<int>(pfLaunchExecutor),
                                           static_cast<int>(pfLaunchInline)));

}  // namespace
}  // namespace pipefill::testing
