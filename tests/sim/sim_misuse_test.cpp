// Misuse of the simulated backend that used to crash, hang or accept a dead handle (issue 9):
// stale handles whose address was reused, pfSimWorldDestroy racing other calls, a ticket kernel
// outliving the runtime whose words it reads, calls not clearing the last error, tiny item
// costs making a run take minutes, and on_item callbacks calling back into the simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/callback_scope.hpp"
#include "pipefill/pipefill.h"
#include "sim/sim_engine.hpp"
#include "sim/sim_world.hpp"
#include "sim_test_support.hpp"

namespace pipefill::sim {
namespace {

using testing::make_stream;
using testing::make_world;
using testing::TicketWords;

bool message_has(const std::string& needle) {
  return std::string(pfGetLastErrorMessage()).find(needle) != std::string::npos;
}

// Destroying a stream and creating the next one used to hand out the same address, so the stale
// handle was accepted as the new stream. Handles are never reused now.
TEST(SimMisuse, StaleHandlesStayDeadWhenNewObjectsAreCreated) {
  pfSimWorld_t world = nullptr;
  ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &world), pfSuccess);
  void* stale = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &stale), pfSuccess);
  ASSERT_EQ(pfSimStreamDestroy(stale), pfSuccess);
  std::vector<void*> fresh(8);
  for (void*& s : fresh) {
    ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &s), pfSuccess);
    EXPECT_NE(s, stale);
  }
  EXPECT_EQ(pfSimLaunchKernel(stale, 1.0, 1), pfErrorInvalidArgument);
  EXPECT_TRUE(message_has("not a live simulated stream")) << pfGetLastErrorMessage();

  pfSimEvent_t stale_event = nullptr;
  ASSERT_EQ(pfSimEventCreate(world, &stale_event), pfSuccess);
  ASSERT_EQ(pfSimEventDestroy(stale_event), pfSuccess);
  pfSimEvent_t event = nullptr;
  ASSERT_EQ(pfSimEventCreate(world, &event), pfSuccess);
  EXPECT_NE(event, stale_event);
  EXPECT_EQ(pfSimEventRecord(stale_event, fresh[0]), pfErrorInvalidArgument);
  ASSERT_EQ(pfSimWorldDestroy(world), pfSuccess);

  // A destroyed world's handle stays dead when the next world is created.
  pfSimWorld_t next = nullptr;
  ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &next), pfSuccess);
  EXPECT_NE(next, world);
  double now = 0.0;
  EXPECT_EQ(pfSimNow(world, &now), pfErrorInvalidArgument);
  EXPECT_EQ(pfSimStreamDelay(fresh[0], 1.0), pfErrorInvalidArgument);  // died with its world
  ASSERT_EQ(pfSimWorldDestroy(next), pfSuccess);
}

// pfSimWorldDestroy racing calls on the same world used to free the world under their feet
// (ASan: heap-use-after-free). Every racing call now either completes before the destroy or is
// refused with pfErrorInvalidArgument.
TEST(SimMisuse, WorldDestroyRacingOtherCallsIsSafe) {
  for (int round = 0; round < 30; ++round) {
    pfSimWorld_t world = nullptr;
    ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &world), pfSuccess);
    void* stream = nullptr;
    ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &stream), pfSuccess);
    std::atomic<bool> started{false};
    std::atomic<int> unexpected{0};
    std::thread caller([&] {
      for (int i = 0; i < 2000; ++i) {
        pfSimEvent_t event = nullptr;
        const pfResult_t a = pfSimEventCreate(world, &event);
        const pfResult_t b = pfSimStreamDelay(stream, 1.0);
        started = true;
        for (pfResult_t r : {a, b}) {
          if (r != pfSuccess && r != pfErrorInvalidArgument) unexpected.fetch_add(1);
        }
        if (a == pfErrorInvalidArgument) break;  // the world is gone
      }
    });
    while (!started.load()) std::this_thread::yield();
    EXPECT_EQ(pfSimWorldDestroy(world), pfSuccess) << pfGetLastErrorMessage();
    caller.join();
    EXPECT_EQ(unexpected.load(), 0);
    pfSimEvent_t event = nullptr;
    EXPECT_EQ(pfSimEventCreate(world, &event), pfErrorInvalidArgument);
  }
}

