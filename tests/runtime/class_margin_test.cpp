// Margins per bubble class (pfRuntimeSetClassMargin): a class's margin replaces safety_margin_us
// for its bubbles only, so a bubble that ends in a collective moving no bytes can be filled up to
// its predicted end while the bubbles that end in a p2p receive keep the transfer's margin. A
// negative margin removes the class's own; invalid arguments are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

constexpr double kItemUs = 10.0;
constexpr int kWorkers = 28;  // the fill SMs (32 - 4 reserved)
constexpr double kBubbleUs = 400.0;
constexpr double kMarginUs = 90.0;

class ClassMargin : public ::testing::TestWithParam<int> {};  // the launch mode

// Two classes of 400 us bubbles, "recv" and "collective", with a 90 us runtime margin. After
// pfRuntimeSetClassMargin(collective, 0) the collective's slice gets the whole 400 us (40 items
// per worker) while recv keeps 400 - 90 = 310 us (31 items); after removing it (margin -1) both
// get 310 us again.
TEST_P(ClassMargin, ReplacesTheRuntimeMarginForItsClassOnly) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.safety_margin_us = kMarginUs;
  config.safety_margin_fraction = 0.0;
  config.launch_mode = GetParam();
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);
  SliceRecordingJob job;
  pfJobDesc_t desc = job.desc(kItemUs, kWorkers);
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));

  pfBubbleHint_t recv = PF_BUBBLE_HINT_INITIALIZER;
  recv.label = "recv";
  pfBubbleHint_t collective = PF_BUBBLE_HINT_INITIALIZER;
  collective.label = "collective";
  // Set before the class exists: it applies once the class has its history.
  PF_ASSERT_OK(pfRuntimeSetClassMargin(rt, "collective", 0.0));
  for (int i = 0; i < 4; ++i) {
    stage.step(rt, kBubbleUs, &recv);
    stage.step(rt, kBubbleUs, &collective);
  }
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));

  const auto budgets = [&](std::vector<double>* out) {
    job.slices.clear();
    stage.step(rt, kBubbleUs, &recv);
    stage.step(rt, kBubbleUs, &collective);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
    ASSERT_EQ(job.slices.size(), 2u);
    out->clear();
    for (const pfSliceDesc_t& s : job.slices) {
      out->push_back(s.time_budget_us);
      EXPECT_EQ(s.max_items, static_cast<uint64_t>(std::lround(s.time_budget_us / kItemUs)) *
                                 static_cast<uint64_t>(kWorkers));
    }
  };
  std::vector<double> got;
  ASSERT_NO_FATAL_FAILURE(budgets(&got));
  EXPECT_DOUBLE_EQ(got[0], kBubbleUs - kMarginUs) << "recv keeps the runtime's margin";
  EXPECT_DOUBLE_EQ(got[1], kBubbleUs) << "the collective class is filled to its predicted end";

  // Removed: the runtime's margin again.
  PF_ASSERT_OK(pfRuntimeSetClassMargin(rt, "collective", -1.0));
  ASSERT_NO_FATAL_FAILURE(budgets(&got));
  EXPECT_DOUBLE_EQ(got[0], kBubbleUs - kMarginUs);
  EXPECT_DOUBLE_EQ(got[1], kBubbleUs - kMarginUs);

  // A larger margin than the runtime's applies too.
  PF_ASSERT_OK(pfRuntimeSetClassMargin(rt, "recv", 150.0));
  ASSERT_NO_FATAL_FAILURE(budgets(&got));
  EXPECT_DOUBLE_EQ(got[0], kBubbleUs - 150.0);
  EXPECT_DOUBLE_EQ(got[1], kBubbleUs - kMarginUs);

  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(ClassMarginArguments, AreChecked) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(pfRuntimeSetClassMargin(rt, nullptr, 0.0), pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeSetClassMargin(rt, "", 0.0), pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeSetClassMargin(rt, "#1", std::numeric_limits<double>::quiet_NaN()),
            pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeSetClassMargin(rt, "#1", std::numeric_limits<double>::infinity()),
            pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("pfRuntimeSetClassMargin"), std::string::npos);
  EXPECT_EQ(pfRuntimeSetClassMargin(nullptr, "#1", 0.0), pfErrorInvalidArgument);
  PF_ASSERT_OK(pfRuntimeSetClassMargin(rt, "#1", 0.0));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

INSTANTIATE_TEST_SUITE_P(LaunchModes, ClassMargin,
                         ::testing::Values(static_cast<int>(pfLaunchExecutor),
                                           static_cast<int>(pfLaunchInline)),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == pfLaunchInline ? "Inline"
                                                                           : "Executor");
                         });

}  // namespace
}  // namespace pipefill::testing
