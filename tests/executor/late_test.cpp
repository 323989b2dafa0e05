// The executor under real asynchrony. On a GPU the executor handles a bubble's begin late (the
// CPU enqueued the bubble long before the device reached it, or the device reached it before the
// executor woke up). Here the simulated device's clock is hidden from the runtime, so the
// executor thread runs truly asynchronously against the world, and a latch in a launch callback
// holds the executor while the test runs the world - the bubble begins, or ends, before the
// executor has enqueued its fill work. Also: a device call failing after a launch callback ran
// must keep the slice's resources until its kernel is known to be done. Runs under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/test_device.hpp"

namespace pipefill::testing {
namespace {

struct Launch {
  uint64_t bubble_id;
  uint64_t max_items;
  uintptr_t workspace;
  size_t workspace_bytes;
};

// A job whose launches are recorded; the first launch of a latched job blocks on `latch`.
struct RecordingJob {
  CountingJob counting;
  Latch* latch = nullptr;
  std::mutex mutex;
  std::vector<Launch> launches;

  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<RecordingJob*>(user);
    {
      std::lock_guard lock(self->mutex);
      self->launches.push_back(Launch{slice->bubble_id, slice->max_items,
                                      reinterpret_cast<uintptr_t>(slice->workspace),
                                      slice->workspace_bytes});
    }
    if (self->latch != nullptr) self->latch->pass();
    return CountingJob::launch(&self->counting, slice, stream);
  }
  pfJobDesc_t desc() {
    pfJobDesc_t d = counting.desc();
    d.user = this;
    d.launch = &launch;
    d.setup = nullptr;
    d.teardown = nullptr;
    return d;
  }
  std::vector<Launch> launches_of(uint64_t bubble) {
    std::lock_guard lock(mutex);
    std::vector<Launch> out;
    for (const Launch& l : launches) {
      if (l.bubble_id == bubble) out.push_back(l);
    }
    return out;
  }
};

// One simulated GPU whose clock the runtime does not drive: the test runs the world.
struct AsyncStage {
  ManualStage stage;
  TestDevice* device = nullptr;
  core::Runtime* core = nullptr;
  pfRuntime_t rt = nullptr;

