// Concurrent fill (issue 11 item 1) on the simulated device: a bubble is budgeted in SM·µs and
// several jobs' slices run side by side on the fill streams. Expected item counts and SM·µs are
// computed here in closed form from the bubble length, the item cost and the parallelism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

constexpr double kItemUs = 10.0;
constexpr int kSms = 72;
constexpr int kReserved = 7;                  // 65 fill SMs: one 1-SM job + one 64-SM job
constexpr int kFillSms = kSms - kReserved;

pfJobConfig_t config_with_parallelism(int parallelism) {
  pfJobConfig_t c{};
  c.name = "p";
  c.item_cost_us = kItemUs;
  c.parallelism = parallelism;
  return c;
}

pfStats_t stats_v2(pfRuntime_t rt) {
  pfStats_t s{};
  EXPECT_EQ(pfRuntimeGetStatsV2(rt, &s, sizeof(s)), pfSuccess) << pfGetLastErrorMessage();
  return s;
}

struct TwoJobs {
  ManualStage stage;
  pfRuntime_t rt = nullptr;
  CountingJob narrow;  // parallelism 1 (a training fill job)
  CountingJob wide;    // parallelism 64
  pfJob_t narrow_handle = nullptr;
  pfJob_t wide_handle = nullptr;

  void init(int fill_streams, uint64_t narrow_items, uint64_t wide_items) {
    ASSERT_NO_FATAL_FAILURE(stage.init(kSms));
    stage.comm_sms = kReserved;
    pfConfig_t c = sim_config(stage.world.get(), 0, 1, kReserved);
    c.fill_streams = fill_streams;
    rt = stage.runtime(&c);
    ASSERT_NE(rt, nullptr);
    narrow.name = "narrow";
    narrow.items = narrow_items;
    narrow.item_cost_us = kItemUs;
    wide.name = "wide";
    wide.items = wide_items;
    wide.item_cost_us = kItemUs;
    const pfJobConfig_t narrow_config = config_with_parallelism(1);
    const pfJobConfig_t wide_config = config_with_parallelism(64);
    pfJobDesc_t d = narrow.desc();
    d.configs = &narrow_config;
    d.config_count = 1;
    PF_ASSERT_OK(pfJobCreate(rt, &d, &narrow_handle));
    d = wide.desc();
    d.configs = &wide_config;
    d.config_count = 1;
    PF_ASSERT_OK(pfJobCreate(rt, &d, &wide_handle));
  }
  void destroy() {
    if (narrow_handle != nullptr) EXPECT_EQ(pfJobDestroy(narrow_handle), pfSuccess);
    if (wide_handle != nullptr) EXPECT_EQ(pfJobDestroy(wide_handle), pfSuccess);
    if (rt != nullptr) EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess) << pfGetLastErrorMessage();
  }
};

// A hint lets the first bubble fill (gated work trusts it).
pfBubbleHint_t hint_of(double us) {
  pfBubbleHint_t h = PF_BUBBLE_HINT_INITIALIZER;
  h.expected_duration_us = us;
  return h;
}

TEST(ConcurrentFill, JobsOfParallelismOneAndSixtyFourShareOneBubble) {
  TwoJobs t;
  ASSERT_NO_FATAL_FAILURE(t.init(/*fill_streams=*/4, 1000, 100000));
  constexpr double kBubbleUs = 100.0;
  const pfBubbleHint_t hint = hint_of(kBubbleUs);
  t.stage.step(t.rt, kBubbleUs, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(t.rt));

  // Margins off, no launch overhead on the simulator: each worker runs floor(100 / 10) items.
  const uint64_t per_worker = static_cast<uint64_t>(std::floor(kBubbleUs / kItemUs));
  EXPECT_EQ(t.narrow.items_run(), per_worker * 1);
  EXPECT_EQ(t.wide.items_run(), per_worker * 64);
  EXPECT_TRUE(std::all_of(t.narrow.runs.begin(), t.narrow.runs.end(), [](uint32_t r) { return r <= 1; }));
  EXPECT_TRUE(std::all_of(t.wide.runs.begin(), t.wide.runs.end(), [](uint32_t r) { return r <= 1; }));

  // Stats against the independent count: every item is one SM busy for kItemUs in the bubble.
  const pfStats_t s = stats_v2(t.rt);
  const double items_sm_us =
      static_cast<double>(t.narrow.items_run() + t.wide.items_run()) * kItemUs;
  const double capacity = kBubbleUs * kFillSms;
  EXPECT_NEAR(s.filled_sm_us, items_sm_us, 1e-6);
  EXPECT_NEAR(s.capacity_sm_us, capacity, 1e-6);
  EXPECT_GE(items_sm_us, 0.9 * capacity);
  std::printf("[ figure ] fill_streams=4: filled %.3f of %.3f SM-us (%.1f%%), items %llu + %llu\n",
              s.filled_sm_us, s.capacity_sm_us, 100.0 * s.filled_sm_us / s.capacity_sm_us,
              static_cast<unsigned long long>(t.narrow.items_run()),
              static_cast<unsigned long long>(t.wide.items_run()));
  EXPECT_EQ(s.items_completed, t.narrow.items_run() + t.wide.items_run());
  EXPECT_EQ(s.slices_launched, 2u);  // one slice per job, side by side
  // Bubble edges (issue 33 item 7): both slices start at the bubble's begin (no launch overhead)
  // and their last items end exactly at its end (10 items of 10 us): no slice is left running.
  EXPECT_EQ(s.bubbles_fill_started, 1u);
  EXPECT_DOUBLE_EQ(s.fill_start_delay_us, 0.0);
  EXPECT_DOUBLE_EQ(s.max_fill_start_delay_us, 0.0);
  EXPECT_EQ(s.slices_past_end, 0u);
  EXPECT_NEAR(s.filled_time_us, kBubbleUs, 1e-6);  // concurrent slices do not count twice
  EXPECT_EQ(info_of(t.narrow_handle).slices_launched, 1u);
  EXPECT_EQ(info_of(t.wide_handle).slices_launched, 1u);
  t.destroy();
}

