#include <gtest/gtest.h>

#include <vector>

#include "core/planner.hpp"

namespace pipefill {
namespace {

JobConfigModel config(double cost, int parallelism, size_t resident = 0, size_t workspace = 0,
                      double work = 1.0) {
  JobConfigModel c;
  c.item_cost_us = cost;
  c.parallelism = parallelism;
  c.resident_bytes = resident;
  c.workspace_bytes_per_item = workspace;
  c.work_per_item = work;
  return c;
}

PlanRequest request(double predicted, int fill_sms, uint64_t remaining) {
  PlanRequest r;
  r.predicted_us = predicted;
  r.fill_sms = fill_sms;
  r.remaining_items = remaining;
  r.free_bytes = size_t{1} << 30;
  return r;
}

TEST(Planner, ItemsFitPredictedTimePerWorker) {
  const std::vector<JobConfigModel> configs = {config(10.0, 0)};
  const SlicePlan p = plan_slice(request(105.0, 4, 1000), configs);
  ASSERT_TRUE(p.fill) << p.reason;
  EXPECT_EQ(p.config_index, 0);
  EXPECT_EQ(p.workers, 4);
  EXPECT_EQ(p.items, 40u);  // 10 whole items per worker
  EXPECT_DOUBLE_EQ(p.expected_us, 100.0);
  EXPECT_DOUBLE_EQ(p.work, 40.0);
}

TEST(Planner, ExactFitKeepsTheLastItem) {
  const std::vector<JobConfigModel> configs = {config(10.0, 1)};
  const SlicePlan p = plan_slice(request(100.0, 4, 1000), configs);
  ASSERT_TRUE(p.fill);
  EXPECT_EQ(p.items, 10u);
  EXPECT_EQ(p.workers, 1);
}

TEST(Planner, MarginsAndOverheadShrinkTheBudget) {
  const std::vector<JobConfigModel> configs = {config(10.0, 1)};
  PlanRequest r = request(200.0, 8, 1000);
  r.margin_fraction = 0.1;    // 200 -> 180
  r.margin_us = 25.0;         // -> 155
  r.launch_overhead_us = 5.0; // -> 150
  const SlicePlan p = plan_slice(r, configs);
  ASSERT_TRUE(p.fill);
  EXPECT_EQ(p.items, 15u);
  EXPECT_DOUBLE_EQ(p.expected_us, 150.0);
}

TEST(Planner, TooShortBubbleIsNotFilled) {
  const std::vector<JobConfigModel> configs = {config(10.0, 1)};
  PlanRequest r = request(30.0, 8, 1000);
  r.margin_us = 30.0;
  SlicePlan p = plan_slice(r, configs);
  EXPECT_FALSE(p.fill);
  EXPECT_NE(p.reason.find("too short"), std::string::npos) << p.reason;
  // Budget positive but below one item.
  p = plan_slice(request(9.0, 8, 1000), configs);
  EXPECT_FALSE(p.fill);
  EXPECT_NE(p.reason.find("longer than"), std::string::npos) << p.reason;
}

TEST(Planner, RemainingItemsCapThePlan) {
  const std::vector<JobConfigModel> configs = {config(10.0, 0)};
  const SlicePlan p = plan_slice(request(1000.0, 8, 13), configs);
  ASSERT_TRUE(p.fill);
  EXPECT_EQ(p.items, 13u);
  EXPECT_EQ(p.workers, 8);
  EXPECT_DOUBLE_EQ(p.expected_us, 20.0);  // ceil(13/8) rounds
  const SlicePlan none = plan_slice(request(1000.0, 8, 0), configs);
  EXPECT_FALSE(none.fill);
  EXPECT_EQ(none.reason, "no items left");
}

TEST(Planner, PicksHighestThroughputWithinMemory) {
  // 0: 4 workers x 1 work / 10us; 1: 8 workers x 4 work / 20us (needs 1 MiB workspace per item);
  // 2: resident too large for the job's share.
  const std::vector<JobConfigModel> configs = {config(10.0, 4), config(20.0, 8, 0, 1 << 20, 4.0),
                                               config(1.0, 8, 1 << 30)};
  PlanRequest r = request(100.0, 8, 100000);
  r.resident_limit = 1 << 20;
  SlicePlan p = plan_slice(r, configs);
  ASSERT_TRUE(p.fill);
  EXPECT_EQ(p.config_index, 1);
  EXPECT_EQ(p.workers, 8);
  EXPECT_EQ(p.items, 40u);
  EXPECT_DOUBLE_EQ(p.work, 160.0);
  EXPECT_EQ(p.workspace_bytes, size_t{8} << 20);

  // With 2 MiB of bubble memory config 1 runs only 2 workers: 2*5*4 = 40 work < config 0's 40?
  // config 0: 4 workers * 10 items = 40 work; config 1: 2 workers * 5 items * 4 = 40: tie keeps 0.
  r.free_bytes = size_t{2} << 20;
  p = plan_slice(r, configs);
  ASSERT_TRUE(p.fill);
  EXPECT_EQ(p.config_index, 0);
  EXPECT_EQ(p.items, 40u);

  // No bubble memory: config 1 cannot run at all.
  r.free_bytes = 0;
  p = plan_slice(r, configs);
  EXPECT_EQ(p.config_index, 0);

  // Without a resident limit the very fast config 2 wins.
  r.resident_limit = SIZE_MAX;
  p = plan_slice(r, configs);
  EXPECT_EQ(p.config_index, 2);
  EXPECT_EQ(p.items, 800u);
}

TEST(Planner, WorkspaceThatNeverFitsIsReported) {
  const std::vector<JobConfigModel> configs = {config(10.0, 4, 0, 1000)};
  PlanRequest r = request(100.0, 8, 100);
  r.free_bytes = 999;
  const SlicePlan p = plan_slice(r, configs);
  EXPECT_FALSE(p.fill);
  EXPECT_NE(p.reason.find("999 free bytes"), std::string::npos) << p.reason;
}

TEST(Planner, OpaqueAndGatedPlansStayWithinTheBudget) {
  const std::vector<JobConfigModel> configs = {config(7.0, 3)};
  for (bool gated : {true, false}) {
    PlanRequest r = request(50.0, 8, 1000);
    r.gated = gated;
    const SlicePlan p = plan_slice(r, configs);
    ASSERT_TRUE(p.fill);
    EXPECT_EQ(p.items, 21u);  // 3 workers x floor(50/7)=7
    EXPECT_LE(p.expected_us, 50.0);
    EXPECT_DOUBLE_EQ(p.expected_us, 49.0);
  }
}

TEST(Planner, ParallelismIsCappedByFillSms) {
  const std::vector<JobConfigModel> configs = {config(10.0, 64)};
  const SlicePlan p = plan_slice(request(100.0, 16, 100000), configs);
  EXPECT_EQ(p.workers, 16);
  EXPECT_EQ(p.items, 160u);
  EXPECT_FALSE(plan_slice(request(100.0, 0, 100), configs).fill);
}

TEST(Planner, SetupConfigByThroughputWithinArena) {
  const std::vector<JobConfigModel> configs = {
      config(10.0, 4, 100),            // 0.4 items/us
      config(10.0, 16, 5000),          // 1.6 (capped to fill SMs 8 -> 0.8)
      config(5.0, 8, 2000, 0, 0.5)};   // 8*0.5/5 = 0.8: tie with 1 keeps 1
  EXPECT_EQ(choose_setup_config(configs, 10000, 8), 1);
  EXPECT_EQ(choose_setup_config(configs, 4000, 8), 2);
  EXPECT_EQ(choose_setup_config(configs, 1000, 8), 0);
  EXPECT_EQ(choose_setup_config(configs, 99, 8), -1);
}

}  // namespace
}  // namespace pipefill

