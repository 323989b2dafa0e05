// pfConfig_t::fill_optimizer_bubbles (version 4): bubbles of kind pfBubbleOptimizer (the DP
// all-reduce window) are measured but left unfilled unless the user opts in, because fill beside
// the collective takes memory bandwidth from it on the main job's critical path. Every other kind
// fills as before. Checked in both launch modes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

uint64_t items_run(const CountingJob& job) {
  return std::accumulate(job.runs.begin(), job.runs.end(), uint64_t{0});
}

class OptimizerBubbles : public ::testing::TestWithParam<int> {};  // the launch mode

// Returns the items the job ran in a 400 us bubble of `kind` (a hinted class, so the first bubble
// fills), and the runtime's stats.
uint64_t items_in_one_bubble(int launch_mode, int kind, int fill_optimizer_bubbles, pfStats_t* stats) {
  ManualStage stage;
  stage.init();
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.launch_mode = launch_mode;
  config.fill_optimizer_bubbles = fill_optimizer_bubbles;
  pfRuntime_t rt = stage.runtime(&config);
  EXPECT_NE(rt, nullptr);
  if (rt == nullptr) return 0;
  CountingJob job;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  EXPECT_EQ(pfJobCreate(rt, &desc, &handle), pfSuccess) << pfGetLastErrorMessage();
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.kind = kind;
  hint.expected_duration_us = 400.0;
  stage.step(rt, 400.0, &hint);
  EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess);
  EXPECT_EQ(pfRuntimeGetStats(rt, stats), pfSuccess);
  const uint64_t items = items_run(job);
  pfJobDestroy(handle);
  pfRuntimeDestroy(rt);
  return items;
}

TEST_P(OptimizerBubbles, TheAllReduceWindowIsMeasuredButNotFilledByDefault) {
  pfStats_t stats{};
  EXPECT_EQ(items_in_one_bubble(GetParam(), pfBubbleOptimizer, PF_UNSET_INT, &stats), 0u);
  EXPECT_EQ(stats.bubbles, 1u);          // measured all the same
  EXPECT_EQ(stats.bubbles_filled, 0u);
  EXPECT_GT(stats.bubble_time_us, 399.0);
  // Any other kind fills at once from its hint: 28 fill SMs x whole 10 us items in the budget.
  for (int kind : {pfBubbleOther, pfBubbleWarmup, pfBubbleCooldown, pfBubbleDrain}) {
    const uint64_t items = items_in_one_bubble(GetParam(), kind, PF_UNSET_INT, &stats);
    EXPECT_GT(items, 28u * 30u) << "kind " << kind;
    EXPECT_EQ(stats.bubbles_filled, 1u) << "kind " << kind;
  }
}

TEST_P(OptimizerBubbles, OptingInFillsItLikeAnyOtherBubble) {
  pfStats_t other{}, optimizer{};
  const uint64_t usual = items_in_one_bubble(GetParam(), pfBubbleOther, 1, &other);
  EXPECT_EQ(items_in_one_bubble(GetParam(), pfBubbleOptimizer, 1, &optimizer), usual);
  EXPECT_GT(usual, 0u);
  EXPECT_EQ(optimizer.bubbles_filled, 1u);
}

TEST_P(OptimizerBubbles, TheEnvironmentVariableOptsInAndBadValuesAreNamed) {
  ASSERT_EQ(setenv("PIPEFILL_FILL_OPTIMIZER_BUBBLES", "1", 1), 0);
  pfStats_t stats{};
  EXPECT_GT(items_in_one_bubble(GetParam(), pfBubbleOptimizer, PF_UNSET_INT, &stats), 0u);
  ASSERT_EQ(setenv("PIPEFILL_FILL_OPTIMIZER_BUBBLES", "yes", 1), 0);
  WorldPtr world = make_world(1, 32);
  pfConfig_t config = sim_config(world.get(), 0, 1, 4);
  pfRuntime_t rt = nullptr;
  EXPECT_EQ(pfRuntimeCreate(&config, &rt), pfErrorInvalidArgument);
  EXPECT_EQ(rt, nullptr);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("PIPEFILL_FILL_OPTIMIZER_BUBBLES"), std::string::npos)
      << pfGetLastErrorMessage();
  ASSERT_EQ(unsetenv("PIPEFILL_FILL_OPTIMIZER_BUBBLES"), 0);
  config.fill_optimizer_bubbles = 2;
  EXPECT_EQ(pfRuntimeCreate(&config, &rt), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("config.fill_optimizer_bubbles = 2 is not 0 or 1"),
            std::string::npos)
      << pfGetLastErrorMessage();
  // In force: what pfRuntimeGetConfig reports.
  config.fill_optimizer_bubbles = PF_UNSET_INT;
  ASSERT_EQ(pfRuntimeCreate(&config, &rt), pfSuccess) << pfGetLastErrorMessage();
  pfConfig_t in_force = PF_CONFIG_INITIALIZER;
  ASSERT_EQ(pfRuntimeGetConfig(rt, &in_force), pfSuccess);
  EXPECT_EQ(in_force.fill_optimizer_bubbles, 0);
  pfRuntimeDestroy(rt);
}

INSTANTIATE_TEST_SUITE_P(LaunchModes, OptimizerBubbles,
                         ::testing::Values(static_cast<int>(pfLaunchExecutor), static_cast<int>(pfLaunchInline)),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == pfLaunchInline ? std::string("inline") : std::string("executor");
                         });

}  // namespace
}  // namespace pipefill::testing
