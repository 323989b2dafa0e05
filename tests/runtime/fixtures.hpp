// Shared helpers of the runtime tests: simulated worlds, runtimes and a counting ticket job.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipefill/pipefill.h"
#include "sim/sim_pipeline.hpp"
#include "sim/sim_world.hpp"
#include "support/api_checks.hpp"

namespace pipefill::testing {

// A ticket fill job on the simulated device counting how often each item ran.
struct CountingJob {
  std::string name = "infer";
  double item_cost_us = 10.0;
  uint64_t items = 1000;
  int parallelism = 0;  // 0: every fill SM
  int priority = 0;
  int kind = pfJobTicket;
  size_t resident_bytes = 0;
  std::vector<uint32_t> runs;  // per item
  int launches = 0;            // launches of bubble slices (max_items >= 1)
  int warm_ups = 0;            // empty warm-up launches from pfJobCreate (max_items == 0)
  int fail_warm_up = 0;        // non-zero: warm-up launches return this result
  int setups = 0;
  int teardowns = 0;
  int fail_launch_at = -1;     // launch number that returns pfErrorJobFailed

  static pfResult_t setup(void* user, const pfArenaAllocator_t* allocator, int) {
    auto* self = static_cast<CountingJob*>(user);
    ++self->setups;
    if (self->resident_bytes > 0) {
      void* p = nullptr;
      return allocator->allocate(allocator->context, self->resident_bytes, 256, &p);
    }
    return pfSuccess;
  }
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<CountingJob*>(user);
    if (slice->max_items == 0) {
      // pfJobCreate's warm-up: a real job loads its kernels here; nothing to enqueue.
      ++self->warm_ups;
      return static_cast<pfResult_t>(self->fail_warm_up);
    }
    if (self->launches++ == self->fail_launch_at) return pfErrorJobFailed;
    if (self->kind == pfJobOpaque) {
      return pfSimLaunchOpaque(stream, slice->first_item_hint, slice->max_items,
                               slice->max_blocks, self->item_cost_us, &on_item, self);
    }
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, self->item_cost_us,
                                   &on_item, self);
  }
  static void teardown(void* user) { ++static_cast<CountingJob*>(user)->teardowns; }
  static void on_item(void* user, uint64_t item) {
    auto* self = static_cast<CountingJob*>(user);
    if (item < self->runs.size()) ++self->runs[item];
  }

  pfJobDesc_t desc() {
    runs.assign(items, 0);
    pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
    d.name = name.c_str();
    d.kind = kind;
    d.priority = priority;
    d.item_count = items;
    d.resident_bytes = resident_bytes;
    d.item_cost_hint_us = item_cost_us;
    d.user = this;
    d.setup = &setup;
    d.launch = &launch;
    d.teardown = &teardown;
    return d;
  }
  bool every_item_once() const {
    for (uint32_t r : runs) {
      if (r != 1) return false;
    }
    return true;
  }
  uint64_t items_run() const {
    uint64_t n = 0;
    for (uint32_t r : runs) n += r;
    return n;
  }
};

struct WorldDeleter {
  void operator()(pfSimWorld_t w) const {
    if (w != nullptr) pfSimWorldDestroy(w);
  }
};
using WorldPtr = std::unique_ptr<pfSimWorld, WorldDeleter>;

// Interference off: these tests compute exact times (the calibrated model is tested in tests/sim).
inline WorldPtr make_world(int devices, int sms, uint64_t seed = 1, double jitter = 0.0) {
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  desc.sm_count = sms;
  desc.jitter_fraction = jitter;
  pfSimWorld_t w = nullptr;
  EXPECT_EQ(pfSimWorldCreate(devices, &desc, seed, &w), pfSuccess) << pfGetLastErrorMessage();
  return WorldPtr(w);
}

// A runtime on device `device` of `world`, margins off (exact fill on a jitter-free sim).
// A ticket job of one configuration on `workers` fill SMs that keeps every slice it was given
// (what each bubble was planned: class margins, early closes) and counts each item's runs.
struct SliceRecordingJob {
  CountingJob counting;
  pfJobConfig_t config{};
  std::vector<pfSliceDesc_t> slices;

  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<SliceRecordingJob*>(user);
    if (slice->max_items > 0) self->slices.push_back(*slice);
    return CountingJob::launch(&self->counting, slice, stream);
  }
  pfJobDesc_t desc(double item_cost_us, int workers, uint64_t items = uint64_t{1} << 20) {
    counting.name = "ticket";
    counting.kind = pfJobTicket;
    counting.item_cost_us = item_cost_us;
    counting.items = items;
    counting.runs.assign(items, 0);
    pfJobDesc_t d = counting.desc();
    config.name = "ticket";
    config.item_cost_us = item_cost_us;
    config.parallelism = workers;
    d.configs = &config;
    d.config_count = 1;
    d.user = this;
    d.launch = &launch;
    return d;
  }
  uint64_t items_run() const {
    uint64_t total = 0;
    for (uint32_t runs : counting.runs) total += runs;
    return total;
  }
};

inline pfConfig_t sim_config(pfSimWorld_t world, int device, int stages, int reserved_sms) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendSim;
  c.sim_world = world;
  c.device = device;
  c.stage_id = device;
  c.stage_count = stages;
  c.reserved_sms = reserved_sms;
  c.safety_margin_us = 0.0;
  c.safety_margin_fraction = 0.0;
  c.arena_bytes = size_t{64} << 20;
  c.log_level = pfLogWarn;
  return c;
}