// A job's launch callback that put its ticket kernel on a main stream (behind other work): the
// runtime's destroy drained only the fill stream and freed the words the kernel reads, and the
// kernel read freed memory when it ran later (ASan: heap-use-after-free). The simulator now keeps
// the words until the kernel has run; the kernel finds the gate closed and claims nothing.
struct MainStreamTicketJob {
  void* main_stream = nullptr;
  std::atomic<int> launches{0};
  std::atomic<uint64_t> items{0};
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void*) {
    auto* self = static_cast<MainStreamTicketJob*>(user);
    if (slice->max_items == 0) return pfSuccess;  // pfJobCreate's warm-up: not a bubble slice
    ++self->launches;
    return pfSimLaunchTicketKernel(self->main_stream, slice, slice->max_blocks, 10.0, &on_item,
                                   self);
  }
  static void on_item(void* user, uint64_t) { ++static_cast<MainStreamTicketJob*>(user)->items; }
};

TEST(SimMisuse, TicketKernelOutlivingTheRuntimeReadsNoFreedWords) {
  pfSimWorld_t world = nullptr;
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.sm_count = 8;
  ASSERT_EQ(pfSimWorldCreate(1, &desc, 1, &world), pfSuccess);
  void* main = nullptr;
  void* other = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world, 0, kHighestPriority, &main), pfSuccess);
  ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &other), pfSuccess);
  ASSERT_EQ(pfSimStreamDelay(other, 1e6), pfSuccess);  // the kernel will queue behind this
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendSim;
  c.sim_world = world;
  c.arena_bytes = size_t{1} << 20;
  pfRuntime_t rt = nullptr;
  ASSERT_EQ(pfRuntimeCreate(&c, &rt), pfSuccess) << pfGetLastErrorMessage();
  MainStreamTicketJob job;
  job.main_stream = other;
  pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
  d.item_count = 1000;
  d.item_cost_hint_us = 10.0;
  d.user = &job;
  d.launch = &MainStreamTicketJob::launch;
  pfJob_t handle = nullptr;
  ASSERT_EQ(pfJobCreate(rt, &d, &handle), pfSuccess) << pfGetLastErrorMessage();
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  ASSERT_EQ(pfBubbleBegin(rt, main, &hint), pfSuccess);
  ASSERT_EQ(pfSimStreamDelay(main, 100.0), pfSuccess);
  ASSERT_EQ(pfBubbleEnd(rt, main), pfSuccess);
  ASSERT_EQ(pfSimRunUntil(world, 1000.0), pfSuccess);  // the bubble, not the 1 s delay
  ASSERT_EQ(job.launches.load(), 1);
  ASSERT_EQ(pfJobDestroy(handle), pfSuccess) << pfGetLastErrorMessage();
  ASSERT_EQ(pfRuntimeDestroy(rt), pfSuccess) << pfGetLastErrorMessage();
  // The kernel runs now, after the runtime (and its words) are gone.
  ASSERT_EQ(pfSimRunUntilIdle(world), pfSuccess) << pfGetLastErrorMessage();
  EXPECT_EQ(job.items.load(), 0u);  // the gate of its bubble was closed long ago
  ASSERT_EQ(pfSimWorldDestroy(world), pfSuccess);
}

// Words freed while a queued op uses them are kept until it ran, and refused for new ops.
TEST(SimMisuse, FreedWordsAreRefusedForNewOpsAndKeptForQueuedOnes) {
  auto world = make_world(1, 4);
  void* stream = make_stream(*world, 0, 0);
  uint64_t* words = nullptr;
  ASSERT_EQ(world->allocate_words(3, &words), pfSuccess);
  ASSERT_EQ(world->delay(stream, 5.0), pfSuccess);
  ASSERT_EQ(world->write_word(stream, &words[1], 9), pfSuccess);
  ASSERT_EQ(world->free_words(words), pfSuccess);
  EXPECT_EQ(world->write_word(stream, &words[2], 1), pfErrorInvalidArgument);
  EXPECT_TRUE(message_has("freed")) << pfGetLastErrorMessage();
  EXPECT_EQ(world->free_words(words), pfErrorInvalidArgument);  // no double free
  ASSERT_EQ(world->run_until_idle(), pfSuccess);  // the write lands in still-allocated words
}