// The same bubble with one fill stream: the first job in policy order gets the bubble's time
// and the other nothing - the sequential behaviour concurrent fill replaces.
TEST(ConcurrentFill, OneFillStreamRunsOneJobPerBubble) {
  TwoJobs t;
  ASSERT_NO_FATAL_FAILURE(t.init(/*fill_streams=*/1, 1000, 100000));
  const pfBubbleHint_t hint = hint_of(100.0);
  t.stage.step(t.rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(t.rt));
  EXPECT_EQ((t.narrow.items_run() > 0) + (t.wide.items_run() > 0), 1);
  const pfStats_t s = stats_v2(t.rt);
  EXPECT_EQ(s.slices_launched, 1u);
  EXPECT_LT(s.filled_sm_us, s.capacity_sm_us);
  std::printf("[ figure ] fill_streams=1: filled %.3f of %.3f SM-us (%.1f%%), items %llu + %llu\n",
              s.filled_sm_us, s.capacity_sm_us, 100.0 * s.filled_sm_us / s.capacity_sm_us,
              static_cast<unsigned long long>(t.narrow.items_run()),
              static_cast<unsigned long long>(t.wide.items_run()));
  t.destroy();
}

// A bubble ending at 55 µs of a predicted 100 µs: each block of both concurrent slices stops at
// its next gate check, so the overrun is one item at most (5 µs here), the main job is delayed by
// exactly that, and each worker ran ceil(55 / 10) items.
TEST(ConcurrentFill, GateBoundsOverrunOfConcurrentSlicesToOneItem) {
  ManualStage base;
  ASSERT_NO_FATAL_FAILURE(base.init(kSms));
  base.comm_sms = kReserved;
  TwoJobs t;
  ASSERT_NO_FATAL_FAILURE(t.init(/*fill_streams=*/4, 1000, 100000));
  const pfBubbleHint_t hint = hint_of(100.0);
  const double filled_step = t.stage.step(t.rt, 55.0, &hint);
  const double base_step = base.step(nullptr, 55.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(t.rt));
  const uint64_t per_worker = static_cast<uint64_t>(std::ceil(55.0 / kItemUs));
  EXPECT_EQ(t.narrow.items_run(), per_worker * 1);
  EXPECT_EQ(t.wide.items_run(), per_worker * 64);
  const pfStats_t s = stats_v2(t.rt);
  EXPECT_DOUBLE_EQ(s.max_overrun_us, per_worker * kItemUs - 55.0);
  EXPECT_LE(s.max_overrun_us, kItemUs);
  EXPECT_DOUBLE_EQ(filled_step - base_step, s.max_overrun_us);
  // Both slices were still running when the main stream passed the bubble's end (issue 33 item 7).
  EXPECT_EQ(s.slices_past_end, 2u);
  // Filled SM·µs counts only the part inside the bubble: 55 µs on each of the 65 SMs.
  EXPECT_NEAR(s.filled_sm_us, 55.0 * kFillSms, 1e-6);
  t.destroy();
}

// Both jobs to the end through many bubbles (and several bubble lengths): every item exactly
// once, the runtime's item count equal to the jobs' own counts, and the filled SM·µs never more
// than the capacity.
TEST(ConcurrentFill, EveryItemRunsExactlyOnceAcrossConcurrentSlices) {
  TwoJobs t;
  ASSERT_NO_FATAL_FAILURE(t.init(/*fill_streams=*/4, 37, 5000));
  const double lengths[] = {100.0, 60.0, 130.0, 45.0};
  for (int i = 0; i < 200; ++i) {
    if (info_of(t.narrow_handle).status == pfJobCompleted &&
        info_of(t.wide_handle).status == pfJobCompleted) {
      break;
    }
    const double len = lengths[i % 4];
    const pfBubbleHint_t hint = hint_of(len);
    t.stage.step(t.rt, len, &hint);
    PF_ASSERT_OK(pfRuntimeSynchronize(t.rt));
  }
  EXPECT_EQ(info_of(t.narrow_handle).status, pfJobCompleted);
  EXPECT_EQ(info_of(t.wide_handle).status, pfJobCompleted);
  EXPECT_TRUE(t.narrow.every_item_once());
  EXPECT_TRUE(t.wide.every_item_once());
  const pfStats_t s = stats_v2(t.rt);
  EXPECT_EQ(s.items_completed, t.narrow.items + t.wide.items);
  EXPECT_LE(s.filled_sm_us, s.capacity_sm_us + 1e-6);
  EXPECT_GT(s.filled_sm_us, 0.0);
  t.destroy();
}