// A 1F1B pipeline spec with round durations (bubbles are whole multiples of 10 µs).
inline schedule::ScheduleSpec one_f_one_b(int stages, int microbatches) {
  schedule::ScheduleSpec spec;
  spec.kind = schedule::ScheduleKind::OneFOneB;
  spec.stages = stages;
  spec.microbatches = microbatches;
  schedule::StageCosts costs;
  costs.forward_us = 100.0;
  costs.backward_us = 200.0;
  spec.costs.assign(static_cast<size_t>(stages), costs);
  return spec;
}

}  // namespace pipefill::testing

namespace pipefill::testing {

// One simulated GPU driven by hand: each "step" is a bubble of a chosen length on the main
// stream (a recv wait for a peer stream's delay) followed by a compute kernel on every SM.
struct ManualStage {
  WorldPtr world;
  void* main = nullptr;
  void* peer = nullptr;
  pfSimEvent_t ready = nullptr;
  pfSimEvent_t done = nullptr;
  int sms = 32;
  int comm_sms = 4;
  double compute_us = 50.0;

  void init(int sm_count = 32) {
    sms = sm_count;
    world = make_world(1, sms);
    ASSERT_EQ(pfSimStreamCreate(world.get(), 0, sim::kHighestPriority, &main), pfSuccess);
    ASSERT_EQ(pfSimStreamCreate(world.get(), 0, sim::kHighestPriority, &peer), pfSuccess);
    ASSERT_EQ(pfSimEventCreate(world.get(), &ready), pfSuccess);
    ASSERT_EQ(pfSimEventCreate(world.get(), &done), pfSuccess);
  }

  // Enqueues one bubble of `bubble_us` (marked on `rt` when non-null) and a compute kernel,
  // runs the world and returns the step's duration (bubble + compute + any delay).
  double step(pfRuntime_t rt, double bubble_us, const pfBubbleHint_t* hint = nullptr,
              bool iteration_end = true) {
    double start = 0.0, end = 0.0;
    EXPECT_EQ(pfSimNow(world.get(), &start), pfSuccess);
    EXPECT_EQ(pfSimStreamDelay(peer, bubble_us), pfSuccess);
    EXPECT_EQ(pfSimEventRecord(ready, peer), pfSuccess);
    if (rt != nullptr) EXPECT_EQ(pfBubbleBegin(rt, main, hint), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfSimStreamWaitEvent(main, ready, 0.0, comm_sms), pfSuccess);
    if (rt != nullptr) EXPECT_EQ(pfBubbleEnd(rt, main), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfSimLaunchKernel(main, compute_us, sms), pfSuccess);
    EXPECT_EQ(pfSimEventRecord(done, main), pfSuccess);
    if (rt != nullptr && iteration_end) EXPECT_EQ(pfIterationEnd(rt), pfSuccess);
    EXPECT_EQ(pfSimRunUntilIdle(world.get()), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfSimEventTime(done, &end), pfSuccess);
    return end - start;
  }

  pfRuntime_t runtime(pfConfig_t* overrides = nullptr) {
    pfConfig_t c = overrides != nullptr ? *overrides : sim_config(world.get(), 0, 1, comm_sms);
    c.sim_world = world.get();
    pfRuntime_t rt = nullptr;
    EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfSuccess) << pfGetLastErrorMessage();
    return rt;
  }
};

inline pfJobInfo_t info_of(pfJob_t job) {
  pfJobInfo_t info{};
  EXPECT_EQ(pfJobGetStatus(job, &info), pfSuccess);
  return info;
}

// A fixture with a hand-driven stage and a runtime on it (the stage's default config). A test
// destroys the runtime itself, checking the result, as the C API's user does.
class StageRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(stage.init());
    rt = stage.runtime();
    ASSERT_NE(rt, nullptr);
  }

  ManualStage stage;
  pfRuntime_t rt = nullptr;
};

// Test names of a suite parameterised on the message path (true: executor thread).
inline std::string message_path_name(const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "ExecutorThread" : "PreRunHook";
}

// Creates `job` on `rt` (its description as set so far); nullptr, and a test failure, if refused.
inline pfJob_t create_job(pfRuntime_t rt, CountingJob& job) {
  const pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  EXPECT_EQ(pfJobCreate(rt, &desc, &handle), pfSuccess) << pfGetLastErrorMessage();
  return handle;
}

// Steps `stage` (bubbles of `bubble_us`, announced by `hint`) and harvests after each step, until
// `job` completed or `max_steps` steps ran; returns the steps taken. The caller checks the end.
inline int step_until_completed(ManualStage& stage, pfRuntime_t rt, pfJob_t job, double bubble_us,
                                const pfBubbleHint_t* hint, int max_steps = 20) {
  int steps = 0;
  for (; steps < max_steps && info_of(job).status != pfJobCompleted; ++steps) {
    stage.step(rt, bubble_us, hint);
    EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
  }
  return steps;
}

// Bubble lengths that are multiples neither of one another nor of the test jobs' item costs,
// cycled through by the tests that drive a job across bubbles of varied length.
inline constexpr double kVariedBubblesUs[] = {100.0, 37.0, 64.0, 55.0, 120.0};

// Step `index` of such a run: a bubble of kVariedBubblesUs[index % 5] announced by its hint (so
// planned from the hint: every bubble is filled). Returns the bubble's length.
inline double step_varied(ManualStage& stage, pfRuntime_t rt, int index) {
  const double length = kVariedBubblesUs[index % 5];
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = length;
  stage.step(rt, length, &hint);
  return length;
}


}  // namespace pipefill::testing
