// Cross-checks on a simulated 4-stage 1F1B pipeline (no jitter, so every figure is exact):
//  - the analyser's gaps in the sim's activity log are exactly the pipeline's bubble windows;
//  - with PipeFill filling the bubbles, main-job kernels keep their durations (slowdown 1.0),
//    fill covers the bubbles and the start delay stays within one item;
//  - the runtime's own trace (pfTraceWrite), imported, gives the bubbles its stats count, and
//    the iterations the run had.
//  - with ungated fill beside the main job, kernels are slowed only on a device with interference.
#include <gtest/gtest.h>

#include <cstdio>  // std::remove
#include <memory>
#include <string>
#include <vector>

#include "analysis/bubbles.hpp"
#include "analysis/chrome_trace.hpp"
#include "analysis/interference.hpp"
#include "common/error.hpp"
#include "pipefill/pipefill.h"
#include "sim/sim_pipeline.hpp"
#include "sim/sim_world.hpp"

namespace pipefill::analysis {
namespace {

constexpr int kStages = 4;
constexpr int kSms = 32;
constexpr int kIterations = 3;
constexpr int kStage = 1;  // the stage under study (device 1)
constexpr double kItemCostUs = 10.0;  // bubbles are multiples of 10 us: items fit exactly

#define PF_ASSERT_OK(expr)                                                   \
  do {                                                                       \
    const pfResult_t pf_r_ = (expr);                                         \
    ASSERT_EQ(pf_r_, pfSuccess) << #expr << ": " << pfGetLastErrorMessage(); \
  } while (0)

struct WorldCloser {
  void operator()(pfSimWorld* w) const { pfSimWorldDestroy(w); }
};

schedule::ScheduleSpec spec() {
  schedule::ScheduleSpec s;
  s.kind = schedule::ScheduleKind::OneFOneB;
  s.stages = kStages;
  s.microbatches = 8;
  schedule::StageCosts costs;
  costs.forward_us = 100.0;
  costs.backward_us = 200.0;
  s.costs.assign(kStages, costs);
  return s;
}

// A ticket job with plenty of items on the simulated device.
struct EndlessJob {
  double item_cost_us = kItemCostUs;
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    const double cost = static_cast<EndlessJob*>(user)->item_cost_us;
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, cost, nullptr, nullptr);
  }
  pfJobDesc_t desc() {
    pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
    d.name = "infer";
    d.kind = pfJobTicket;
    d.item_count = uint64_t{1} << 30;
    d.item_cost_hint_us = item_cost_us;
    d.user = this;
    d.launch = &launch;
    return d;
  }
};



struct SimRun {
  std::vector<ActivityRecord> activities;       // device kStage
  std::vector<sim::BubbleWindow> windows;       // stage kStage
  pfStats_t stats{};
  std::string trace_path;
};

void run_pipeline(bool fill, const std::string& trace_path, SimRun* out,
                  int iterations = kIterations) {
  // Interference off: the test below expects the fill not to slow the main kernels at all.
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  desc.sm_count = kSms;
  pfSimWorld_t raw = nullptr;
  PF_ASSERT_OK(pfSimWorldCreate(kStages, &desc, 1, &raw));
  std::unique_ptr<pfSimWorld, WorldCloser> world(raw);

  std::vector<pfRuntime_t> runtimes;
  std::vector<pfJob_t> jobs;
  std::vector<std::unique_ptr<EndlessJob>> job_state;
  if (fill) {
    for (int s = 0; s < kStages; ++s) {
      pfConfig_t c = PF_CONFIG_INITIALIZER;
      c.backend = pfBackendSim;
      c.sim_world = raw;
      c.device = s;
      c.stage_id = s;
      c.stage_count = kStages;
      c.reserved_sms = 4;
      c.safety_margin_us = 0.0;
      c.safety_margin_fraction = 0.0;
      c.arena_bytes = size_t{64} << 20;
      pfRuntime_t rt = nullptr;
      PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
      runtimes.push_back(rt);
      job_state.push_back(std::make_unique<EndlessJob>());
      const pfJobDesc_t d = job_state.back()->desc();
      pfJob_t job = nullptr;
      PF_ASSERT_OK(pfJobCreate(rt, &d, &job));
      jobs.push_back(job);
    }
  }
  sim::PipelineOptions options;
  options.spec = spec();
  options.comm_sms = 4;
  options.hint_expected_durations = true;  // fill from the first iteration on
  options.runtimes = runtimes;
  std::unique_ptr<sim::Pipeline> pipeline;
  PF_ASSERT_OK(sim::Pipeline::create(raw, options, &pipeline));
  PF_ASSERT_OK(pipeline->run(iterations, nullptr));
  for (const sim::BubbleWindow& w : pipeline->bubbles()) {
    if (w.stage == kStage) out->windows.push_back(w);
  }
  if (fill) {
    for (pfRuntime_t rt : runtimes) PF_ASSERT_OK(pfRuntimeSynchronize(rt));
    PF_ASSERT_OK(pfRuntimeGetStats(runtimes[kStage], &out->stats));
    out->trace_path = trace_path;
    PF_ASSERT_OK(pfTraceWrite(runtimes[kStage], trace_path.c_str()));
  }
  out->activities = sim::world_from_handle(raw)->activities(kStage);
  for (pfJob_t job : jobs) PF_ASSERT_OK(pfJobDestroy(job));
  pipeline.reset();
  for (pfRuntime_t rt : runtimes) PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

AnalysisOptions exact_options() {
  AnalysisOptions o;
  o.min_gap_us = 1.0;  // every bubble of the schedule is a multiple of 10 us
  return o;
}

TEST(AnalyzerOnSimPipeline, GapsAreExactlyThePipelineBubbles) {
  SimRun base;
  ASSERT_NO_FATAL_FAILURE(run_pipeline(false, "", &base));
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(base.activities, kStage, exact_options(), &a), pfSuccess)
      << last_error_message();
  std::vector<sim::BubbleWindow> windows;
  for (const sim::BubbleWindow& w : base.windows) {
    if (w.end_us > w.begin_us) windows.push_back(w);  // empty windows are no gap
  }
  // Windows that touch (one wait after another) are one gap in compute.
  std::vector<std::pair<double, double>> merged;
  for (const sim::BubbleWindow& w : windows) {
    if (!merged.empty() && w.begin_us <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, w.end_us);
    } else {
      merged.emplace_back(w.begin_us, w.end_us);
    }
  }
  // The trace's edges are no bubble: drop a window before the first kernel / after the last.
  std::erase_if(merged, [&](const auto& m) {
    return m.second <= a.span_start_us || m.first >= a.span_end_us;
  });
  ASSERT_EQ(a.bubbles.size(), merged.size());
  for (size_t i = 0; i < merged.size(); ++i) {
    EXPECT_DOUBLE_EQ(a.bubbles[i].start_us, merged[i].first) << i;
    EXPECT_DOUBLE_EQ(a.bubbles[i].end_us, merged[i].second) << i;
  }
  EXPECT_GT(a.bubbles.size(), 2u * kIterations);
}

