// The analyser on the simulated device's activity log: a tiny program through the pfSim* C API
// whose bubbles are known exactly.
#include <gtest/gtest.h>

#include "analysis/bubbles.hpp"
#include "common/error.hpp"
#include "pipefill/pipefill.h"
#include "sim/sim_world.hpp"

namespace pipefill::analysis {
namespace {

TEST(AnalyzerOnSim, FindsTheGapsOfASimulatedStageExactly) {
  pfSimWorld_t world = nullptr;
  ASSERT_EQ(pfSimWorldCreate(2, nullptr, 1, &world), pfSuccess);
  void* main_stream = nullptr;
  void* peer_stream = nullptr;
  pfSimEvent_t activation = nullptr;
  pfSimEvent_t gradient = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &main_stream), pfSuccess);
  ASSERT_EQ(pfSimStreamCreate(world, 1, 0, &peer_stream), pfSuccess);
  ASSERT_EQ(pfSimEventCreate(world, &activation), pfSuccess);
  ASSERT_EQ(pfSimEventCreate(world, &gradient), pfSuccess);

  // The peer (device 1) sends at 500 us and again at 800 us.
  ASSERT_EQ(pfSimLaunchKernel(peer_stream, 500, 66), pfSuccess);
  ASSERT_EQ(pfSimEventRecord(activation, peer_stream), pfSuccess);
  ASSERT_EQ(pfSimLaunchKernel(peer_stream, 300, 66), pfSuccess);
  ASSERT_EQ(pfSimEventRecord(gradient, peer_stream), pfSuccess);
  // Stage on device 0: compute, a spinning recv (2 SMs) until 500, compute, a wait with no
  // resident kernel until 800 (an idle bubble), compute, and two kernels 10 us apart.
  ASSERT_EQ(pfSimLaunchKernel(main_stream, 100, 132), pfSuccess);               // [0, 100)
  ASSERT_EQ(pfSimStreamWaitEvent(main_stream, activation, 0.0, 2), pfSuccess);  // [100, 500)
  ASSERT_EQ(pfSimLaunchKernel(main_stream, 100, 132), pfSuccess);               // [500, 600)
  ASSERT_EQ(pfSimStreamWaitEvent(main_stream, gradient, 0.0, 0), pfSuccess);    // idle to 800
  ASSERT_EQ(pfSimLaunchKernel(main_stream, 50, 132), pfSuccess);                // [800, 850)
  ASSERT_EQ(pfSimStreamDelay(main_stream, 10), pfSuccess);                      // [850, 860)
  ASSERT_EQ(pfSimLaunchKernel(main_stream, 40, 132), pfSuccess);                // [860, 900)
  ASSERT_EQ(pfSimRunUntilIdle(world), pfSuccess);

  const std::vector<ActivityRecord> records = sim::world_from_handle(world)->activities(0);
  AnalysisOptions options;
  options.min_gap_us = 50;
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, options, &a), pfSuccess) << last_error_message();
  EXPECT_EQ(a.compute_kernels, 4u);
  EXPECT_EQ(a.comm_kernels, 1u);
  EXPECT_DOUBLE_EQ(a.span_start_us, 0);
  EXPECT_DOUBLE_EQ(a.span_end_us, 900);
  ASSERT_EQ(a.bubbles.size(), 2u);
  EXPECT_DOUBLE_EQ(a.bubbles[0].start_us, 100);
  EXPECT_DOUBLE_EQ(a.bubbles[0].end_us, 500);
  EXPECT_EQ(a.bubbles[0].kind, BubbleKind::CommOnly);
  EXPECT_DOUBLE_EQ(a.bubbles[0].comm_us, 400);
  EXPECT_DOUBLE_EQ(a.bubbles[0].wake_us, 500);  // the next kernel starts as the recv ends
  EXPECT_DOUBLE_EQ(a.bubbles[1].start_us, 600);
  EXPECT_DOUBLE_EQ(a.bubbles[1].end_us, 800);
  EXPECT_EQ(a.bubbles[1].kind, BubbleKind::Idle);
  EXPECT_DOUBLE_EQ(a.bubble_us, 600);
  EXPECT_DOUBLE_EQ(a.bubble_share, 600.0 / 900.0);
  EXPECT_EQ(a.start_delay.count, 1u);
  EXPECT_DOUBLE_EQ(a.start_delay.max, 0);

  // With no minimum the 10 us host delay between the last two kernels is a copy bubble.
  options.min_gap_us = 0;
  ASSERT_EQ(analyze_device(records, 0, options, &a), pfSuccess);
  ASSERT_EQ(a.bubbles.size(), 3u);
  EXPECT_DOUBLE_EQ(a.bubbles[2].start_us, 850);
  EXPECT_DOUBLE_EQ(a.bubbles[2].end_us, 860);
  EXPECT_EQ(a.bubbles[2].kind, BubbleKind::Copy);

  ASSERT_EQ(pfSimEventDestroy(activation), pfSuccess);
  ASSERT_EQ(pfSimEventDestroy(gradient), pfSuccess);
  ASSERT_EQ(pfSimWorldDestroy(world), pfSuccess);
}

}  // namespace
}  // namespace pipefill::analysis
