#include <gtest/gtest.h>

#include <cmath>

#include "analysis/bubbles.hpp"
#include "common/error.hpp"
#include "test_records.hpp"

namespace pipefill::analysis {
namespace {

using namespace pipefill::analysis::testing;

// Kernels on two streams with overlap, a comm-only gap, an idle gap with fill work in it, a gap
// with a copy, and a 20 us launch gap. Compute union: [0,180) [200,300) [400,500) [700,800)
// [1000,1100).
std::vector<ActivityRecord> mixed_gaps() {
  return {
      kernel(0, 100),
      kernel(50, 180, "gemm", 0, 8),
      kernel(200, 300),
      comm(290, 380),  // covers 80 us of [300,400), ends inside it
      kernel(400, 500),
      record(ActivityKind::Fill, 510, 690, "fill_item", 0, 30),
      kernel(700, 800),
      comm(820, 900),
      record(ActivityKind::Memcpy, 850, 870, "Memcpy DtoD", 0, 7),
      kernel(1000, 1100),
      kernel(5, 50, "other_device", 1),  // must not affect device 0
  };
}

AnalysisOptions options_with_gap(double min_gap_us) {
  AnalysisOptions o;
  o.min_gap_us = min_gap_us;
  return o;
}

TEST(Bubbles, FindsGapsInTheComputeUnionAndClassifiesThem) {
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(mixed_gaps(), 0, options_with_gap(50), &a), pfSuccess)
      << last_error_message();
  EXPECT_EQ(a.compute_kernels, 6u);
  EXPECT_EQ(a.comm_kernels, 2u);
  EXPECT_EQ(a.fill_kernels, 1u);
  EXPECT_DOUBLE_EQ(a.span_start_us, 0);
  EXPECT_DOUBLE_EQ(a.span_end_us, 1100);
  EXPECT_DOUBLE_EQ(a.compute_busy_us, 580);
  ASSERT_EQ(a.bubbles.size(), 3u);

  // [300,400): the receive covers [300,380): 80 us comm-only, 20 us idle.
  const Bubble& comm_only = a.bubbles[0];
  EXPECT_DOUBLE_EQ(comm_only.start_us, 300);
  EXPECT_DOUBLE_EQ(comm_only.end_us, 400);
  EXPECT_EQ(comm_only.kind, BubbleKind::CommOnly);
  EXPECT_DOUBLE_EQ(comm_only.comm_us, 80);
  EXPECT_DOUBLE_EQ(comm_only.comm_only_us, 80);
  EXPECT_DOUBLE_EQ(comm_only.idle_us, 20);
  EXPECT_DOUBLE_EQ(comm_only.copy_us, 0);
  EXPECT_DOUBLE_EQ(comm_only.share(BubbleKind::CommOnly), 0.8);
  EXPECT_DOUBLE_EQ(comm_only.wake_us, 380);
  EXPECT_DOUBLE_EQ(comm_only.start_delay_us, 20);

  const Bubble& idle = a.bubbles[1];
  EXPECT_DOUBLE_EQ(idle.start_us, 500);
  EXPECT_DOUBLE_EQ(idle.end_us, 700);
  EXPECT_EQ(idle.kind, BubbleKind::Idle);
  EXPECT_DOUBLE_EQ(idle.idle_us, 200);
  EXPECT_DOUBLE_EQ(idle.fill_us, 180);  // fill work does not close a bubble
  EXPECT_TRUE(std::isnan(idle.wake_us));
  EXPECT_TRUE(std::isnan(idle.start_delay_us));

  // [800,1000): comm [820,900) with a copy [850,870) inside it: copy 20, comm-only 60, idle 120.
  // Mostly idle, so labelled idle (not "copy" for holding any copy time) and no start delay:
  // the device was not waiting for the transfer that ended at 900.
  const Bubble& mixed = a.bubbles[2];
  EXPECT_DOUBLE_EQ(mixed.start_us, 800);
  EXPECT_DOUBLE_EQ(mixed.end_us, 1000);
  EXPECT_EQ(mixed.kind, BubbleKind::Idle);
  EXPECT_DOUBLE_EQ(mixed.comm_us, 80);
  EXPECT_DOUBLE_EQ(mixed.copy_us, 20);
  EXPECT_DOUBLE_EQ(mixed.comm_only_us, 60);
  EXPECT_DOUBLE_EQ(mixed.idle_us, 120);
  EXPECT_DOUBLE_EQ(mixed.wake_us, 900);
  EXPECT_TRUE(std::isnan(mixed.start_delay_us));

