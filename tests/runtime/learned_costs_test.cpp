// Item costs learned from measured slices (core/cost_model.hpp), on the simulator's driven clock:
// a job created with a cost 25x too large is probed and then filled within a few bubbles and its
// learned cost converges to the true one; a few slow slices barely move it; a job whose item
// really fits no bubble is warned about once (with the numbers) and never overruns by more than
// one item; pfJobSetCostPolicy's policies (median, fastest sample, stated cost kept) and bad
// values; pfJobGetCostInfo's argument and size checks.
#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "common/log.hpp"
#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

// A ticket job whose items really take true_cost_us on the simulated device, whatever cost its
// description gives; launches listed in slow_launches run their items slow_factor times slower.
struct MisjudgedJob : CountingJob {
  double true_cost_us = 10.0;
  std::vector<int> slow_launches;
  double slow_factor = 5.0;
  int bubble_launches = 0;

  static pfResult_t launch_true(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<MisjudgedJob*>(user);
    if (slice->max_items == 0) return pfSuccess;  // warm-up
    const int n = self->bubble_launches++;
    const bool slow = std::find(self->slow_launches.begin(), self->slow_launches.end(), n) !=
                      self->slow_launches.end();
    const double cost = self->true_cost_us * (slow ? self->slow_factor : 1.0);
    if (self->kind == pfJobOpaque) {
      return pfSimLaunchOpaque(stream, slice->first_item_hint, slice->max_items,
                               slice->max_blocks, cost, &on_item, self);
    }
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, cost, &on_item, self);
  }

  pfJobDesc_t desc_with_cost(double given_cost_us) {
    pfJobDesc_t d = desc();
    d.item_cost_hint_us = given_cost_us;
    d.launch = &launch_true;
    return d;
  }
};

pfJobCostInfo_t cost_of(pfJob_t job) {
  pfJobCostInfo_t info{};
  info.size = sizeof info;
  EXPECT_EQ(pfJobGetCostInfo(job, &info), pfSuccess) << pfGetLastErrorMessage();
  return info;
}

pfStats_t stats_of(pfRuntime_t rt) {
  pfStats_t s{};
  EXPECT_EQ(pfRuntimeGetStatsV2(rt, &s, sizeof s), pfSuccess);
  return s;
}