namespace pipefill {
namespace {

// Concurrent fill packs a job with few items into the fewest SMs that still run them within the
// budget (the rest stay free for the next job); the sequential model spreads them over every
// worker for as few rounds as possible.
TEST(Planner, PackedSlicesTakeOnlyTheSmsTheirItemsNeed) {
  const std::vector<JobConfigModel> configs = {config(10.0, 0)};
  PlanRequest r = request(100.0, 64, 28);  // 10 items per SM fit the budget
  SlicePlan spread = plan_slice(r, configs);
  ASSERT_TRUE(spread.fill) << spread.reason;
  EXPECT_EQ(spread.workers, 28);  // one round on 28 SMs
  EXPECT_DOUBLE_EQ(spread.expected_us, 10.0);
  r.pack_sms = true;
  const SlicePlan packed = plan_slice(r, configs);
  ASSERT_TRUE(packed.fill) << packed.reason;
  EXPECT_EQ(packed.items, 28u);
  EXPECT_EQ(packed.workers, 3);  // ceil(28 / 10)
  EXPECT_DOUBLE_EQ(packed.expected_us, 100.0);  // ceil(28 / 3) = 10 rounds
  // Enough items for every SM: packing changes nothing.
  r.remaining_items = 100000;
  const SlicePlan full = plan_slice(r, configs);
  EXPECT_EQ(full.workers, 64);
  EXPECT_EQ(full.items, 640u);
}

// A graph job's worker holds the SMs its graph uses (issue 16 item 13): workers are counted in
// those SMs, and the slice reports the SMs it holds.
TEST(Planner, WorkersHoldTheirConfigsSmsPerWorker) {
  JobConfigModel graph = config(10.0, 1);
  graph.sms_per_worker = 20;
  SlicePlan p = plan_slice(request(105.0, 28, 1000), std::vector<JobConfigModel>{graph});
  ASSERT_TRUE(p.fill) << p.reason;
  EXPECT_EQ(p.workers, 1);
  EXPECT_EQ(p.sms, 20);
  EXPECT_EQ(p.items, 10u);
  // Fewer SMs free than one worker holds: no slice, and the reason says why.
  p = plan_slice(request(105.0, 19, 1000), std::vector<JobConfigModel>{graph});
  EXPECT_FALSE(p.fill);
  EXPECT_NE(p.reason.find("holds 20 SMs"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("only 19 are free"), std::string::npos) << p.reason;
  // Unbounded parallelism: as many workers as their SMs fit.
  JobConfigModel wide = config(10.0, 0);
  wide.sms_per_worker = 8;
  p = plan_slice(request(105.0, 28, 1000), std::vector<JobConfigModel>{wide});
  ASSERT_TRUE(p.fill) << p.reason;
  EXPECT_EQ(p.workers, 3);
  EXPECT_EQ(p.sms, 24);
}

TEST(Planner, DefaultConfigsHoldOneSmPerWorker) {
  const SlicePlan p = plan_slice(request(105.0, 4, 1000), std::vector<JobConfigModel>{config(10.0, 0)});
  ASSERT_TRUE(p.fill) << p.reason;
  EXPECT_EQ(p.sms, p.workers);
}

}  // namespace
}  // namespace pipefill
