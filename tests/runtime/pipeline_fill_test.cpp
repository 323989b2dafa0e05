// End-to-end: a simulated 4-stage 1F1B pipeline (8 micro-batches) with one inference fill job
// per stage, against the same pipeline without filling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "analysis/activity.hpp"
#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

constexpr int kStages = 4;
constexpr int kSms = 32;
constexpr int kCommSms = 4;
constexpr int kIterations = 6;
constexpr int kWarmupIterations = 2;
constexpr double kItemCost = 10.0;

struct PipelineRun {
  WorldPtr world;
  std::vector<pfRuntime_t> runtimes;
  std::vector<std::unique_ptr<CountingJob>> jobs;
  std::vector<pfJob_t> handles;
  std::unique_ptr<sim::Pipeline> pipeline;
  std::vector<sim::IterationResult> iterations;
  std::vector<pfStats_t> stats_after_warmup;

  void destroy() {
    for (pfJob_t j : handles) EXPECT_EQ(pfJobDestroy(j), pfSuccess) << pfGetLastErrorMessage();
    for (pfRuntime_t rt : runtimes) {
      EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess) << pfGetLastErrorMessage();
    }
    handles.clear();
    runtimes.clear();
    pipeline.reset();
  }
};

void run_pipeline(bool fill, PipelineRun* run) {
  run->world = make_world(kStages, kSms);
  sim::PipelineOptions options;
  options.spec = one_f_one_b(kStages, 8);
  options.comm_sms = kCommSms;
  if (fill) {
    for (int s = 0; s < kStages; ++s) {
      pfConfig_t config = sim_config(run->world.get(), s, kStages, kCommSms);
      pfRuntime_t rt = nullptr;
      PF_ASSERT_OK(pfRuntimeCreate(&config, &rt));
      run->runtimes.push_back(rt);
      auto job = std::make_unique<CountingJob>();
      job->item_cost_us = kItemCost;
      job->items = 1u << 20;  // never finishes in this run
      pfJobDesc_t desc = job->desc();
      pfJob_t handle = nullptr;
      PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
      run->handles.push_back(handle);
      run->jobs.push_back(std::move(job));
    }
    options.runtimes = run->runtimes;
  }
  PF_ASSERT_OK(sim::Pipeline::create(run->world.get(), options, &run->pipeline));
  PF_ASSERT_OK(run->pipeline->run(kWarmupIterations, &run->iterations));
  for (pfRuntime_t rt : run->runtimes) {
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
    pfStats_t s;
    PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
    run->stats_after_warmup.push_back(s);
  }
  PF_ASSERT_OK(run->pipeline->run(kIterations - kWarmupIterations, &run->iterations));
  for (pfRuntime_t rt : run->runtimes) PF_ASSERT_OK(pfRuntimeSynchronize(rt));
}

TEST(PipelineFill, FillsBubblesWithoutSlowingTheMainJob) {
  PipelineRun base, filled;
  ASSERT_NO_FATAL_FAILURE(run_pipeline(false, &base));
  ASSERT_NO_FATAL_FAILURE(run_pipeline(true, &filled));
  ASSERT_EQ(base.iterations.size(), static_cast<size_t>(kIterations));
  ASSERT_EQ(filled.iterations.size(), static_cast<size_t>(kIterations));

  // Main-job iteration time within 0.5% of the same run without filling, every iteration.
  for (int i = 0; i < kIterations; ++i) {
    const double b = base.iterations[static_cast<size_t>(i)].duration_us();
    const double f = filled.iterations[static_cast<size_t>(i)].duration_us();
    EXPECT_GT(b, 0.0);
    EXPECT_LE(std::abs(f - b), 0.005 * b) << "iteration " << i << ": " << f << " vs " << b;
  }

  // Fill work runs only inside bubbles (up to one item of overrun).
  const auto& windows = filled.pipeline->bubbles();
  sim::World* world = sim::world_from_handle(filled.world.get());
  size_t fill_records = 0;
  for (int s = 0; s < kStages; ++s) {
    for (const ActivityRecord& a : world->activities(s)) {
      if (a.kind != ActivityKind::Fill) continue;
      ++fill_records;
      const bool inside = std::any_of(windows.begin(), windows.end(), [&](const sim::BubbleWindow& w) {
        return w.stage == s && a.start_us >= w.begin_us - 1e-9 &&
               a.end_us <= w.end_us + kItemCost + 1e-9;
      });
      EXPECT_TRUE(inside) << "stage " << s << " fill [" << a.start_us << ", " << a.end_us
                          << "] outside every bubble";
    }
  }
  EXPECT_GT(fill_records, 0u);

  // After warm-up, >= 90% of the bubble time is filled - measured independently of the runtime:
  // the union of the simulator's fill activity records (first item start to last item end of
  // each fill kernel) intersected with the pipeline's bubble windows.
  const uint64_t first_measured = kWarmupIterations;
  for (int s = 0; s < kStages; ++s) {
    std::vector<std::pair<double, double>> fills;
    for (const ActivityRecord& a : world->activities(s)) {
      if (a.kind == ActivityKind::Fill) fills.emplace_back(a.start_us, a.end_us);
    }
    std::sort(fills.begin(), fills.end());
    double bubble_time = 0.0, covered = 0.0;
    for (const sim::BubbleWindow& w : windows) {
      if (w.stage != s || w.iteration < first_measured) continue;
      bubble_time += w.end_us - w.begin_us;
      double cursor = w.begin_us;  // covered up to here (the union, without double counting)
      for (const auto& [start, end] : fills) {
        const double from = std::max(start, cursor), to = std::min(end, w.end_us);
        if (to > from) {
          covered += to - from;
          cursor = to;
        }
      }
    }
    ASSERT_GT(bubble_time, 0.0);
    EXPECT_GE(covered / bubble_time, 0.90) << "stage " << s << ": " << covered << " of "
                                           << bubble_time << " us filled";
    // The runtime measured the same bubble time the pipeline produced.
    pfStats_t end;
    PF_ASSERT_OK(pfRuntimeGetStats(filled.runtimes[static_cast<size_t>(s)], &end));
    const pfStats_t& warm = filled.stats_after_warmup[static_cast<size_t>(s)];
    EXPECT_NEAR(end.bubble_time_us - warm.bubble_time_us, bubble_time, 1e-6 * bubble_time)
        << "stage " << s;
  }
  // Every bubble after warm-up was filled, per the runtime's counters.
  for (int s = 0; s < kStages; ++s) {
    pfStats_t end;
    PF_ASSERT_OK(pfRuntimeGetStats(filled.runtimes[static_cast<size_t>(s)], &end));
    const pfStats_t& warm = filled.stats_after_warmup[static_cast<size_t>(s)];
    EXPECT_EQ(warm.bubbles_filled, 0u) << "no history yet in the first two iterations";
    EXPECT_EQ(end.bubbles_filled - warm.bubbles_filled, end.bubbles - warm.bubbles);
    EXPECT_EQ(end.iterations, static_cast<uint64_t>(kIterations));
    EXPECT_LE(end.max_overrun_us, kItemCost);
    EXPECT_EQ(end.items_completed, filled.jobs[static_cast<size_t>(s)]->items_run());
    EXPECT_TRUE(std::all_of(filled.jobs[static_cast<size_t>(s)]->runs.begin(),
                            filled.jobs[static_cast<size_t>(s)]->runs.end(),
                            [](uint32_t r) { return r <= 1; }));
  }
  filled.destroy();
}

}  // namespace
}  // namespace pipefill::testing
