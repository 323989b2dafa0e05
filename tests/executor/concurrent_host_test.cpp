// Concurrent fill (issue 11 item 1) on the real-time host device: the executor thread packs a
// parallelism-1 job and a parallelism-64 job into one bubble, their slices run side by side on
// two fill streams, the gate bounds what starts after the bubble end to one item per block, and
// every item runs exactly once. Asserts counts and ordering only, never times. Runs under TSan.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "host/host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

constexpr int kFillSms = 65;
constexpr uint64_t kMaxBubbles = 256;
constexpr double kItemHintUs = 100.0;

struct Flags {
  std::array<std::atomic<bool>, kMaxBubbles> ended{};
};

// A ticket job counting its items per item and per bubble (independently of the runtime).
struct CountedJob {
  CountedJob(const char* job_name, uint64_t count, int parallelism_)
      : name(job_name), items(count), parallelism(parallelism_), runs(count) {}
  const char* name;
  uint64_t items;
  int parallelism;
  Flags* flags = nullptr;
  std::vector<std::atomic<uint32_t>> runs;
  std::array<std::atomic<uint64_t>, kMaxBubbles> in_bubble{};
  std::array<std::atomic<uint64_t>, kMaxBubbles> after_end{};
  std::mutex mutex;
  std::vector<pfSliceDesc_t> slices;  // bubble slices as launched
  struct Context {
    CountedJob* job;
    uint64_t bubble;
  };
  std::array<Context, kMaxBubbles> contexts{};

  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<CountedJob*>(user);
    if (slice->max_items == 0) return pfSuccess;  // pfJobCreate's warm-up
    if (slice->bubble_id >= kMaxBubbles) return pfErrorInvalidArgument;
    {
      std::lock_guard lock(self->mutex);
      self->slices.push_back(*slice);
    }
    Context& c = self->contexts[slice->bubble_id];
    c = Context{self, slice->bubble_id};
    return pfHostLaunchTicketKernel(stream, slice, slice->max_blocks, &item_fn, &c);
  }
  static void item_fn(void* user, uint64_t item) {
    auto* c = static_cast<Context*>(user);
    CountedJob* self = c->job;
    if (self->flags->ended[c->bubble].load()) self->after_end[c->bubble].fetch_add(1);
    if (item < self->runs.size()) self->runs[item].fetch_add(1);
    self->in_bubble[c->bubble].fetch_add(1);
  }
  pfJobDesc_t desc(pfJobConfig_t* config) {
    *config = pfJobConfig_t{};
    config->item_cost_us = kItemHintUs;
    config->parallelism = parallelism;
    pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
    d.name = name;
    d.kind = pfJobTicket;
    d.item_count = items;
    d.item_cost_hint_us = kItemHintUs;
    d.configs = config;
    d.config_count = 1;
    d.user = this;
    d.launch = &launch;
    return d;
  }
  uint64_t total() const {
    uint64_t n = 0;
    for (const auto& r : runs) n += r.load();
    return n;
  }
  bool every_item_once() const {
    for (const auto& r : runs) {
      if (r.load() != 1) return false;
    }
    return true;
  }
  std::vector<pfSliceDesc_t> slices_of(uint64_t bubble) {
    std::lock_guard lock(mutex);
    std::vector<pfSliceDesc_t> out;
    for (const auto& s : slices) {
      if (s.bubble_id == bubble) out.push_back(s);
    }
    return out;
  }
};

// Holds the main stream inside the bubble until both jobs ran an item in it.
struct BothRan {
  CountedJob* a;
  CountedJob* b;
  uint64_t bubble;
  static void fn(void* user) {
    auto* self = static_cast<BothRan*>(user);
    eventually([&] {
      return self->a->in_bubble[self->bubble].load() > 0 &&
             self->b->in_bubble[self->bubble].load() > 0;
    });
  }
};

