// Calibration mode on the simulated device: the runtime takes the device's activity records
// (the simulator's counterpart of the CUPTI collector) once per iteration and pfTraceWrite
// writes them in PyTorch-profiler categories, so the trace analyser finds the main job's
// bubbles in PipeFill's own trace.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "analysis/bubbles.hpp"
#include "analysis/chrome_trace.hpp"
#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

struct CalibratedRun {
  analysis::ImportedTrace trace;
  pfStats_t stats{};
};

void run_steps(bool calibration, int steps, CalibratedRun* out) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.enable_cupti = calibration ? 1 : 0;
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);
  CountingJob job;
  job.item_cost_us = 10.0;
  job.items = 1000000;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  for (int i = 0; i < steps; ++i) stage.step(rt, 100.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &out->stats));
  const std::string path = ::testing::TempDir() + "pipefill_calibration_" +
                           (calibration ? "on" : "off") + ".json";
  PF_ASSERT_OK(pfTraceWrite(rt, path.c_str()));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
  ASSERT_EQ(analysis::import_chrome_trace_file(path, {}, &out->trace), pfSuccess)
      << pfGetLastErrorMessage();
  std::remove(path.c_str());
}

size_t count_kind(const analysis::ImportedTrace& trace, ActivityKind kind) {
  size_t n = 0;
  for (const ActivityRecord& r : trace.records) n += r.kind == kind ? 1 : 0;
  return n;
}

TEST(Calibration, TraceCarriesTheMainJobTimelineForTheAnalyser) {
  constexpr int kSteps = 6;
  CalibratedRun run;
  ASSERT_NO_FATAL_FAILURE(run_steps(true, kSteps, &run));
  // One compute kernel and one spinning receive per step, all collected.
  EXPECT_EQ(count_kind(run.trace, ActivityKind::Kernel), static_cast<size_t>(kSteps));
  EXPECT_EQ(count_kind(run.trace, ActivityKind::Comm), static_cast<size_t>(kSteps));

  analysis::AnalysisOptions options;
  options.min_gap_us = 1.0;
  analysis::DeviceAnalysis device;
  ASSERT_EQ(analysis::analyze_device(run.trace.records, 0, options, &device), pfSuccess)
      << pfGetLastErrorMessage();
  EXPECT_FALSE(device.explicit_bubbles);
  EXPECT_EQ(device.compute_kernels, static_cast<size_t>(kSteps));
  // Between consecutive compute kernels the stage waits 100 µs on its receive (the spinning
  // receive kernel runs throughout) while the modelled upstream stage - a stream delay on this
  // device, recorded like a copy - produces the data: a bubble the fill work covered.
  ASSERT_EQ(device.bubbles.size(), static_cast<size_t>(kSteps - 1));
  for (const analysis::Bubble& b : device.bubbles) {
    EXPECT_DOUBLE_EQ(b.duration_us(), 100.0);
    EXPECT_EQ(b.kind, analysis::BubbleKind::Copy);
    EXPECT_DOUBLE_EQ(b.comm_us, 100.0);
    EXPECT_DOUBLE_EQ(b.copy_us, 100.0);
  }
  EXPECT_GT(device.fill_in_bubbles_us, 0.0);
  EXPECT_DOUBLE_EQ(device.fill_outside_bubbles_us, 0.0);
}

TEST(Calibration, OffByDefaultTraceHasOnlyBubblesAndSlices) {
  CalibratedRun run;
  ASSERT_NO_FATAL_FAILURE(run_steps(false, 4, &run));
  EXPECT_EQ(count_kind(run.trace, ActivityKind::Kernel), 0u);
  EXPECT_EQ(count_kind(run.trace, ActivityKind::Comm), 0u);
  EXPECT_GT(run.stats.bubbles, 0u);
}

}  // namespace
}  // namespace pipefill::testing