  void init() {
    stage.init(32);
    rt = make_test_runtime(stage.world.get(), sim_config(stage.world.get(), 0, 1, 4), &device,
                           /*hide_driven_clock=*/true, /*executor_thread=*/true, &core);
    ASSERT_NE(rt, nullptr);
  }
  // Enqueues a 100 µs bubble and a 50 µs compute kernel on every SM; returns the virtual time
  // the bubble begins at (the world's now: the main stream is idle).
  double enqueue_step() {
    double now = 0.0;
    EXPECT_EQ(pfSimNow(stage.world.get(), &now), pfSuccess);
    EXPECT_EQ(pfSimStreamDelay(stage.peer, 100.0), pfSuccess);
    EXPECT_EQ(pfSimEventRecord(stage.ready, stage.peer), pfSuccess);
    EXPECT_EQ(pfBubbleBegin(rt, stage.main, nullptr), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms), pfSuccess);
    EXPECT_EQ(pfBubbleEnd(rt, stage.main), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfSimLaunchKernel(stage.main, 50.0, stage.sms), pfSuccess);
    EXPECT_EQ(pfSimEventRecord(stage.done, stage.main), pfSuccess);
    EXPECT_EQ(pfIterationEnd(rt), pfSuccess);
    return now;
  }
  double finish_step(double start) {
    EXPECT_EQ(pfSimRunUntilIdle(stage.world.get()), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
    double end = 0.0;
    EXPECT_EQ(pfSimEventTime(stage.done, &end), pfSuccess);
    return end - start;
  }
  // Two bubbles give the class its measured history (100 µs); nothing is filled in them.
  void history() {
    for (int i = 0; i < 2; ++i) {
      const double start = enqueue_step();
      // The executor may handle the begin before or after the world ran: nothing to fill yet.
      EXPECT_DOUBLE_EQ(finish_step(start), 150.0);
    }
  }
};

// A ticket job T (28 items: one 10 µs round on the 28 fill SMs) is planned first and its launch
// is held while the world runs the whole bubble. T's slice then reaches the fill stream after the
// bubble ended: its blocks find the gate closed and run no item, accounted as neither fill nor
// overrun. The opaque job O planned after it must not be launched at all: nothing would stop it.
TEST(LateExecutor, NoOpaqueSliceOnceTheBubbleEnded) {
  AsyncStage s;
  ASSERT_NO_FATAL_FAILURE(s.init());
  Latch latch;
  RecordingJob ticket, opaque;
  ticket.counting.name = "ticket";
  ticket.counting.items = 28;
  ticket.latch = &latch;
  opaque.counting.name = "opaque";
  opaque.counting.kind = pfJobOpaque;
  opaque.counting.item_cost_us = 30.0;
  opaque.counting.items = 10000;
  pfJobDesc_t td = ticket.desc(), od = opaque.desc();
  pfJob_t t = nullptr, o = nullptr;
  PF_ASSERT_OK(pfJobCreate(s.rt, &td, &t));
  PF_ASSERT_OK(pfJobCreate(s.rt, &od, &o));
  ASSERT_NO_FATAL_FAILURE(s.history());
  pfStats_t before;
  PF_ASSERT_OK(pfRuntimeGetStats(s.rt, &before));

  latch.arm();
  const double start = s.enqueue_step();
  latch.wait_reached();  // the executor is inside T's launch, bubble 3 not yet run
  ASSERT_EQ(pfSimRunUntilIdle(s.stage.world.get()), pfSuccess);  // bubble 3 begins and ends
  latch.open();
  EXPECT_DOUBLE_EQ(s.finish_step(start), 150.0) << "no fill work delayed the main job";

  EXPECT_EQ(ticket.launches_of(3).size(), 1u);
  EXPECT_EQ(opaque.launches_of(3).size(), 0u) << "an opaque slice was launched after its bubble";
  EXPECT_EQ(opaque.counting.items_run(), 0u);
  EXPECT_EQ(ticket.counting.items_run(), 0u) << "the gate was closed: no ticket item ran";
  pfStats_t after;
  PF_ASSERT_OK(pfRuntimeGetStats(s.rt, &after));
  EXPECT_EQ(after.slices_launched - before.slices_launched, 1u);
  EXPECT_DOUBLE_EQ(after.filled_time_us, before.filled_time_us);
  EXPECT_DOUBLE_EQ(after.overrun_time_us, before.overrun_time_us);
  EXPECT_EQ(info_of(t).items_completed, 0u);
  EXPECT_EQ(info_of(t).status, pfJobPending);
  PF_ASSERT_OK(pfJobDestroy(t));
  PF_ASSERT_OK(pfJobDestroy(o));
  PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
}

// The executor handles the begin 40 µs into a 100 µs bubble. T takes one 10 µs round; the opaque
// job O gets what is left of the prediction once the 40 µs already gone are counted: 50 µs, one
// 30 µs round of 28 items (not the 3 rounds a begin-time plan would give, which would run 40 µs
// past the bubble and delay the main job).
TEST(LateExecutor, OpaqueSliceIsSizedToTheTimeLeft) {
  AsyncStage s;
  ASSERT_NO_FATAL_FAILURE(s.init());
  Latch latch;
  RecordingJob ticket, opaque;
  ticket.counting.name = "ticket";
  ticket.counting.items = 28;
  ticket.latch = &latch;
  opaque.counting.name = "opaque";
  opaque.counting.kind = pfJobOpaque;
  opaque.counting.item_cost_us = 30.0;
  opaque.counting.items = 10000;
  pfJobDesc_t td = ticket.desc(), od = opaque.desc();
  pfJob_t t = nullptr, o = nullptr;
  PF_ASSERT_OK(pfJobCreate(s.rt, &td, &t));
  PF_ASSERT_OK(pfJobCreate(s.rt, &od, &o));
  ASSERT_NO_FATAL_FAILURE(s.history());

  latch.arm();
  const double start = s.enqueue_step();
  latch.wait_reached();
  ASSERT_EQ(pfSimRunUntil(s.stage.world.get(), start + 40.0), pfSuccess);
  latch.open();
  s.core->wait_for_executor();  // bubble 3 fully planned, the world still at +40
  EXPECT_DOUBLE_EQ(s.finish_step(start), 150.0) << "the opaque slice ended inside the bubble";

  const std::vector<Launch> late = opaque.launches_of(3);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].max_items, 28u);
  EXPECT_EQ(opaque.counting.items_run(), 28u);
  EXPECT_EQ(ticket.counting.items_run(), 28u) << "the gate was open: T ran its round";
  pfStats_t stats;
  PF_ASSERT_OK(pfRuntimeGetStats(s.rt, &stats));
  EXPECT_DOUBLE_EQ(stats.max_overrun_us, 0.0);
  PF_ASSERT_OK(pfJobDestroy(t));
  PF_ASSERT_OK(pfJobDestroy(o));
  PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
}