TEST(ConcurrentHostFill, TwoJobsRunSideBySideInOneBubbleExactlyOnce) {
  setenv("PIPEFILL_HOST_SMS", "65", 1);
  pfConfig_t c = host_test_config();  // plans from the hints: independent of timing
  c.policy = pfPolicyFifo;
  c.fill_streams = 4;
  pfRuntime_t rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
  void* main = nullptr;
  PF_ASSERT_OK(pfStreamCreateHighPriority(rt, &main));

  Flags flags;
  CountedJob narrow("narrow", 40, 1), wide("wide", 3000, 64);
  narrow.flags = wide.flags = &flags;
  pfJobConfig_t nc, wc;
  pfJobDesc_t nd = narrow.desc(&nc), wd = wide.desc(&wc);
  pfJob_t nh = nullptr, wh = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &nd, &nh));
  PF_ASSERT_OK(pfJobCreate(rt, &wd, &wh));

  // The planner takes a launch overhead (5 µs on this backend) per slice enqueued before and
  // including a slice: with 1050 µs the first two slices keep 10 whole 100 µs items per SM.
  constexpr double kExpectedUs = 1050.0;
  std::vector<BothRan> waits;
  waits.reserve(kMaxBubbles);
  // The bubbles after the first, which only have to finish the jobs, are longer: the runtime
  // learns item costs from measured slices (core/cost_model.hpp), and on a loaded machine (TSan,
  // 65 host SM threads on 2 cores) an item measures several times its 100 us, more than a
  // 1050 us bubble holds; what this test checks of packing is the first bubble's.
  constexpr double kLaterUs = 20000.0;
  auto bubble = [&](uint64_t id, bool wait_for_both) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = id == 1 ? kExpectedUs : kLaterUs;
    EXPECT_EQ(pfBubbleBegin(rt, main, &hint), pfSuccess) << pfGetLastErrorMessage();
    if (wait_for_both) {
      waits.push_back(BothRan{&narrow, &wide, id});
      EXPECT_EQ(pfHostLaunchHostFunc(main, &BothRan::fn, &waits.back()), pfSuccess);
    }
    EXPECT_EQ(pfHostStreamDelay(main, id == 1 ? 200.0 : kLaterUs), pfSuccess);
    EXPECT_EQ(pfBubbleEnd(rt, main), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfHostLaunchHostFunc(main, &set_flag_fn, &flags.ended[id]), pfSuccess);
    EXPECT_EQ(pfIterationEnd(rt), pfSuccess);
  };

  bubble(1, /*wait_for_both=*/true);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  // Packed by time x SMs: the narrow job's one SM and the wide job's 64 fill the 65 fill SMs,
  // each for floor((1050 - 2 x 5) / 100) = 10 items per SM.
  const auto ns = narrow.slices_of(1), ws = wide.slices_of(1);
  ASSERT_EQ(ns.size(), 1u);
  ASSERT_EQ(ws.size(), 1u);
  EXPECT_EQ(ns[0].max_blocks, 1);
  EXPECT_EQ(ws[0].max_blocks, 64);
  EXPECT_EQ(ns[0].max_blocks + ws[0].max_blocks, kFillSms);
  EXPECT_EQ(ns[0].max_items, 10u);
  EXPECT_EQ(ws[0].max_items, 640u);
  EXPECT_GT(narrow.in_bubble[1].load(), 0u);
  EXPECT_GT(wide.in_bubble[1].load(), 0u);
  // The gate: after the bubble end at most one item starts per block of each slice.
  EXPECT_LE(narrow.after_end[1].load(), 1u);
  EXPECT_LE(wide.after_end[1].load(), 64u);

  for (uint64_t id = 2; id < kMaxBubbles; ++id) {
    pfJobInfo_t ni{}, wi{};
    PF_ASSERT_OK(pfJobGetStatus(nh, &ni));
    PF_ASSERT_OK(pfJobGetStatus(wh, &wi));
    if (ni.status == pfJobCompleted && wi.status == pfJobCompleted) break;
    bubble(id, /*wait_for_both=*/false);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
    EXPECT_LE(narrow.after_end[id].load(), 1u) << id;
    EXPECT_LE(wide.after_end[id].load(), 64u) << id;
  }
  pfJobInfo_t ni{}, wi{};
  PF_ASSERT_OK(pfJobGetStatus(nh, &ni));
  PF_ASSERT_OK(pfJobGetStatus(wh, &wi));
  EXPECT_EQ(ni.status, pfJobCompleted);
  EXPECT_EQ(wi.status, pfJobCompleted);
  EXPECT_TRUE(narrow.every_item_once());
  EXPECT_TRUE(wide.every_item_once());
  pfStats_t s{};
  PF_ASSERT_OK(pfRuntimeGetStatsV2(rt, &s, sizeof(s)));
  EXPECT_EQ(s.items_completed, narrow.total() + wide.total());
  EXPECT_GT(s.filled_sm_us, 0.0);
  EXPECT_LE(s.filled_sm_us, s.capacity_sm_us * (1.0 + 1e-9));
  PF_ASSERT_OK(pfJobDestroy(nh));
  PF_ASSERT_OK(pfJobDestroy(wh));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
  unsetenv("PIPEFILL_HOST_SMS");
}

}  // namespace
}  // namespace pipefill::host::testing
