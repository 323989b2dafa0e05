// Graph fill jobs (pfJobGraph, pfJobCreateGraph) on the simulated device, through the C API: the
// gate bounds the overrun to one item, every item runs exactly once and in index order across
// bubbles, items run only inside bubbles, the index word holds the item when it runs, and bad
// descriptions are refused with a message naming the field. Expected values are closed forms of
// the bubble and item lengths (one graph instance runs its items one after another).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "graph/graph_job_log.hpp"
#include "runtime/fixtures.hpp"

namespace pipefill::testing {
namespace {

using GraphJobSim = StageRuntimeTest;

TEST_F(GraphJobSim, EarlyBubbleEndCostsAtMostOneItem) {
  constexpr double kItem = 10.0;
  ManualStage base;
  ASSERT_NO_FATAL_FAILURE(base.init());
  GraphJobLog job;
  job.items = 5000;
  job.item_cost_us = kItem;
  pfGraphJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt, &desc, &handle));

  // History: the class learns 100 µs bubbles.
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(stage.step(rt, 100.0), base.step(nullptr, 100.0)) << "bubble " << i;
  }
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  ASSERT_GT(job.runs.size(), 0u) << "a 100 µs bubble with history must be filled";

  // Predicted 100 µs, ends after 55 µs. One instance: items start at 0, 10, .., 50 µs of the
  // bubble (ceil(55/10) = 6 of them); the one started at 50 ends at 60: 5 µs past the end.
  double begin = 0.0;
  PF_ASSERT_OK(pfSimNow(stage.world.get(), &begin));
  const size_t runs_before = job.runs.size();
  const double filled_step = stage.step(rt, 55.0);
  const double base_step = base.step(nullptr, 55.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  const double end = begin + 55.0;
  const std::vector<GraphJobLog::Run> in_step =
      std::vector<GraphJobLog::Run>(job.runs.begin() + static_cast<long>(runs_before), job.runs.end());
  const size_t expected_items = static_cast<size_t>(std::ceil(55.0 / kItem));
  EXPECT_EQ(in_step.size(), expected_items);
  size_t after_end = 0;
  for (const auto& r : in_step) {
    EXPECT_GE(r.end_us - kItem, begin - 1e-9) << "item " << r.item << " started before the bubble";
    EXPECT_LT(r.end_us - kItem, end) << "item " << r.item << " was claimed after the gate closed";
    if (r.end_us > end) ++after_end;
  }
  EXPECT_EQ(after_end, 1u) << "exactly the item running when the gate closed";
  const double expected_overrun = static_cast<double>(expected_items) * kItem - 55.0;
  pfStats_t stats{};
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &stats));
  EXPECT_DOUBLE_EQ(stats.max_overrun_us, expected_overrun);
  EXPECT_LE(stats.max_overrun_us, kItem);
  EXPECT_DOUBLE_EQ(filled_step - base_step, expected_overrun) << "main-job delay = the overrun";
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(job.teardowns, 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(GraphJobSim, EveryItemRunsOnceInIndexOrderAcrossBubbles) {
  GraphJobLog job;
  job.items = 97;
  job.item_cost_us = 7.0;
  pfGraphJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt, &desc, &handle));

  int steps = 0;
  for (; steps < 300 && info_of(handle).status != pfJobCompleted; ++steps) {
    double begin = 0.0;
    PF_ASSERT_OK(pfSimNow(stage.world.get(), &begin));
    const size_t before = job.runs.size();
    const double length = step_varied(stage, rt, steps);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
    // Inside the bubble only, at most one item past its end.
    size_t after_end = 0;
    for (size_t i = before; i < job.runs.size(); ++i) {
      const auto& r = job.runs[i];
      EXPECT_GE(r.end_us - job.item_cost_us, begin - 1e-9) << "step " << steps;
      EXPECT_LT(r.end_us - job.item_cost_us, begin + length) << "step " << steps;
      if (r.end_us > begin + length) ++after_end;
    }
    EXPECT_LE(after_end, 1u) << "step " << steps;
  }
  const pfJobInfo_t info = info_of(handle);
  ASSERT_EQ(info.status, pfJobCompleted) << "after " << steps << " bubbles";
  EXPECT_EQ(info.items_completed, job.items);
  ASSERT_EQ(job.runs.size(), job.items);
  for (uint64_t i = 0; i < job.items; ++i) {
    EXPECT_EQ(job.runs[i].item, i) << "one instance runs the items in index order, once each";
    EXPECT_EQ(job.runs[i].index_word, i) << "the index word holds the item while it runs";
  }
  EXPECT_GT(steps, 3) << "the job must span several bubbles";
  pfStats_t stats{};
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &stats));
  EXPECT_EQ(stats.items_completed, job.items);
  EXPECT_EQ(stats.jobs_completed, 1u);
  EXPECT_EQ(pfJobWait(handle, 0.0), pfSuccess);
  EXPECT_EQ(job.teardowns, 1);
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(job.teardowns, 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(GraphJobSim, BadDescriptionsAreRefusedNamingTheField) {
  GraphJobLog job;
  pfJob_t handle = reinterpret_cast<pfJob_t>(&job);  // must be reset to NULL on failure
  pfGraphJobDesc_t d = job.desc();

  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, nullptr, &handle), pfErrorInvalidArgument, "desc is NULL");
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, nullptr), pfErrorInvalidArgument, "job (output)");
  EXPECT_FAILS_WITH(pfJobCreateGraph(nullptr, &d, &handle), pfErrorInvalidArgument, "");
  d = job.desc();
  d.size = 8;
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "desc->size = 8");
  EXPECT_EQ(handle, nullptr);
  d = job.desc();
  d.item_count = 0;
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "desc->item_count = 0");
  d = job.desc();
  d.item_cost_us = 0.0;
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "desc->item_cost_us = 0");
  d.item_cost_us = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "desc->item_cost_us = nan");
  d.item_cost_us = std::numeric_limits<double>::infinity();
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "desc->item_cost_us = inf");
  d = job.desc();
  d.parallelism = 2;
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "desc->parallelism = 2");
  d = job.desc();
  d.index_word = nullptr;
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "desc->index_word is NULL");
  d = job.desc();
  alignas(8) unsigned char bytes[16] = {};
  d.index_word = reinterpret_cast<uint64_t*>(bytes + 4);
  EXPECT_FAILS_WITH(pfJobCreateGraph(rt, &d, &handle), pfErrorInvalidArgument, "not 8-byte aligned");
  EXPECT_EQ(handle, nullptr);
  // The ticket/opaque entry point refuses the graph kind and points at pfJobCreateGraph.
  pfJobDesc_t ticket = PF_JOB_DESC_INITIALIZER;
  ticket.kind = pfJobGraph;
  ticket.item_count = 1;
  ticket.item_cost_hint_us = 1.0;
  ticket.launch = [](void*, const pfSliceDesc_t*, void*) { return pfSuccess; };
  EXPECT_FAILS_WITH(pfJobCreate(rt, &ticket, &handle), pfErrorInvalidArgument, "pfJobCreateGraph");

  // Failed calls changed nothing: no job is attached, and bubbles stay empty.
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t stats{};
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &stats));
  EXPECT_EQ(stats.slices_launched, 0u);
  EXPECT_TRUE(job.runs.empty());
  // And a valid description still works.
  d = job.desc();
  PF_ASSERT_OK(pfJobCreateGraph(rt, &d, &handle));
  EXPECT_NE(handle, nullptr);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(GraphJobSim, CaptureStreamIsAnOrdinaryStreamOfTheDevice) {
  EXPECT_FAILS_WITH(pfGraphCaptureStreamCreate(rt, nullptr), pfErrorInvalidArgument,
                    "stream (output) is NULL");
  void* capture = nullptr;
  PF_ASSERT_OK(pfGraphCaptureStreamCreate(rt, &capture));
  ASSERT_NE(capture, nullptr);
  PF_ASSERT_OK(pfSimLaunchKernel(capture, 5.0, 1));
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfStreamDestroy(rt, capture));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