class PostLaunchFailure : public ::testing::TestWithParam<bool> {};  // true: executor thread

// The launch callback ran (the slice's kernel is queued on the fill stream), then reading back
// the cursor or recording the slice's end event fails. The slice's workspace, event slot and the
// job's resident share must stay taken until the fill stream has passed the slice; a second
// bubble planned meanwhile must get other memory.
TEST_P(PostLaunchFailure, KeepsTheSliceResourcesUntilItsKernelIsDone) {
  for (const bool fail_end_record : {false, true}) {
    ManualStage stage;
    ASSERT_NO_FATAL_FAILURE(stage.init());
    TestDevice* device = nullptr;
    pfConfig_t c = sim_config(stage.world.get(), 0, 1, 4);
    c.arena_bytes = size_t{16} << 20;
    pfRuntime_t rt = make_test_runtime(stage.world.get(), c, &device, false, GetParam());
    ASSERT_NE(rt, nullptr);
    RecordingJob job;
    job.counting.items = 1u << 20;
    pfJobDesc_t d = job.desc();
    pfJobConfig_t config = {"ws", 10.0, 4, 0, size_t{1} << 20, 0.0};  // 4 workers x 1 MiB
    d.configs = &config;
    d.config_count = 1;
    pfJob_t handle = nullptr;
    PF_ASSERT_OK(pfJobCreate(rt, &d, &handle));
    if (fail_end_record) {
      device->fail_slice_end_record = 1;
    } else {
      device->fail_copy_word = 1;
    }
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 100.0;
    // Two bubbles planned before the world runs: bubble 1's kernel is still queued when bubble
    // 2's slice is planned.
    for (int i = 0; i < 2; ++i) {
      PF_ASSERT_OK(pfSimStreamDelay(stage.peer, 100.0));
      PF_ASSERT_OK(pfSimEventRecord(stage.ready, stage.peer));
      PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, &hint));
      PF_ASSERT_OK(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms));
      PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
      PF_ASSERT_OK(pfSimLaunchKernel(stage.main, 50.0, stage.sms));
      PF_ASSERT_OK(pfIterationEnd(rt));
    }
    PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
    const std::vector<Launch> first = job.launches_of(1), second = job.launches_of(2);
    ASSERT_EQ(first.size(), 1u);
    ASSERT_EQ(second.size(), 1u);
    EXPECT_TRUE(second[0].workspace >= first[0].workspace + first[0].workspace_bytes ||
                second[0].workspace + second[0].workspace_bytes <= first[0].workspace)
        << "bubble 2's workspace overlaps the one bubble 1's queued kernel uses";
    pfResult_t async = pfSuccess;
    PF_ASSERT_OK(pfRuntimeGetAsyncError(rt, &async));
    EXPECT_EQ(async, pfErrorCudaFailure);
    // Nothing ran twice, and the count is exact again once a later read-back succeeded.
    for (uint32_t r : job.counting.runs) ASSERT_LE(r, 1u);
    EXPECT_EQ(info_of(handle).items_completed, job.counting.items_run());
    EXPECT_GT(job.counting.items_run(), 4u * 10u) << "both slices ran";
    // Every block went back to the arena: a job needing all of it fits now.
    PF_ASSERT_OK(pfJobDestroy(handle));
    CountingJob whole;
    whole.resident_bytes = size_t{16} << 20;
    pfJobDesc_t wd = whole.desc();
    pfJob_t whole_handle = nullptr;
    PF_ASSERT_OK(pfJobCreate(rt, &wd, &whole_handle));
    PF_ASSERT_OK(pfJobDestroy(whole_handle));
    PF_ASSERT_OK(pfRuntimeDestroy(rt));
  }
}

INSTANTIATE_TEST_SUITE_P(MessagePath, PostLaunchFailure, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "ExecutorThread" : "PreRunHook");
                         });

}  // namespace
}  // namespace pipefill::testing