  EXPECT_DOUBLE_EQ(a.bubble_us, 500);
  EXPECT_DOUBLE_EQ(a.comm_only_bubble_us, 80 + 60);
  EXPECT_DOUBLE_EQ(a.idle_bubble_us, 20 + 200 + 120);
  EXPECT_DOUBLE_EQ(a.copy_bubble_us, 20);
  EXPECT_EQ(a.idle_bubbles, 2u);
  EXPECT_EQ(a.comm_only_bubbles, 1u);
  EXPECT_EQ(a.copy_bubbles, 0u);
  EXPECT_DOUBLE_EQ(a.fill_in_bubbles_us, 180);
  EXPECT_DOUBLE_EQ(a.fill_busy_us, 180);
  EXPECT_DOUBLE_EQ(a.fill_outside_bubbles_us, 0);
  EXPECT_DOUBLE_EQ(a.bubble_share, 500.0 / 1100.0);
  // One start delay: 400 - 380 (the comm-only bubble).
  EXPECT_EQ(a.start_delay.count, 1u);
  EXPECT_DOUBLE_EQ(a.start_delay.max, 20);
}

// The issue's case: a 62,283 us bubble with 62,163 us of NCCL and 18 us of copy was labelled
// "copy" (any copy time won) and its start delay measured from the copy's end.
TEST(Bubbles, ALongReceiveWithATinyCopyIsCommOnly) {
  const std::vector<ActivityRecord> records = {
      kernel(0, 100),
      comm(100, 62263),                                               // 62,163 us receive
      record(ActivityKind::Memcpy, 200, 218, "Memcpy HtoD", 0, 9),   // 18 us inside it
      record(ActivityKind::Memset, 70000, 70010, "Memset", 0, 9),     // after the bubble
      kernel(62383, 62483),
  };
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfSuccess) << last_error_message();
  ASSERT_EQ(a.bubbles.size(), 1u);
  const Bubble& b = a.bubbles[0];
  EXPECT_DOUBLE_EQ(b.duration_us(), 62283);
  EXPECT_EQ(b.kind, BubbleKind::CommOnly);
  EXPECT_DOUBLE_EQ(b.copy_us, 18);
  EXPECT_DOUBLE_EQ(b.comm_only_us, 62163 - 18);
  EXPECT_DOUBLE_EQ(b.idle_us, 62283 - 62163);
  EXPECT_DOUBLE_EQ(b.share(BubbleKind::Idle) + b.share(BubbleKind::CommOnly) +
                       b.share(BubbleKind::Copy),
                   1.0);
  // Woken by the receive's end at 62263, not the copy's at 218.
  EXPECT_DOUBLE_EQ(b.start_delay_us, 62383 - 62263);
  EXPECT_DOUBLE_EQ(a.start_delay.max, 120);
}

// A mostly idle bubble has no start delay, however early a short transfer in it ended (the old
// rule measured 5 s "delays" from such transfers).
TEST(Bubbles, StartDelayIsUndefinedForIdleBubbles) {
  const std::vector<ActivityRecord> records = {
      kernel(0, 100),
      record(ActivityKind::Memcpy, 150, 170, "Memcpy DtoH", 0, 9),
      kernel(5'000'100, 5'000'200),
  };
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfSuccess);
  ASSERT_EQ(a.bubbles.size(), 1u);
  EXPECT_EQ(a.bubbles[0].kind, BubbleKind::Idle);
  EXPECT_DOUBLE_EQ(a.bubbles[0].wake_us, 170);
  EXPECT_TRUE(std::isnan(a.bubbles[0].start_delay_us));
  EXPECT_EQ(a.start_delay.count, 0u);
  EXPECT_DOUBLE_EQ(a.idle_bubble_us, 5'000'000 - 20);
  EXPECT_DOUBLE_EQ(a.copy_bubble_us, 20);
}

// A pipeline receive: the NCCL SendRecv kernel spins for the whole wait. It is communication,
// so the wait is a bubble (comm-only), not compute.
TEST(Bubbles, TheSpinningSendRecvOfAPipelineReceiveIsABubble) {
  std::vector<ActivityRecord> records = {kernel(0, 1000, "fwd_stage1")};
  ActivityRecord recv = record(ActivityKind::Comm, 1000, 6000,
                               "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 0, 20);
  records.push_back(recv);
  records.push_back(kernel(6005, 7000, "fwd_stage1"));
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfSuccess);
  ASSERT_EQ(a.bubbles.size(), 1u);
  EXPECT_DOUBLE_EQ(a.bubbles[0].duration_us(), 5005);
  EXPECT_EQ(a.bubbles[0].kind, BubbleKind::CommOnly);
  EXPECT_DOUBLE_EQ(a.bubbles[0].comm_only_us, 5000);
  EXPECT_DOUBLE_EQ(a.bubbles[0].start_delay_us, 5);
  EXPECT_DOUBLE_EQ(a.compute_busy_us, 1995);
}

