// A fill job's work is cut at the bubble end by the gate: when a bubble ends earlier than the
// prediction, the main job's next kernel starts at most one fill item later. The naive baseline
// (ungated work sized to the usual bubble) holds the SMs much longer.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "../../examples/fill_jobs/fill_jobs.h"

namespace {

#define ASSERT_PF(call) ASSERT_EQ((call), pfSuccess) << #call << ": " << pfGetLastErrorMessage()

constexpr double kLong = 400.0, kShort = 150.0, kKernel = 100.0;
constexpr int kIterations = 36;
bool is_short(int i) { return i >= 12 && i % 6 == 0; }  // after the history has formed

struct Delays {
  std::vector<double> short_bubbles, long_bubbles;
  double item_cost = 0.0;
  uint64_t items = 0;
};

void count_item(void* user, uint64_t) { ++*static_cast<uint64_t*>(user); }

// naive = false: PipeFill with a ticket MLP job; true: ungated opaque work on a stream at the
// main job's priority, sized to the long bubble, no SM reservation.
void run(bool naive, Delays* out) {
  pfSimWorld_t world = nullptr;
  // Interference off: the bound below is the gate's alone (tests/sim covers interference).
  const pfSimDeviceDesc_t device = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  ASSERT_PF(pfSimWorldCreate(1, &device, 11, &world));
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  config.backend = pfBackendSim;
  config.sim_world = world;
  config.reserved_sms = naive ? 0 : 8;
  pfRuntime_t rt = nullptr;
  ASSERT_PF(pfRuntimeCreate(&config, &rt));
  void *main = nullptr, *naive_stream = nullptr;
  ASSERT_PF(pfStreamCreateHighPriority(rt, &main));
  pfSimEvent_t end_event = nullptr, kernel_event = nullptr, begin_event = nullptr;
  ASSERT_PF(pfSimEventCreate(world, &end_event));
  ASSERT_PF(pfSimEventCreate(world, &kernel_event));
  ASSERT_PF(pfSimEventCreate(world, &begin_event));
  fjParams_t p;
  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendSim), pfSuccess);
  p.items = 10000000;
  p.keep_every = 0;
  fjJob_t fill = nullptr;
  ASSERT_EQ(fjJobCreate(&p, &fill), pfSuccess) << fjGetLastErrorMessage();
  ASSERT_EQ(fjJobItemCost(fill, &out->item_cost), pfSuccess);
  pfJob_t job = nullptr;
  if (!naive) {
    pfJobDesc_t desc;
    ASSERT_EQ(fjJobGetDesc(fill, &desc), pfSuccess);
    ASSERT_PF(pfJobCreate(rt, &desc, &job));
  } else {
    ASSERT_PF(pfSimStreamCreate(world, 0, -5, &naive_stream));
  }
  uint64_t naive_next = 0;
  for (int i = 0; i < kIterations; ++i) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.label = "wait";
    ASSERT_PF(pfSimLaunchKernel(main, kKernel, 124));
    ASSERT_PF(pfBubbleBegin(rt, main, &hint));
    if (naive) {
      const uint64_t items = static_cast<uint64_t>(kLong / out->item_cost) * 132;
      ASSERT_PF(pfSimEventRecord(begin_event, main));
      ASSERT_PF(pfSimStreamWaitEvent(naive_stream, begin_event, 0, 0));
      ASSERT_PF(pfSimLaunchOpaque(naive_stream, naive_next, items, 132, out->item_cost, count_item,
                                  &out->items));
      naive_next += items;
    }
    ASSERT_PF(pfSimStreamDelay(main, is_short(i) ? kShort : kLong));
    ASSERT_PF(pfBubbleEnd(rt, main));
    ASSERT_PF(pfSimEventRecord(end_event, main));
    ASSERT_PF(pfSimLaunchKernel(main, kKernel, 124));
    ASSERT_PF(pfSimEventRecord(kernel_event, main));
    ASSERT_PF(pfIterationEnd(rt));
    ASSERT_PF(pfSimRunUntilIdle(world));
    ASSERT_PF(pfRuntimeSynchronize(rt));
    double t_end = 0, t_kernel = 0;
    ASSERT_PF(pfSimEventTime(end_event, &t_end));
    ASSERT_PF(pfSimEventTime(kernel_event, &t_kernel));
    // No jitter: the kernel's start is its end minus its duration.
    (is_short(i) ? out->short_bubbles : out->long_bubbles).push_back(t_kernel - kKernel - t_end);
  }
  if (job) {
    pfJobInfo_t info{};
    ASSERT_PF(pfJobGetStatus(job, &info));
    out->items = info.items_completed;
    ASSERT_PF(pfJobDestroy(job));
  }
  fjJobDestroy(fill);
  for (pfSimEvent_t e : {end_event, kernel_event, begin_event}) ASSERT_PF(pfSimEventDestroy(e));
  if (naive_stream) ASSERT_PF(pfSimStreamDestroy(naive_stream));
  ASSERT_PF(pfStreamDestroy(rt, main));
  ASSERT_PF(pfRuntimeDestroy(rt));
  ASSERT_PF(pfSimWorldDestroy(world));
}

}  // namespace

TEST(EngineGate, EarlyBubbleEndCostsTheMainJobAtMostOneItem) {
  Delays gated, naive;
  ASSERT_NO_FATAL_FAILURE(run(false, &gated));
  ASSERT_NO_FATAL_FAILURE(run(true, &naive));
  ASSERT_EQ(gated.short_bubbles.size(), 4u);
  EXPECT_GT(gated.items, 0u);
  double worst = 0.0;
  for (double d : gated.short_bubbles) {
    EXPECT_GE(d, -1e-9);
    EXPECT_LE(d, gated.item_cost + 1e-9);  // the gate: at most one item past the bubble end
    worst = std::max(worst, d);
  }
  EXPECT_GT(worst, 0.0) << "the prediction was long: fill work must have been cut by the gate";
  for (double d : gated.long_bubbles) EXPECT_LE(d, gated.item_cost + 1e-9);
  // The naive stream keeps every SM until its items, sized to the long bubble, are done.
  for (double d : naive.short_bubbles) EXPECT_GT(d, 0.5 * (kLong - kShort));
}