TEST(AnalyzerOnSimPipeline, FillingKeepsKernelDurationsAndCoversTheBubbles) {
  SimRun base, filled;
  ASSERT_NO_FATAL_FAILURE(run_pipeline(false, "", &base));
  const std::string trace = ::testing::TempDir() + "pipefill_analysis_stage1.json";
  ASSERT_NO_FATAL_FAILURE(run_pipeline(true, trace, &filled));

  InterferenceAnalysis i;
  ASSERT_EQ(compare_traces(base.activities, filled.activities, kStage, exact_options(), &i),
            pfSuccess)
      << last_error_message();
  EXPECT_EQ(i.matched_kernels, i.baseline_kernels);
  EXPECT_EQ(i.filled_kernels, i.baseline_kernels);
  EXPECT_DOUBLE_EQ(i.compute_slowdown, 1.0);  // the sim's interference factor is 0
  EXPECT_GT(i.fill_in_bubbles_us, 0.0);
  EXPECT_LE(i.filled_start_delay.max, kItemCostUs + 1e-9);  // overrun: at most one item

  DeviceAnalysis f;
  ASSERT_EQ(analyze_device(filled.activities, kStage, exact_options(), &f), pfSuccess);
  // The design's target: >= 90% of bubble time doing fill work.
  EXPECT_GE(f.fill_in_bubbles_us, 0.9 * f.bubble_us);
  EXPECT_GT(f.fill_kernels, 0u);
  // Fill alongside the main job's compute is what the runtime calls overrun.
  EXPECT_NEAR(f.fill_outside_bubbles_us, filled.stats.overrun_time_us, 1e-6);

  // The runtime's own trace: its bubble markers are the bubbles it harvested.
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace_file(trace, ImportOptions{}, &t), pfSuccess) << last_error_message();
  EXPECT_EQ(analysable_devices(t.records), std::vector<int>{kStage});  // pid = stage id
  DeviceAnalysis e;
  ASSERT_EQ(analyze_device(t.records, kStage, AnalysisOptions{}, &e), pfSuccess)
      << last_error_message();
  EXPECT_TRUE(e.explicit_bubbles);
  EXPECT_EQ(e.bubbles.size(), filled.stats.bubbles);
  EXPECT_NEAR(e.bubble_us, filled.stats.bubble_time_us, 1e-3 * e.bubbles.size());
  EXPECT_GT(e.fill_in_bubbles_us, 0.0);
  // One job: the union of its slices inside bubbles is the runtime's filled time, and what
  // ran past the bubble ends its overrun.
  EXPECT_NEAR(e.fill_in_bubbles_us, filled.stats.filled_time_us, 1e-3 * e.bubbles.size());
  EXPECT_NEAR(e.fill_outside_bubbles_us, filled.stats.overrun_time_us, 1e-3 * e.bubbles.size());
  // Classes are the runtime's class keys ("#k": k-th bubble of the iteration).
  ASSERT_FALSE(e.classes.empty());
  EXPECT_EQ(e.classes[0].label, "#0");
  EXPECT_EQ(e.classes[0].duration.count, static_cast<size_t>(kIterations));
  std::remove(trace.c_str());
}