TEST(Bubbles, MinimumGapIsInclusiveAndFiltersLaunchGaps) {
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(mixed_gaps(), 0, options_with_gap(10), &a), pfSuccess);
  ASSERT_EQ(a.bubbles.size(), 4u);
  EXPECT_DOUBLE_EQ(a.bubbles[0].start_us, 180);
  EXPECT_DOUBLE_EQ(a.bubbles[0].end_us, 200);
  EXPECT_EQ(a.bubbles[0].kind, BubbleKind::Idle);

  ASSERT_EQ(analyze_device(mixed_gaps(), 0, options_with_gap(100), &a), pfSuccess);
  ASSERT_EQ(a.bubbles.size(), 3u);  // the 100 us gap is kept
  EXPECT_DOUBLE_EQ(a.bubbles[0].duration_us(), 100);

  ASSERT_EQ(analyze_device(mixed_gaps(), 0, options_with_gap(100.5), &a), pfSuccess);
  EXPECT_EQ(a.bubbles.size(), 2u);
}

TEST(Bubbles, FillAlongsideComputeIsOutsideBubblesButTheTraceEdgesAreNot) {
  std::vector<ActivityRecord> records = mixed_gaps();
  records.push_back(record(ActivityKind::Fill, 450, 520, "fill_item", 0, 30));   // 50 us overrun
  records.push_back(record(ActivityKind::Fill, 1090, 1300, "fill_item", 0, 30));  // 10 in span
  records.push_back(record(ActivityKind::Fill, -100, 0, "fill_item", 0, 30));     // before it
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, options_with_gap(50), &a), pfSuccess);
  EXPECT_DOUBLE_EQ(a.fill_in_bubbles_us, 190);  // [450,520) joins [510,690): [500,690)
  EXPECT_DOUBLE_EQ(a.fill_busy_us, 50 + 190 + 10);
  EXPECT_DOUBLE_EQ(a.fill_outside_bubbles_us, 50 + 10);
}

TEST(Bubbles, OtherDeviceIsAnalysedOnItsOwn) {
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(mixed_gaps(), 1, options_with_gap(50), &a), pfSuccess);
  EXPECT_EQ(a.compute_kernels, 1u);
  EXPECT_TRUE(a.bubbles.empty());
  EXPECT_DOUBLE_EQ(a.span_us(), 45);
  EXPECT_EQ(devices_with_compute(mixed_gaps()), (std::vector<int>{0, 1}));
}

