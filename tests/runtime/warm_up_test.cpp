// pfJobCreate's warm-up (issue 8 item 11): one empty slice of the job per fill stream, outside
// any bubble, so a launch callback's first-time work (module loads, library handles) never
// happens inside a bubble; a failing warm-up fails pfJobCreate and changes nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

// A ticket job with per-stream lazy initialisation, like a CUDA job whose first launch on a
// stream loads its module or binds a library handle to the stream.
struct LazyJob {
  std::set<void*> initialised;        // streams the job has "loaded its kernels" on
  int loads_outside_bubbles = 0;
  int loads_inside_bubbles = 0;       // first-time work inside a bubble: must stay 0
  int bubble_launches = 0;
  int warm_ups = 0;
  std::vector<pfSliceDesc_t> warm_up_slices;
  uint64_t items_done = 0;
  pfResult_t warm_up_result = pfSuccess;
  int setups = 0;
  int teardowns = 0;

  static pfResult_t setup(void* user, const pfArenaAllocator_t* allocator, int) {
    auto* self = static_cast<LazyJob*>(user);
    ++self->setups;
    void* p = nullptr;
    return allocator->allocate(allocator->context, 4096, 256, &p);
  }
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<LazyJob*>(user);
    const bool in_bubble = slice->max_items > 0;
    if (self->initialised.insert(stream).second) {
      ++(in_bubble ? self->loads_inside_bubbles : self->loads_outside_bubbles);
    }
    if (!in_bubble) {
      ++self->warm_ups;
      self->warm_up_slices.push_back(*slice);
      return self->warm_up_result;
    }
    ++self->bubble_launches;
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, 10.0, &on_item, self);
  }
  static void on_item(void* user, uint64_t) { ++static_cast<LazyJob*>(user)->items_done; }
  static void teardown(void* user) { ++static_cast<LazyJob*>(user)->teardowns; }

  pfJobDesc_t desc(const char* name, uint64_t items) {
    pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
    d.name = name;
    d.kind = pfJobTicket;
    d.item_count = items;
    d.item_cost_hint_us = 10.0;
    d.resident_bytes = 4096;
    d.user = this;
    d.setup = &setup;
    d.launch = &launch;
    d.teardown = &teardown;
    return d;
  }
};

pfBubbleHint_t hint_of(double us) {
  pfBubbleHint_t h = PF_BUBBLE_HINT_INITIALIZER;
  h.expected_duration_us = us;
  return h;
}

TEST(WarmUp, EmptySliceOnEveryFillStreamBeforeAnyBubble) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init(32));
  pfConfig_t c = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  c.fill_streams = 3;
  pfRuntime_t rt = stage.runtime(&c);
  ASSERT_NE(rt, nullptr);
  LazyJob job;
  pfJobDesc_t d = job.desc("lazy", 100000);
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &handle));

  // Before any bubble: one empty slice per fill stream, each on a different stream.
  ASSERT_EQ(job.warm_ups, 3);
  EXPECT_EQ(job.initialised.size(), 3u);
  EXPECT_EQ(job.loads_outside_bubbles, 3);
  EXPECT_EQ(job.bubble_launches, 0);
  for (const pfSliceDesc_t& s : job.warm_up_slices) {
    EXPECT_EQ(s.max_items, 0u);
    EXPECT_EQ(s.bubble_id, 0u);  // the gate (>= 0) reads closed: nothing can be claimed
    EXPECT_EQ(s.job, handle);
    EXPECT_EQ(s.time_budget_us, 0.0);
    EXPECT_GE(s.max_blocks, 1);
  }

  // The bubbles' slices do no first-time work, whichever fill stream they get.
  const pfBubbleHint_t hint = hint_of(100.0);
  for (int i = 0; i < 4; ++i) stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_GE(job.bubble_launches, 4);
  EXPECT_EQ(job.loads_inside_bubbles, 0);
  EXPECT_EQ(job.warm_ups, 3);  // only at pfJobCreate
  EXPECT_GT(job.items_done, 0u);
  pfJobInfo_t info = info_of(handle);
  EXPECT_EQ(info.items_completed, job.items_done);
  EXPECT_EQ(info.slices_launched, static_cast<uint64_t>(job.bubble_launches));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(WarmUp, FailingWarmUpFailsJobCreateAndChangesNothing) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init(32));
  pfConfig_t c = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  c.fill_streams = 2;
  c.arena_bytes = 8192;  // two resident shares of 4096 at most
  pfRuntime_t rt = stage.runtime(&c);
  ASSERT_NE(rt, nullptr);
  pfStats_t before{};
  PF_ASSERT_OK(pfRuntimeGetStatsV2(rt, &before, sizeof(before)));

  LazyJob bad;
  bad.warm_up_result = pfErrorCudaFailure;
  pfJobDesc_t d = bad.desc("broken-module", 1000);
  pfJob_t handle = nullptr;
  EXPECT_EQ(pfJobCreate(rt, &d, &handle), pfErrorJobFailed);
  EXPECT_EQ(handle, nullptr);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find("broken-module"), std::string::npos) << message;
  EXPECT_NE(message.find("warm-up"), std::string::npos) << message;
  EXPECT_NE(message.find("pfErrorCudaFailure"), std::string::npos) << message;
  EXPECT_EQ(bad.warm_ups, 1);  // stopped at the first failing stream
  EXPECT_EQ(bad.setups, 1);
  EXPECT_EQ(bad.teardowns, 1);  // its setup had succeeded: it frees what it made

  // Nothing changed: same statistics, no job attached, the arena share and the slot are back
  // (two good jobs of 4096 resident bytes fit the 8192-byte arena).
  pfStats_t after{};
  PF_ASSERT_OK(pfRuntimeGetStatsV2(rt, &after, sizeof(after)));
  EXPECT_EQ(std::memcmp(&before, &after, sizeof(before)), 0);
  LazyJob good_a, good_b;
  pfJobDesc_t da = good_a.desc("a", 1000);
  pfJobDesc_t db = good_b.desc("b", 1000);
  pfJob_t ha = nullptr, hb = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &da, &ha));
  PF_ASSERT_OK(pfJobCreate(rt, &db, &hb));
  // A bubble runs only the good jobs' slices; the failed one is never launched again.
  const pfBubbleHint_t hint = hint_of(100.0);
  stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(bad.bubble_launches, 0);
  EXPECT_EQ(bad.warm_ups, 1);
  EXPECT_GT(good_a.items_done + good_b.items_done, 0u);
  PF_ASSERT_OK(pfJobDestroy(ha));
  PF_ASSERT_OK(pfJobDestroy(hb));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