// The iterations of a run are read back from the runtime's own trace: N iterations run, N
// iterations analysed (the trace's iteration marks), each with its share of the bubbles.
TEST(AnalyzerOnSimPipeline, RuntimeTraceGivesTheRunsIterations) {
  constexpr int kRunIterations = 10;
  SimRun filled;
  const std::string trace = ::testing::TempDir() + "pipefill_analysis_iterations.json";
  ASSERT_NO_FATAL_FAILURE(run_pipeline(true, trace, &filled, kRunIterations));
  ASSERT_EQ(filled.stats.iterations, static_cast<uint64_t>(kRunIterations));
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace_file(trace, ImportOptions{}, &t), pfSuccess) << last_error_message();
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(t.records, kStage, AnalysisOptions{}, &a), pfSuccess)
      << last_error_message();
  EXPECT_EQ(a.iteration_source, IterationSource::Markers);
  ASSERT_EQ(a.iterations.size(), static_cast<size_t>(kRunIterations));
  ASSERT_EQ(a.bubbles.size(), filled.stats.bubbles);
  // Every iteration of a 1F1B stage has the same bubbles, so each gets 1/N of them.
  for (size_t k = 0; k < a.iterations.size(); ++k) {
    EXPECT_EQ(a.iterations[k].bubble_count * kRunIterations, static_cast<int>(a.bubbles.size()))
        << "iteration " << k;
    EXPECT_EQ(a.iterations[k].label, "ProfilerStep#" + std::to_string(k));
  }
  std::remove(trace.c_str());
}

// Two main-job kernels on half the SMs with ungated fill work on the other half that outlasts
// the first kernel: the analyser sees the main kernels slowed exactly when the simulated device
// slows co-running kernels (by at most 1 + interference x fill share of the SMs).
std::vector<ActivityRecord> co_running(double interference, bool with_fill) {
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;  // only beta below
  desc.sm_count = kSms;
  desc.interference = interference;
  pfSimWorld_t raw = nullptr;
  EXPECT_EQ(pfSimWorldCreate(1, &desc, 1, &raw), pfSuccess) << pfGetLastErrorMessage();
  std::unique_ptr<pfSimWorld, WorldCloser> world(raw);
  void* main_stream = nullptr;
  void* fill_stream = nullptr;
  EXPECT_EQ(pfSimStreamCreate(raw, 0, -1, &main_stream), pfSuccess);
  EXPECT_EQ(pfSimStreamCreate(raw, 0, 0, &fill_stream), pfSuccess);
  if (with_fill) {
    EXPECT_EQ(pfSimLaunchOpaque(fill_stream, 0, kSms / 2, kSms / 2, 150.0, nullptr, nullptr),
              pfSuccess)
        << pfGetLastErrorMessage();
  }
  EXPECT_EQ(pfSimLaunchKernel(main_stream, 100.0, kSms / 2), pfSuccess);
  EXPECT_EQ(pfSimLaunchKernel(main_stream, 100.0, kSms / 2), pfSuccess);
  EXPECT_EQ(pfSimRunUntilIdle(raw), pfSuccess) << pfGetLastErrorMessage();
  return sim::world_from_handle(raw)->activities(0);
}

TEST(AnalyzerOnSim, DetectsInterferenceOnlyWhenTheDeviceHasIt) {
  const auto baseline = co_running(0.5, false);
  const auto calm = co_running(0.0, true);
  const auto slowed = co_running(0.5, true);
  InterferenceAnalysis without, with;
  ASSERT_EQ(compare_traces(baseline, calm, 0, exact_options(), &without), pfSuccess)
      << last_error_message();
  ASSERT_EQ(compare_traces(baseline, slowed, 0, exact_options(), &with), pfSuccess)
      << last_error_message();
  EXPECT_EQ(with.matched_kernels, 2u);
  EXPECT_DOUBLE_EQ(without.compute_baseline_us, 200.0);
  EXPECT_DOUBLE_EQ(without.compute_slowdown, 1.0);
  EXPECT_GT(with.compute_slowdown, 1.0);
  EXPECT_LE(with.compute_slowdown, 1.0 + 0.5 * 0.5 + 1e-12);
  ASSERT_FALSE(with.kernels.empty());
  EXPECT_GT(with.kernels[0].slowdown(), 1.0);

  // The fill ran alongside the main job's compute, not in a bubble.
  DeviceAnalysis f;
  ASSERT_EQ(analyze_device(slowed, 0, exact_options(), &f), pfSuccess);
  EXPECT_EQ(f.fill_kernels, 1u);
  EXPECT_DOUBLE_EQ(f.fill_in_bubbles_us, 0.0);
  EXPECT_GT(f.fill_outside_bubbles_us, 0.0);
}

}  // namespace
}  // namespace pipefill::analysis