// The iterations a period makes are bounded (the work is span / period, whatever the trace's
// size): beyond the bound the analysis is refused naming the bound's flag; raised, it runs.
TEST(Bubbles, PeriodIterationsAreBoundedByANamedLimit) {
  AnalysisOptions o;
  o.iteration_period_us = 1;  // five_iterations() spans 5000 us: 5000 iterations
  o.max_iterations = 4999;
  DeviceAnalysis a;
  EXPECT_EQ(analyze_device(five_iterations(), 0, o, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("more than the bound of 4999 (--max-iterations)"),
            std::string::npos)
      << last_error_message();
  EXPECT_TRUE(a.iterations.empty()) << "a refused analysis makes no iterations";
  o.max_iterations = 5000;
  ASSERT_EQ(analyze_device(five_iterations(), 0, o, &a), pfSuccess) << last_error_message();
  EXPECT_EQ(a.iterations.size(), 5000u);
  o.max_iterations = 0;
  EXPECT_EQ(validate_options(o), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("max_iterations"), std::string::npos);
}

TEST(Bubbles, PeriodIterationsGiveClassesWithQuantiles) {
  AnalysisOptions o;
  o.iteration_period_us = 1000;
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(five_iterations(), 0, o, &a), pfSuccess) << last_error_message();
  EXPECT_EQ(a.iteration_source, IterationSource::Period);
  ASSERT_EQ(a.iterations.size(), 5u);
  EXPECT_EQ(a.iterations[3].label, "period#3");
  EXPECT_DOUBLE_EQ(a.iterations[3].start_us, 3000);
  EXPECT_DOUBLE_EQ(a.iterations[3].end_us, 4000);
  EXPECT_EQ(a.iterations[3].bubble_count, 3);
  EXPECT_DOUBLE_EQ(a.iterations[3].bubble_us, 230 + 200 + 250);
  ASSERT_EQ(a.bubbles.size(), 15u);
  EXPECT_EQ(a.bubbles[7].iteration, 2);
  EXPECT_EQ(a.bubbles[7].class_index, 1);
  EXPECT_DOUBLE_EQ(a.bubbles[7].offset_us, 400);

  ASSERT_EQ(a.classes.size(), 3u);
  const BubbleClass& c0 = a.classes[0];
  EXPECT_EQ(c0.duration.count, 5u);
  EXPECT_DOUBLE_EQ(c0.duration.mean, 220);
  EXPECT_DOUBLE_EQ(c0.duration.p10, 204);
  EXPECT_DOUBLE_EQ(c0.duration.p50, 220);
  EXPECT_DOUBLE_EQ(c0.duration.p90, 236);
  EXPECT_DOUBLE_EQ(c0.duration.min, 200);
  EXPECT_DOUBLE_EQ(c0.duration.max, 240);
  EXPECT_DOUBLE_EQ(c0.offset.mean, 100);
  EXPECT_EQ(c0.idle, 5u);
  EXPECT_DOUBLE_EQ(c0.occurrence, 1.0);
  EXPECT_DOUBLE_EQ(c0.predicted_us, 200);  // nearest rank of 0.1 over 5 samples: the 1st
  EXPECT_DOUBLE_EQ(c0.usable_us, 200 * 0.95 - 20);
  EXPECT_DOUBLE_EQ(a.classes[1].duration.mean, 200);
  EXPECT_DOUBLE_EQ(a.classes[2].duration.mean, 250);
  EXPECT_DOUBLE_EQ(a.classes[2].usable_us, 250 * 0.95 - 20);
  EXPECT_FALSE(c0.memory.known);
  EXPECT_EQ(c0.free_bytes, -1);

  EXPECT_DOUBLE_EQ(a.mean_iteration_us, 1000);
  EXPECT_DOUBLE_EQ(a.bubble_us_per_iteration, (1100.0 + 1000.0 + 1250.0) / 5.0);
  EXPECT_DOUBLE_EQ(a.iteration_bubble_share, 670.0 / 1000.0);
  EXPECT_DOUBLE_EQ(a.fill.fillable_us_per_iteration, 170 + 170 + 217.5);
  EXPECT_DOUBLE_EQ(a.fill.fillable_share, 557.5 / 1000.0);
  EXPECT_DOUBLE_EQ(a.fill.fill_efficiency, 557.5 / 670.0);
  EXPECT_FALSE(a.fill.items_estimated);
  EXPECT_TRUE(a.notes.empty());
}

TEST(Bubbles, FillEstimateCountsWholeItemsPerSlot) {
  AnalysisOptions o;
  o.iteration_period_us = 1000;
  o.item_cost_us = 50;
  o.item_parallelism = 4;
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(five_iterations(), 0, o, &a), pfSuccess);
  // usable 170 -> 3 items per slot, 217.5 -> 4.
  EXPECT_DOUBLE_EQ(a.classes[0].items_per_occurrence, 12);
  EXPECT_DOUBLE_EQ(a.classes[1].items_per_occurrence, 12);
  EXPECT_DOUBLE_EQ(a.classes[2].items_per_occurrence, 16);
  EXPECT_TRUE(a.fill.items_estimated);
  EXPECT_DOUBLE_EQ(a.fill.items_per_iteration, 40);
  EXPECT_DOUBLE_EQ(a.fill.items_per_second, 40000);
  EXPECT_DOUBLE_EQ(a.fill.dedicated_gpu_share, 40.0 * 50.0 / (4.0 * 1000.0));
}

TEST(Bubbles, QuantileAndMarginsChangeThePrediction) {
  AnalysisOptions o;
  o.iteration_period_us = 1000;
  o.quantile = 0.5;
  o.safety_margin_us = 0;
  o.safety_margin_fraction = 0;
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(five_iterations(), 0, o, &a), pfSuccess);
  EXPECT_DOUBLE_EQ(a.classes[0].predicted_us, 220);  // rank ceil(2.5) = 3
  EXPECT_DOUBLE_EQ(a.classes[0].usable_us, 220);
  o.safety_margin_us = 1000;  // larger than every bubble: nothing usable, never negative
  ASSERT_EQ(analyze_device(five_iterations(), 0, o, &a), pfSuccess);
  EXPECT_DOUBLE_EQ(a.classes[0].usable_us, 0);
  EXPECT_DOUBLE_EQ(a.fill.fillable_us_per_iteration, 0);
}