// Packed by memory too: the second job's slice gets only the workers whose workspace still fits
// next to the first one's. Arena 1 MiB; A: 32 workers x 16 KiB = 512 KiB; B (parallelism 33,
// 32 KiB per item) fits (1 MiB - 512 KiB) / 32 KiB = 16 workers, not 33, though 33 SMs are free.
TEST(ConcurrentFill, WorkspaceLimitsTheWorkersOfALaterJob) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init(kSms));
  stage.comm_sms = kReserved;
  pfConfig_t c = sim_config(stage.world.get(), 0, 1, kReserved);
  c.arena_bytes = size_t{1} << 20;
  c.policy = pfPolicyFifo;
  pfRuntime_t rt = stage.runtime(&c);
  ASSERT_NE(rt, nullptr);
  CountingJob a, b;
  a.name = "a";
  b.name = "b";
  a.items = b.items = 100000;
  pfJobConfig_t ac = config_with_parallelism(32), bc = config_with_parallelism(33);
  ac.workspace_bytes_per_item = size_t{16} << 10;
  bc.workspace_bytes_per_item = size_t{32} << 10;
  pfJobDesc_t ad = a.desc(), bd = b.desc();
  ad.configs = &ac;
  ad.config_count = 1;
  bd.configs = &bc;
  bd.config_count = 1;
  pfJob_t ah = nullptr, bh = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &ad, &ah));
  PF_ASSERT_OK(pfJobCreate(rt, &bd, &bh));
  const pfBubbleHint_t hint = hint_of(100.0);
  stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  const uint64_t b_workers = ((size_t{1} << 20) - 32 * ac.workspace_bytes_per_item) /
                             bc.workspace_bytes_per_item;
  ASSERT_EQ(b_workers, 16u);
  EXPECT_EQ(a.items_run(), 32u * 10u);
  EXPECT_EQ(b.items_run(), b_workers * 10u);
  const pfStats_t s = stats_v2(rt);
  EXPECT_NEAR(s.filled_sm_us, static_cast<double>(a.items_run() + b.items_run()) * kItemUs, 1e-6);
  PF_ASSERT_OK(pfJobDestroy(ah));
  PF_ASSERT_OK(pfJobDestroy(bh));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// pfRuntimeGetStats keeps writing the 0.1 layout only; the V2 call honours the caller's size.
TEST(ConcurrentFill, StatsV2HonoursTheCallersSize) {
  TwoJobs t;
  ASSERT_NO_FATAL_FAILURE(t.init(/*fill_streams=*/2, 100, 1000));
  const pfBubbleHint_t hint = hint_of(100.0);
  t.stage.step(t.rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(t.rt));
  pfStats_t v1;
  std::memset(&v1, 0xAB, sizeof(v1));
  PF_ASSERT_OK(pfRuntimeGetStats(t.rt, &v1));
  unsigned char tail[sizeof(pfStats_t) - PF_STATS_V1_SIZE];
  std::memcpy(tail, reinterpret_cast<const unsigned char*>(&v1) + PF_STATS_V1_SIZE, sizeof(tail));
  for (unsigned char b : tail) EXPECT_EQ(b, 0xAB) << "pfRuntimeGetStats wrote past the 0.1 layout";
  // A bigger (newer) caller struct: the unknown tail reads 0.
  unsigned char big[sizeof(pfStats_t) + 16];
  std::memset(big, 0xCD, sizeof(big));
  PF_ASSERT_OK(pfRuntimeGetStatsV2(t.rt, reinterpret_cast<pfStats_t*>(big), sizeof(big)));
  for (size_t i = sizeof(pfStats_t); i < sizeof(big); ++i) EXPECT_EQ(big[i], 0) << i;
  pfStats_t v2{};
  std::memcpy(&v2, big, sizeof(v2));
  EXPECT_GT(v2.filled_sm_us, 0.0);
  EXPECT_EQ(v2.items_completed, v1.items_completed);
  EXPECT_EQ(pfRuntimeGetStatsV2(t.rt, &v2, PF_STATS_V1_SIZE - 1), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("stats_size"), std::string::npos);
  t.destroy();
}

TEST(ConcurrentFill, FillStreamsOutOfRangeIsRefusedByName) {
  WorldPtr world = make_world(1, kSms);
  for (int bad : {0, -3, 65}) {
    pfConfig_t c = sim_config(world.get(), 0, 1, kReserved);
    c.fill_streams = bad;
    pfRuntime_t rt = nullptr;
    EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument) << bad;
    EXPECT_EQ(rt, nullptr);
    const std::string message = pfGetLastErrorMessage();
    EXPECT_NE(message.find("fill_streams"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(bad)), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pipefill::testing