TEST(SimMisuse, EverySuccessfulCallClearsTheLastError) {
  pfSimWorld_t world = nullptr;
  ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &world), pfSuccess);
  void* stream = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &stream), pfSuccess);
  pfSimEvent_t event = nullptr;
  ASSERT_EQ(pfSimEventCreate(world, &event), pfSuccess);
  auto fail_once = [] {
    EXPECT_EQ(pfSimLaunchKernel(nullptr, 1.0, 1), pfErrorInvalidArgument);
    EXPECT_STRNE(pfGetLastErrorMessage(), "");
  };
  double t = 0.0;
  const std::vector<std::pair<const char*, std::function<pfResult_t()>>> calls = {
      {"pfSimLaunchKernel", [&] { return pfSimLaunchKernel(stream, 1.0, 1); }},
      {"pfSimStreamDelay", [&] { return pfSimStreamDelay(stream, 1.0); }},
      {"pfSimEventRecord", [&] { return pfSimEventRecord(event, stream); }},
      {"pfSimStreamWaitEvent", [&] { return pfSimStreamWaitEvent(stream, event, 0.0, 0); }},
      {"pfSimEventTime", [&] { return pfSimEventTime(event, &t); }},
      {"pfSimRunUntil", [&] { return pfSimRunUntil(world, 1.0); }},
      {"pfSimRunUntilIdle", [&] { return pfSimRunUntilIdle(world); }},
      {"pfSimNow", [&] { return pfSimNow(world, &t); }},
      {"pfSimSetMemoryUsed", [&] { return pfSimSetMemoryUsed(world, 0, 0); }},
  };
  for (const auto& [name, call] : calls) {
    fail_once();
    EXPECT_EQ(call(), pfSuccess) << name;
    EXPECT_STREQ(pfGetLastErrorMessage(), "") << name << " left the previous error";
  }
  fail_once();
  ASSERT_EQ(pfSimEventDestroy(event), pfSuccess);
  EXPECT_STREQ(pfGetLastErrorMessage(), "");
  fail_once();
  ASSERT_EQ(pfSimStreamDestroy(stream), pfSuccess);
  EXPECT_STREQ(pfGetLastErrorMessage(), "");
  fail_once();
  ASSERT_EQ(pfSimWorldDestroy(world), pfSuccess);
  EXPECT_STREQ(pfGetLastErrorMessage(), "");
}