TEST(Bubbles, DeviceMarkersOnSeveralStreamsMakeOneIterationEach) {
  std::vector<ActivityRecord> records = five_iterations();
  for (int i = 0; i < 5; ++i) {
    const double b = 1000.0 * i;
    const std::string name = "ProfilerStep#" + std::to_string(i + 10);
    records.push_back(marker(b, b + 990, name, 0, 7));
    records.push_back(marker(b + 5, b + 1000, name, 0, 8));
    records.push_back(marker(b - 400, b + 100, name, kHostDevice, 4242));  // ignored
  }
  AnalysisOptions o;  // default marker prefix "ProfilerStep"
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, o, &a), pfSuccess) << last_error_message();
  EXPECT_EQ(a.iteration_source, IterationSource::Markers);
  ASSERT_EQ(a.iterations.size(), 5u);
  EXPECT_EQ(a.iterations[0].label, "ProfilerStep#10");
  EXPECT_DOUBLE_EQ(a.iterations[0].start_us, 0);
  EXPECT_DOUBLE_EQ(a.iterations[0].end_us, 1000);
  EXPECT_DOUBLE_EQ(a.iterations[4].start_us, 4000);
  EXPECT_DOUBLE_EQ(a.iterations[4].end_us, 5000);  // the last marker's merged end
  ASSERT_EQ(a.classes.size(), 3u);
  EXPECT_EQ(a.classes[0].duration.count, 5u);
  EXPECT_DOUBLE_EQ(a.classes[0].duration.p50, 220);
}

TEST(Bubbles, AMarkerNameWithoutAStepNumberStillSeparatesSteps) {
  std::vector<ActivityRecord> records = five_iterations();
  for (int i = 0; i < 5; ++i) {
    const double b = 1000.0 * i;
    records.push_back(marker(b, b + 1000, "train_step", 0, 7));
    records.push_back(marker(b + 2, b + 999, "train_step", 0, 20));  // same step, comm stream
  }
  AnalysisOptions o;
  o.iteration_marker = "train_step";
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, o, &a), pfSuccess) << last_error_message();
  ASSERT_EQ(a.iterations.size(), 5u);
  EXPECT_DOUBLE_EQ(a.iterations[2].start_us, 2000);
  EXPECT_DOUBLE_EQ(a.iterations[2].end_us, 3000);
  EXPECT_DOUBLE_EQ(a.iterations[4].end_us, 5000);
  EXPECT_EQ(a.classes.size(), 3u);
  EXPECT_EQ(a.classes[0].duration.count, 5u);
}

TEST(Bubbles, HostMarkersAreTheFallbackAndTheLastStepReachesTheLastKernel) {
  std::vector<ActivityRecord> records = five_iterations();
  for (int i = 0; i < 5; ++i) {
    const double b = 1000.0 * i;
    records.push_back(marker(b - 50, b + 850, "Step#" + std::to_string(i), kHostDevice, 4242));
  }
  AnalysisOptions o;
  o.iteration_marker = "Step#";
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, o, &a), pfSuccess) << last_error_message();
  EXPECT_EQ(a.iteration_source, IterationSource::Markers);
  ASSERT_EQ(a.iterations.size(), 5u);
  EXPECT_DOUBLE_EQ(a.iterations[0].start_us, -50);
  EXPECT_DOUBLE_EQ(a.iterations[0].end_us, 950);
  EXPECT_DOUBLE_EQ(a.iterations[4].start_us, 3950);
  EXPECT_DOUBLE_EQ(a.iterations[4].end_us, 5000);  // host step ended at 4850, GPU at 5000
  EXPECT_DOUBLE_EQ(a.mean_iteration_us, (4 * 1000.0 + 1050.0) / 5.0);
  EXPECT_EQ(a.classes.size(), 3u);
  EXPECT_DOUBLE_EQ(a.classes[0].offset.mean, 150);
}

TEST(Bubbles, MissingMarkersFallBackToOneIterationUnlessRequired) {
  AnalysisOptions o;
  o.iteration_marker = "NoSuchStep";
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(five_iterations(), 0, o, &a), pfSuccess);
  EXPECT_EQ(a.iteration_source, IterationSource::WholeTrace);
  ASSERT_EQ(a.iterations.size(), 1u);
  EXPECT_EQ(a.iterations[0].label, "trace");
  EXPECT_DOUBLE_EQ(a.iterations[0].duration_us(), 5000);
  EXPECT_EQ(a.classes.size(), 15u);  // every bubble is its own class
  EXPECT_EQ(a.classes[14].duration.count, 1u);

  o.iteration_marker_required = true;
  EXPECT_EQ(analyze_device(five_iterations(), 0, o, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("NoSuchStep"), std::string::npos) << last_error_message();
}

