// The sim_pipeline driver reproduces the schedule generator's timeline on the simulator when
// nothing fills the bubbles: same iteration time, same bubbles (stage, class, duration).
#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

void expect_matches_schedule(schedule::ScheduleSpec spec) {
  auto world = make_world(spec.stages, 32);
  sim::PipelineOptions options;
  options.spec = spec;
  options.comm_sms = 4;
  std::unique_ptr<sim::Pipeline> pipeline;
  PF_ASSERT_OK(sim::Pipeline::create(world.get(), options, &pipeline));
  std::vector<sim::IterationResult> iterations;
  PF_ASSERT_OK(pipeline->run(2, &iterations));
  const schedule::Timeline& t = pipeline->timeline();
  for (const auto& it : iterations) {
    EXPECT_NEAR(it.duration_us(), t.iteration_us, 1e-6) << schedule::schedule_kind_name(spec.kind);
  }
  size_t expected_bubbles = 0;
  for (const auto& stage : t.stages) expected_bubbles += stage.bubbles.size();
  ASSERT_EQ(pipeline->bubbles().size(), 2 * expected_bubbles);
  for (const sim::BubbleWindow& w : pipeline->bubbles()) {
    const auto& stage = t.stages[static_cast<size_t>(w.stage)];
    const schedule::Bubble& b = stage.bubbles[static_cast<size_t>(w.index_in_iteration)];
    EXPECT_EQ(w.kind, b.kind);
    EXPECT_NEAR(w.end_us - w.begin_us, b.duration_us, 1e-6)
        << schedule::schedule_kind_name(spec.kind) << " stage " << w.stage << " bubble "
        << w.index_in_iteration;
    EXPECT_NEAR(w.begin_us - iterations[w.iteration].start_us, b.start_us, 1e-6);
  }
}

TEST(SimPipeline, OneFOneBMatchesTheSchedule) {
  expect_matches_schedule(one_f_one_b(4, 8));
}

TEST(SimPipeline, GPipeWithAllReduceAndOptimizerMatchesTheSchedule) {
  schedule::ScheduleSpec spec = one_f_one_b(4, 6);
  spec.kind = schedule::ScheduleKind::GPipe;
  spec.allreduce_us = 150.0;
  spec.optimizer_us = 40.0;
  expect_matches_schedule(spec);
}

TEST(SimPipeline, InterleavedMatchesTheSchedule) {
  schedule::ScheduleSpec spec = one_f_one_b(4, 8);
  spec.kind = schedule::ScheduleKind::Interleaved1F1B;
  spec.chunks = 2;
  expect_matches_schedule(spec);
}

TEST(SimPipeline, ZeroBubbleMatchesTheSchedule) {
  schedule::ScheduleSpec spec = one_f_one_b(4, 8);
  spec.kind = schedule::ScheduleKind::ZBH1;
  expect_matches_schedule(spec);
}

TEST(SimPipeline, RejectsBadArguments) {
  auto world = make_world(2, 32);
  sim::PipelineOptions options;
  options.spec = one_f_one_b(4, 8);
  std::unique_ptr<sim::Pipeline> pipeline;
  EXPECT_EQ(sim::Pipeline::create(world.get(), options, &pipeline), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("the world has 2"), std::string::npos);
  options.spec = one_f_one_b(2, 4);
  options.runtimes.assign(3, nullptr);
  EXPECT_EQ(sim::Pipeline::create(world.get(), options, &pipeline), pfErrorInvalidArgument);
  EXPECT_EQ(sim::Pipeline::create(nullptr, options, &pipeline), pfErrorInvalidArgument);
}

}  // namespace
}  // namespace pipefill::testing