// Captures the library's log (its one spdlog logger) for the test's lifetime.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)) {
    log::logger().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = log::logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() const { return text_.str(); }
  size_t count(const std::string& needle) const {
    const std::string t = text();
    size_t n = 0;
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

// One 100 us bubble announced by its hint (planned from it from the first bubble), harvested.
void bubble(ManualStage& stage, pfRuntime_t rt, double length_us = 100.0) {
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = length_us;
  stage.step(rt, length_us, &hint);
  EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
}

TEST_F(StageRuntimeTest, CostTwentyFiveTimesTooLargeIsProbedAndLearned) {
  MisjudgedJob job;
  job.name = "misjudged";
  job.true_cost_us = 10.0;
  job.items = 3000;
  const pfJobDesc_t desc = job.desc_with_cost(250.0);  // 25x the real item
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  EXPECT_DOUBLE_EQ(cost_of(handle).learned_cost_us, 250.0);  // the prior until measured

  // A 250 us item fits no 100 us bubble: two bubbles skipped, a one-item probe in the third.
  int bubbles = 0;
  while (info_of(handle).items_completed == 0 && bubbles < 5) {
    bubble(stage, rt);
    ++bubbles;
  }
  EXPECT_EQ(bubbles, 3);
  pfJobCostInfo_t probed = cost_of(handle);
  EXPECT_EQ(probed.probes, 1u);
  EXPECT_EQ(probed.samples, 1u);
  EXPECT_EQ(info_of(handle).items_completed, 1u);
  EXPECT_NEAR(probed.learned_cost_us, 10.0, 1.0);

  // The next bubble is filled to the learned cost: 28 fill SMs x 10 items each.
  bubble(stage, rt);
  EXPECT_GE(info_of(handle).items_completed, 1u + 28u * 9u);
  const int steps = step_until_completed(stage, rt, handle, 100.0, nullptr, 20);
  EXPECT_LT(steps, 20);
  EXPECT_EQ(info_of(handle).status, pfJobCompleted);
  EXPECT_TRUE(job.every_item_once());
  const pfJobCostInfo_t learned = cost_of(handle);
  EXPECT_NEAR(learned.learned_cost_us, 10.0, 1.0);
  EXPECT_DOUBLE_EQ(learned.prior_cost_us, 250.0);
  EXPECT_GE(learned.samples, 3u);
  EXPECT_EQ(learned.too_short_streak, 0u);  // a fitted slice ended the streak
  EXPECT_EQ(learned.too_short_bubbles, 3u);
  EXPECT_EQ(learned.warned, 0);
  // Gated: the estimate never overran by more than one real item.
  EXPECT_LE(stats_of(rt).max_overrun_us, 10.0 + 1e-6);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(StageRuntimeTest, AFewSlowSlicesBarelyMoveTheLearnedCost) {
  MisjudgedJob job;
  job.name = "outliers";
  job.true_cost_us = 10.0;
  job.items = 1000000;
  job.slow_launches = {2, 6, 10};  // three of the window's 15 slices 5x slower
  const pfJobDesc_t desc = job.desc_with_cost(10.0);
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  for (int i = 0; i < 15; ++i) bubble(stage, rt);
  const pfJobCostInfo_t info = cost_of(handle);
  EXPECT_EQ(info.samples, 15u);
  // The mean of the window would be ~18 us (12 x 10 + 3 x 50 over 15); the median stays put.
  EXPECT_NEAR(info.learned_cost_us, 10.0, 1.0);
  EXPECT_EQ(info.too_short_bubbles, 0u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// pfJobSetCostPolicy on a job with two configurations whose items all run 3x slower than stated
// (30 us against 10 us): policy 0 (the default) learns the median, 30 us; 2 keeps config 0's
// stated 10 us, also over the samples measured before it was set; 1 takes the window's fastest
// sample, the one slice that ran at the stated speed.
struct TwoConfigJob : MisjudgedJob {
  pfJobConfig_t configs[2] = {};
  pfJobDesc_t two_config_desc() {
    configs[0].name = "small";
    configs[0].item_cost_us = 10.0;  // the planner's choice: 10 us per unit of work
    configs[1].name = "large";
    configs[1].item_cost_us = 100.0;  // 50 us per unit
    configs[1].items_per_item = 2.0;
    pfJobDesc_t d = desc_with_cost(0.0);
    d.configs = configs;
    d.config_count = 2;
    return d;
  }
};

TEST_F(StageRuntimeTest, StatedCostPolicyKeepsEachConfigurationsCost) {
  TwoConfigJob job;
  job.name = "stated";
  job.true_cost_us = 10.0;
  job.slow_factor = 3.0;
  job.items = 1000000;
  for (int i = 0; i < 40; ++i) job.slow_launches.push_back(i);
  const pfJobDesc_t desc = job.two_config_desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  for (int i = 0; i < 6; ++i) bubble(stage, rt);
  const pfJobCostInfo_t learned = cost_of(handle);
  EXPECT_EQ(learned.config_index, 0);
  EXPECT_EQ(learned.samples, 6u);
  EXPECT_NEAR(learned.learned_cost_us, 30.0, 1.0);  // policy 0: the slow slices' median

  PF_ASSERT_OK(pfJobSetCostPolicy(handle, 2));
  EXPECT_DOUBLE_EQ(cost_of(handle).learned_cost_us, 10.0);  // at once, over the old samples
  for (int i = 0; i < 6; ++i) bubble(stage, rt);
  const pfJobCostInfo_t stated = cost_of(handle);
  EXPECT_EQ(stated.config_index, 0);
  EXPECT_EQ(stated.samples, 12u);  // still measured, not used
  EXPECT_DOUBLE_EQ(stated.prior_cost_us, 10.0);
  EXPECT_DOUBLE_EQ(stated.learned_cost_us, 10.0);

  PF_ASSERT_OK(pfJobSetCostPolicy(handle, 0));  // back to the median of the slow window
  EXPECT_NEAR(cost_of(handle).learned_cost_us, 30.0, 1.0);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(StageRuntimeTest, FastestCostPolicyTakesTheWindowsFastestSample) {
  TwoConfigJob job;
  job.name = "fastest";
  job.true_cost_us = 10.0;
  job.slow_factor = 3.0;
  job.items = 1000000;
  for (int i = 1; i < 40; ++i) job.slow_launches.push_back(i);  // only the first at 10 us
  const pfJobDesc_t desc = job.two_config_desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  PF_ASSERT_OK(pfJobSetCostPolicy(handle, 1));
  for (int i = 0; i < 8; ++i) bubble(stage, rt);
  const pfJobCostInfo_t fastest = cost_of(handle);
  EXPECT_EQ(fastest.config_index, 0);
  EXPECT_EQ(fastest.samples, 8u);
  EXPECT_NEAR(fastest.learned_cost_us, 10.0, 1.0);
  PF_ASSERT_OK(pfJobSetCostPolicy(handle, 0));  // the same window's median: the slow slices
  EXPECT_NEAR(cost_of(handle).learned_cost_us, 30.0, 1.0);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(StageRuntimeTest, CostPolicyRefusesBadValuesAndChangesNothing) {
  TwoConfigJob job;
  job.name = "bad-policy";
  job.true_cost_us = 10.0;
  job.slow_factor = 3.0;
  job.items = 1000000;
  for (int i = 0; i < 40; ++i) job.slow_launches.push_back(i);
  const pfJobDesc_t desc = job.two_config_desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  PF_ASSERT_OK(pfJobSetCostPolicy(handle, 2));
  for (int value : {3, -1, 1000}) {
    EXPECT_EQ(pfJobSetCostPolicy(handle, value), pfErrorInvalidArgument);
    EXPECT_NE(std::string(pfGetLastErrorMessage()).find("policy = " + std::to_string(value)),
              std::string::npos)
        << pfGetLastErrorMessage();
  }
  EXPECT_EQ(pfJobSetCostPolicy(nullptr, 1), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("pfJobSetCostPolicy"), std::string::npos);
  // The refused calls left policy 2 in place: slow slices do not move the stated cost.
  for (int i = 0; i < 6; ++i) bubble(stage, rt);
  EXPECT_EQ(cost_of(handle).samples, 6u);
  EXPECT_DOUBLE_EQ(cost_of(handle).learned_cost_us, 10.0);
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(pfJobSetCostPolicy(handle, 1), pfErrorInvalidArgument);  // a destroyed job's handle
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(LearnedCosts, AJobThatTrulyDoesNotFitIsWarnedOnceAndOverrunsAtMostOneItem) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.log_level = PF_UNSET_INT;  // the default level must show the warning
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);
  LogCapture log;

  MisjudgedJob job;
  job.name = "too-long";
  job.true_cost_us = 400.0;  // never fits a 100 us bubble, and its estimate says so
  job.items = 1000;
  const pfJobDesc_t desc = job.desc_with_cost(400.0);
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  for (int i = 0; i < 31; ++i) bubble(stage, rt);
  EXPECT_EQ(cost_of(handle).warned, 0);
  EXPECT_EQ(log.count("skipped as too short"), 0u);
  for (int i = 0; i < 69; ++i) bubble(stage, rt);

  const pfJobCostInfo_t info = cost_of(handle);
  EXPECT_EQ(info.warned, 1);
  EXPECT_EQ(info.too_short_streak, 100u);
  EXPECT_EQ(info.too_short_bubbles, 100u);
  // Probes at streaks 2, 7, 16, 33, 66 (back-off doubling): a few items, each measured.
  EXPECT_EQ(info.probes, 5u);
  EXPECT_EQ(info.samples, 5u);
  EXPECT_NEAR(info.learned_cost_us, 400.0, 5.0);
  EXPECT_EQ(info_of(handle).items_completed, 5u);
  // Once, with the numbers: name, the estimate, the streak and the bubbles' predictions.
  EXPECT_EQ(log.count("skipped as too short"), 1u) << log.text();
  const std::string text = log.text();
  EXPECT_NE(text.find("job 'too-long' was skipped as too short in 32 consecutive bubbles"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("given 400.0 us at creation"), std::string::npos) << text;
  EXPECT_NE(text.find("predicted at 100.0, 100.0, 100.0, 100.0 us"), std::string::npos) << text;
  // Each probe ran one 400 us item from the bubble's start: 300 us past its end, never more.
  const pfStats_t stats = stats_of(rt);
  EXPECT_GT(stats.max_overrun_us, 0.0);
  EXPECT_LE(stats.max_overrun_us, 400.0 + 1e-6);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(StageRuntimeTest, CostInfoRefusesBadArgumentsAndHonoursItsSize) {
  CountingJob job;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);

  EXPECT_EQ(pfJobGetCostInfo(handle, nullptr), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("info is NULL"), std::string::npos);
  pfJobCostInfo_t info{};
  EXPECT_EQ(pfJobGetCostInfo(nullptr, &info), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("pfJobGetCostInfo"), std::string::npos);

  // A size below the layout: refused, naming it, nothing written.
  std::memset(&info, 0xAB, sizeof info);
  info.size = sizeof info - 1;
  EXPECT_EQ(pfJobGetCostInfo(handle, &info), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find(
                "info->size = " + std::to_string(sizeof info - 1)),
            std::string::npos)
      << pfGetLastErrorMessage();
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&info);
  EXPECT_EQ(bytes[sizeof(size_t)], 0xAB);

  // A larger (newer) layout: this one's bytes, zeroes after them, size says what was written.
  struct Bigger {
    pfJobCostInfo_t info;
    uint64_t later_field;
  } bigger;
  std::memset(&bigger, 0xCD, sizeof bigger);
  bigger.info.size = sizeof bigger;
  PF_ASSERT_OK(pfJobGetCostInfo(handle, &bigger.info));
  EXPECT_EQ(bigger.info.size, sizeof(pfJobCostInfo_t));
  EXPECT_EQ(bigger.later_field, 0u);
  EXPECT_DOUBLE_EQ(bigger.info.prior_cost_us, job.item_cost_us);
  EXPECT_DOUBLE_EQ(bigger.info.learned_cost_us, job.item_cost_us);
  EXPECT_EQ(bigger.info.samples, 0u);
  EXPECT_EQ(bigger.info.config_index, 0);

  // A destroyed job's handle is refused, not read.
  PF_ASSERT_OK(pfJobDestroy(handle));
  info.size = sizeof info;
  EXPECT_EQ(pfJobGetCostInfo(handle, &info), pfErrorInvalidArgument);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