TEST(Bubbles, BubblesBeforeTheFirstMarkerAreOutsideEveryIteration) {
  std::vector<ActivityRecord> records = five_iterations();
  for (int i = 1; i < 5; ++i) {
    records.push_back(marker(1000.0 * i, 1000.0 * i + 1000, "ProfilerStep#" + std::to_string(i)));
  }
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfSuccess);
  ASSERT_EQ(a.iterations.size(), 4u);
  EXPECT_EQ(a.bubbles[0].iteration, -1);
  EXPECT_EQ(a.bubbles[0].class_index, -1);
  EXPECT_EQ(a.classes[0].duration.count, 4u);
  EXPECT_DOUBLE_EQ(a.classes[0].duration.min, 210);
  EXPECT_DOUBLE_EQ(a.bubble_us, 3350);  // still counted in the trace total
  EXPECT_DOUBLE_EQ(a.bubble_us_per_iteration, (3350.0 - 650.0) / 4.0);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("3 bubble(s) lie outside"), std::string::npos) << a.notes[0];
}

TEST(Bubbles, VaryingBubbleCountsAreNotedAndClassesCountOccurrences) {
  std::vector<ActivityRecord> records = five_iterations();
  records.push_back(kernel(2700, 2800, "extra"));  // splits iteration 2's third bubble in two
  AnalysisOptions o;
  o.iteration_period_us = 1000;
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, o, &a), pfSuccess);
  ASSERT_EQ(a.classes.size(), 4u);
  EXPECT_EQ(a.classes[3].duration.count, 1u);
  EXPECT_DOUBLE_EQ(a.classes[3].duration.mean, 100);  // [2800, 2900)
  EXPECT_DOUBLE_EQ(a.classes[3].occurrence, 0.2);
  EXPECT_DOUBLE_EQ(a.classes[2].duration.min, 50);    // [2650, 2700)
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("3 to 4 bubbles"), std::string::npos) << a.notes[0];
}

TEST(Bubbles, MemoryDuringBubblesGivesFreeMemoryPerClass) {
  std::vector<ActivityRecord> records = five_iterations();
  // Absolute levels: 1000 before, +500 inside every iteration's first bubble, freed at its end.
  records.push_back(memory(ActivityKind::MemoryAlloc, -10, 1000, 1000));
  for (int i = 0; i < 5; ++i) {
    const double b = 1000.0 * i;
    records.push_back(memory(ActivityKind::MemoryAlloc, b + 150, 500 + 100 * i));
    records.push_back(memory(ActivityKind::MemoryFree, b + 350, 500 + 100 * i));
  }
  AnalysisOptions o;
  o.iteration_period_us = 1000;
  o.device_memory_bytes = 4000;
  o.item_cost_us = 50;
  o.item_parallelism = 4;
  o.item_memory_bytes = 1000;
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, o, &a), pfSuccess) << last_error_message();
  EXPECT_TRUE(a.memory_known);
  EXPECT_TRUE(a.memory_absolute);
  EXPECT_EQ(a.memory_peak_bytes, 1900);
  EXPECT_TRUE(a.bubbles[0].memory.known);
  EXPECT_EQ(a.bubbles[0].memory.min_bytes, 1000);
  EXPECT_EQ(a.bubbles[0].memory.max_bytes, 1500);
  EXPECT_EQ(a.bubbles[1].memory.max_bytes, 1000);
  const BubbleClass& c0 = a.classes[0];
  EXPECT_EQ(c0.memory.min_bytes, 1000);
  EXPECT_EQ(c0.memory.max_bytes, 1900);
  EXPECT_EQ(c0.free_bytes, 2100);
  EXPECT_EQ(c0.item_slots, 2);  // 2100 / 1000, below the parallelism of 4
  EXPECT_DOUBLE_EQ(c0.items_per_occurrence, 3 * 2);
  EXPECT_EQ(a.classes[1].free_bytes, 3000);
  EXPECT_EQ(a.classes[1].item_slots, 3);
  EXPECT_DOUBLE_EQ(a.fill.items_per_iteration, 6 + 9 + 12);
  EXPECT_TRUE(a.notes.empty());
}