// Items far shorter than the quantum: one event per batch, not per item. 2,000,000 items of
// 1e-6 µs used to cost 2,000,000+ events; every item still runs exactly once.
TEST(SimMisuse, TinyItemsAreSimulatedInBoundedWork) {
  auto world = make_world(1, 28);
  void* fill = make_stream(*world, 0, 0, true);
  TicketWords words;
  constexpr uint64_t kTotal = 2'000'000;
  struct Seen {
    std::vector<uint8_t> runs = std::vector<uint8_t>(kTotal, 0);
    uint64_t count = 0;
    double last_time = -1.0;
    bool times_finite = true;
    static void on_item(void* user, uint64_t item) {
      auto* self = static_cast<Seen*>(user);
      if (item < kTotal) ++self->runs[item];
      ++self->count;
      self->times_finite = self->times_finite && std::isfinite(World::callback_time_us());
    }
  } seen;
  // Two launches: a launch stops after kMaxTicketItemsPerLaunch (2^20) items.
  for (uint64_t bubble = 1; bubble <= 2; ++bubble) {
    ASSERT_EQ(world->write_word(fill, &words.budget, 0), pfSuccess);
    pfSliceDesc_t slice = words.slice(bubble, ~uint64_t{0}, kTotal, 28);
    ASSERT_EQ(world->launch_ticket(fill, &slice, 28, 1e-6, &Seen::on_item, &seen), pfSuccess);
  }
  const uint64_t before = world->events_processed();
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  const uint64_t events = world->events_processed() - before;
  EXPECT_EQ(seen.count, kTotal);
  EXPECT_EQ(std::count(seen.runs.begin(), seen.runs.end(), uint8_t{1}),
            static_cast<std::ptrdiff_t>(kTotal));  // every item exactly once
  EXPECT_TRUE(seen.times_finite);
  // Per block, one event per batch of 0.1 / 1e-6 = 100,000 claims: a few hundred in all.
  EXPECT_LT(events, 2000u) << events << " events for " << kTotal << " items";
  // Opaque work of tiny items without a callback: bounded by time, not by item count.
  const uint64_t opaque_before = world->events_processed();
  ASSERT_EQ(world->launch_opaque(fill, 0, 1'000'000'000, 28, 1e-6, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_LT(world->events_processed() - opaque_before, 20000u);
  // 1e9 items x 1e-6 us over 28 blocks: the launch took 1e3 / 28 us of virtual time.
  const auto fills = testing::records_of(*world, 0, ActivityKind::Fill);
  ASSERT_FALSE(fills.empty());
  // (blocks take batches of 0.1 us, so the busiest block may run one batch more)
  EXPECT_NEAR(fills.back().end_us - fills.back().start_us, 1e3 / 28, 0.11);
}

// The case through the runtime: a job with item_cost_hint_us = 1e-6 and a huge item
// count made pfSimRunUntilIdle run for minutes (one event per planned item). Each slice now
// stops after 2^20 items, and the run takes a bounded number of events.
struct TinyJob {
  std::atomic<uint64_t> items{0};
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, 1e-6, &on_item, user);
  }
  static void on_item(void* user, uint64_t) { static_cast<TinyJob*>(user)->items.fetch_add(1); }
};

TEST(SimMisuse, TinyItemCostHintGivesABoundedRun) {
  pfSimWorld_t world = nullptr;
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.sm_count = 32;
  ASSERT_EQ(pfSimWorldCreate(1, &desc, 1, &world), pfSuccess);
  void* main = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world, 0, kHighestPriority, &main), pfSuccess);
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendSim;
  c.sim_world = world;
  c.reserved_sms = 4;
  c.arena_bytes = size_t{1} << 20;
  pfRuntime_t rt = nullptr;
  ASSERT_EQ(pfRuntimeCreate(&c, &rt), pfSuccess) << pfGetLastErrorMessage();
  TinyJob job;
  pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
  d.item_count = uint64_t{1} << 40;
  d.item_cost_hint_us = 1e-6;
  d.user = &job;
  d.launch = &TinyJob::launch;
  pfJob_t handle = nullptr;
  ASSERT_EQ(pfJobCreate(rt, &d, &handle), pfSuccess) << pfGetLastErrorMessage();
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  constexpr int kBubbles = 3;
  for (int i = 0; i < kBubbles; ++i) {
    ASSERT_EQ(pfBubbleBegin(rt, main, &hint), pfSuccess);
    ASSERT_EQ(pfSimStreamDelay(main, 100.0), pfSuccess);
    ASSERT_EQ(pfBubbleEnd(rt, main), pfSuccess);
    ASSERT_EQ(pfSimLaunchKernel(main, 50.0, 32), pfSuccess);
    ASSERT_EQ(pfSimRunUntilIdle(world), pfSuccess) << pfGetLastErrorMessage();
  }
  ASSERT_EQ(pfRuntimeSynchronize(rt), pfSuccess);
  pfStats_t s{};
  ASSERT_EQ(pfRuntimeGetStats(rt, &s), pfSuccess);
  EXPECT_EQ(s.slices_launched, static_cast<uint64_t>(kBubbles));
  // Each slice: 2^20 items (the per-launch cap), all inside its 100 µs bubble.
  EXPECT_EQ(job.items.load(), kBubbles * kMaxTicketItemsPerLaunch);
  EXPECT_EQ(s.items_completed, job.items.load());
  EXPECT_LT(world_from_handle(world)->events_processed(), 100000u);
  ASSERT_EQ(pfJobDestroy(handle), pfSuccess);
  ASSERT_EQ(pfRuntimeDestroy(rt), pfSuccess);
  ASSERT_EQ(pfSimWorldDestroy(world), pfSuccess);
}