TEST(Bubbles, BadInputIsRejectedWithTheValueNamed) {
  DeviceAnalysis a;
  std::vector<ActivityRecord> records = {kernel(0, 10), kernel(30, 20, "backwards")};
  EXPECT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("record 1"), std::string::npos) << last_error_message();
  EXPECT_NE(last_error_message().find("backwards"), std::string::npos);

  EXPECT_EQ(analyze_device(five_iterations(), 3, AnalysisOptions{}, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("device 3 has no compute kernels"), std::string::npos)
      << last_error_message();
  EXPECT_NE(last_error_message().find("[0]"), std::string::npos);

  AnalysisOptions o;
  o.min_gap_us = -1;
  EXPECT_EQ(analyze_device(five_iterations(), 0, o, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("min_gap_us"), std::string::npos);
  o = AnalysisOptions{};
  o.quantile = 0;
  EXPECT_EQ(validate_options(o), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("quantile"), std::string::npos);
  o = AnalysisOptions{};
  o.safety_margin_fraction = 1.0;
  EXPECT_EQ(validate_options(o), pfErrorInvalidArgument);
  o = AnalysisOptions{};
  o.item_parallelism = 0;
  EXPECT_EQ(validate_options(o), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("item_parallelism"), std::string::npos);
  o = AnalysisOptions{};
  o.iteration_period_us = 1000;
  o.iteration_origin_us = 6000;  // after the last kernel
  EXPECT_EQ(analyze_device(five_iterations(), 0, o, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("6000"), std::string::npos);
  EXPECT_EQ(analyze_device(five_iterations(), 0, AnalysisOptions{}, nullptr),
            pfErrorInvalidArgument);
}

// The ROCm trace's shape: the GPU-side ProfilerStep#1 ends at 1 ms while the step's kernels,
// launched inside the host-side ProfilerStep#1, run until 9 ms. The host markers win.
TEST(Bubbles, GpuStepMarkersThatEndBeforeTheStepsKernelsGiveWayToHostMarkers) {
  std::vector<ActivityRecord> records;
  for (int k = 0; k < 10; ++k) records.push_back(kernel(1000.0 * k, 1000.0 * k + 100));
  records.push_back(marker(0, 1100, "ProfilerStep#1", 0, 7));                  // GPU side, short
  records.push_back(marker(-300, 9500, "ProfilerStep#1", kHostDevice, 4242));  // host side
  records.push_back(marker(9600, 9650, "ProfilerStep#2", kHostDevice, 4242));  // after the GPU
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfSuccess) << last_error_message();
  EXPECT_EQ(a.iteration_source, IterationSource::Markers);
  EXPECT_TRUE(a.host_markers);
  ASSERT_EQ(a.iterations.size(), 1u);  // ProfilerStep#2 starts after the last kernel (9100)
  EXPECT_EQ(a.iterations[0].label, "ProfilerStep#1");
  EXPECT_DOUBLE_EQ(a.iterations[0].start_us, -300);
  EXPECT_DOUBLE_EQ(a.iterations[0].end_us, 9600);
  EXPECT_EQ(a.iterations[0].bubble_count, 9);  // every bubble is in the iteration
  bool noted = false;
  for (const std::string& n : a.notes) {
    noted = noted || (n.find("GPU-side 'ProfilerStep#1' ends at 1.100 ms") != std::string::npos &&
                      n.find("until 9.100 ms") != std::string::npos);
  }
  EXPECT_TRUE(noted) << (a.notes.empty() ? "" : a.notes[0]);

  // GPU markers that do cover their step's kernels are kept (even though the host ones exist).
  records[10] = marker(0, 9100, "ProfilerStep#1", 0, 7);
  ASSERT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfSuccess);
  EXPECT_FALSE(a.host_markers);
  ASSERT_EQ(a.iterations.size(), 1u);
  EXPECT_DOUBLE_EQ(a.iterations[0].start_us, 0);
  EXPECT_DOUBLE_EQ(a.iterations[0].end_us, 9100);
}

// Two ranks' processes in one trace, each with its own ProfilerStep#N at the same names and
// overlapping times: device 0's kernels were launched by pid 100, device 1's by pid 200. Each
// device's iterations come from its own process's markers, never merged across processes.
TEST(Bubbles, HostMarkersOfEachProcessStayApart) {
  std::vector<ActivityRecord> records;
  for (int device = 0; device < 2; ++device) {
    for (int k = 0; k < 6; ++k) {
      ActivityRecord r = kernel(500.0 * k + device * 100, 500.0 * k + device * 100 + 100, "gemm",
                                device);
      r.process = device == 0 ? 100 : 200;
      records.push_back(r);
    }
  }
  auto host_step = [](double start, double end, const char* name, int64_t pid) {
    ActivityRecord m = marker(start, end, name, kHostDevice, static_cast<uint64_t>(pid));
    m.process = pid;
    return m;
  };
  // pid 100: steps of 1500 us; pid 200: one step over everything.
  records.push_back(host_step(0, 1400, "ProfilerStep#1", 100));
  records.push_back(host_step(1500, 2900, "ProfilerStep#2", 100));
  records.push_back(host_step(50, 3000, "ProfilerStep#1", 200));
  DeviceAnalysis a0, a1;
  ASSERT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a0), pfSuccess) << last_error_message();
  ASSERT_EQ(analyze_device(records, 1, AnalysisOptions{}, &a1), pfSuccess) << last_error_message();
  EXPECT_EQ(a0.process, 100);
  EXPECT_EQ(a1.process, 200);
  ASSERT_EQ(a0.iterations.size(), 2u);
  EXPECT_DOUBLE_EQ(a0.iterations[0].start_us, 0);
  EXPECT_DOUBLE_EQ(a0.iterations[0].end_us, 1500);
  EXPECT_DOUBLE_EQ(a0.iterations[1].end_us, 2900);  // host step end, after the last kernel (2600)
  ASSERT_EQ(a1.iterations.size(), 1u);              // merged with pid 100's #1, it would be [0, ..)
  EXPECT_DOUBLE_EQ(a1.iterations[0].start_us, 50);
  EXPECT_DOUBLE_EQ(a1.iterations[0].end_us, 3000);

  // Without launch information the device's process is unknown: host markers of several
  // processes are then not used at all (and a note says why).
  for (ActivityRecord& r : records) {
    if (r.device == 1) r.process = -1;
  }
  ASSERT_EQ(analyze_device(records, 1, AnalysisOptions{}, &a1), pfSuccess);
  EXPECT_EQ(a1.iteration_source, IterationSource::WholeTrace);
  ASSERT_FALSE(a1.notes.empty());
  EXPECT_NE(a1.notes[0].find("come from 2 processes ([100, 200])"), std::string::npos)
      << a1.notes[0];
}

// Analysing every device costs O(records): with N kernels spread over D devices (and host
// markers shared by all), the records read stay within a fixed multiple of N for D = 1 to N.
// The old analyser scanned every record once per device (N x D reads).
TEST(Bubbles, CostIsLinearInRecordsWhateverTheDeviceCount) {
  constexpr int kKernels = 20000;
  for (const int devices : {1, 100, 20000}) {
    std::vector<ActivityRecord> records;
    for (int i = 0; i < kKernels; ++i) {
      const int device = i % devices;
      const double t = 100.0 * (i / devices);
      records.push_back(kernel(t, t + 10, "gemm", device));
    }
    for (int s = 0; s < 50; ++s) {
      records.push_back(marker(s * 1e6, (s + 1) * 1e6, "ProfilerStep#" + std::to_string(s),
                               kHostDevice, 1));
    }
    const CompactTrace trace = compact_from_activity(records, "many.json");
    TraceAnalyzer analyzer(trace);
    ASSERT_EQ(analyzer.analysable_devices().size(), static_cast<size_t>(devices));
    for (const int device : analyzer.analysable_devices()) {
      DeviceAnalysis a;
      ASSERT_EQ(analyzer.analyze(device, AnalysisOptions{}, &a), pfSuccess) << last_error_message();
    }
    // Grouping (N + 50) + per device its own records twice (intervals, memory) + the host
    // markers once.
    EXPECT_LE(analyzer.records_visited(), 3u * records.size() + 50u) << devices << " devices";
  }
}

TEST(Bubbles, AbsurdByteCountsAreErrorsNamingTheRecordAndValue) {
  std::vector<ActivityRecord> records = five_iterations();
  records.push_back(memory(ActivityKind::MemoryAlloc, 10, uint64_t{9} << 60));  // 1.04e19 bytes
  DeviceAnalysis a;
  EXPECT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("record 20"), std::string::npos) << last_error_message();
  EXPECT_NE(last_error_message().find("1.0376293541461623e+19 bytes exceed 2^53"),
            std::string::npos)
      << last_error_message();

  // Each size is credible, their sum is not: 1100 x 2^53 bytes overflow int64.
  records = five_iterations();
  for (int i = 0; i < 1100; ++i) {
    records.push_back(memory(ActivityKind::MemoryAlloc, 10 + i, uint64_t{1} << 53));
  }
  EXPECT_EQ(analyze_device(records, 0, AnalysisOptions{}, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("the memory level overflows 64 bits"), std::string::npos)
      << last_error_message();

  AnalysisOptions o;
  o.device_memory_bytes = uint64_t{1} << 60;  // --device-memory-gb 1e9
  EXPECT_EQ(analyze_device(five_iterations(), 0, o, &a), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("device_memory_bytes must be <= 2^53"), std::string::npos);
  o = AnalysisOptions{};
  o.item_memory_bytes = UINT64_MAX;
  EXPECT_EQ(validate_options(o), pfErrorInvalidArgument);
}

}  // namespace
}  // namespace pipefill::analysis