// An on_item callback runs with the world locked: calling back into the simulator used to
// deadlock. pfSimNow now returns the item's time; every other call fails with
// pfErrorInvalidState naming the callback; library calls see CallbackScope "on_item".
struct ReentrantProbe {
  pfSimWorld_t world = nullptr;
  void* stream = nullptr;
  World* cxx_world = nullptr;
  int calls = 0;
  double now = -1.0;
  double item_time = -2.0;
  pfResult_t now_result = pfErrorInternal;
  pfResult_t launch_result = pfSuccess;
  pfResult_t run_result = pfSuccess;
  pfResult_t destroy_result = pfSuccess;
  pfResult_t cxx_result = pfSuccess;
  std::string launch_message;
  std::string scope;
  double cxx_now = -3.0;
  static void on_item(void* user, uint64_t) {
    auto* self = static_cast<ReentrantProbe*>(user);
    if (self->calls++ > 0) return;
    self->item_time = World::callback_time_us();
    self->now_result = pfSimNow(self->world, &self->now);
    self->launch_result = pfSimLaunchKernel(self->stream, 1.0, 1);
    self->launch_message = pfGetLastErrorMessage();
    self->run_result = pfSimRunUntilIdle(self->world);
    self->destroy_result = pfSimWorldDestroy(self->world);
    self->cxx_result = self->cxx_world->launch_kernel(self->stream, 1.0, 1);
    self->cxx_now = self->cxx_world->now();
    const char* active = CallbackScope::active();
    self->scope = active != nullptr ? active : "";
  }
};

TEST(SimMisuse, OnItemCallingBackIntoTheSimulatorIsRefusedNotDeadlocked) {
  pfSimWorld_t world = nullptr;
  ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &world), pfSuccess);
  void* stream = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &stream), pfSuccess);
  ASSERT_EQ(pfSimStreamDelay(stream, 5.0), pfSuccess);
  ReentrantProbe probe{world, stream, world_from_handle(world)};
  ASSERT_EQ(pfSimLaunchOpaque(stream, 0, 3, 1, 2.0, &ReentrantProbe::on_item, &probe), pfSuccess);
  ASSERT_EQ(pfSimRunUntilIdle(world), pfSuccess) << pfGetLastErrorMessage();
  EXPECT_EQ(probe.calls, 3);
  EXPECT_EQ(probe.now_result, pfSuccess);
  EXPECT_DOUBLE_EQ(probe.item_time, 7.0);  // the first item ends at 5 + 2
  EXPECT_DOUBLE_EQ(probe.now, 7.0);
  EXPECT_DOUBLE_EQ(probe.cxx_now, 7.0);
  EXPECT_EQ(probe.launch_result, pfErrorInvalidState);
  EXPECT_NE(probe.launch_message.find("on_item"), std::string::npos) << probe.launch_message;
  EXPECT_EQ(probe.run_result, pfErrorInvalidState);
  EXPECT_EQ(probe.destroy_result, pfErrorInvalidState);
  EXPECT_EQ(probe.cxx_result, pfErrorInvalidState);
  EXPECT_EQ(probe.scope, "on_item");
  // Nothing the refused calls tried happened: the world is idle at the last item's end.
  double now = 0.0;
  ASSERT_EQ(pfSimNow(world, &now), pfSuccess);
  EXPECT_DOUBLE_EQ(now, 11.0);
  ASSERT_EQ(pfSimWorldDestroy(world), pfSuccess);
}

}  // namespace
}  // namespace pipefill::sim
