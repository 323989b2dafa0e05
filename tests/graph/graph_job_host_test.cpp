// Graph fill jobs on the real-time host device, through the C API: items run only while a bubble
// is open (at most the one item claimed before the gate closed runs past a bubble's end), every
// item runs exactly once in index order across bubbles, the index word holds the item when it
// runs, and pfHostNow reads the device clock. Bubbles end on fill progress (a host function
// waits for a number of items), so nothing depends on this machine's speed; the real-time waits
// only turn a hang into a failure. Runs under TSan (label "graph").
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "graph/graph_job_log.hpp"
#include "host/host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

constexpr size_t kMaxBubbles = 256;

struct HostGraphJob {
  explicit HostGraphJob(uint64_t n) : items(n), runs(n) {}
  uint64_t items;
  double item_cost_us = 300.0;
  alignas(8) uint64_t index_word = ~uint64_t{0};
  std::vector<std::atomic<uint32_t>> runs;
  std::atomic<uint64_t> executed{0};
  std::atomic<bool> in_order{true};
  std::atomic<bool> index_matches{true};
  std::atomic<int> teardowns{0};
  // Set by host functions on the main stream: is a bubble open, and how many have ended.
  std::atomic<bool> open{false};
  std::atomic<uint64_t> ended{0};
  std::array<std::atomic<uint64_t>, kMaxBubbles> started_outside{};  // per ended-bubble count

  static void on_item(void* user, uint64_t item) {
    auto* self = static_cast<HostGraphJob*>(user);
    if (std::atomic_ref<uint64_t>(self->index_word).load() != item) self->index_matches = false;
    if (item != self->executed.load()) self->in_order = false;
    if (!self->open.load()) self->started_outside[std::min<uint64_t>(self->ended.load(), kMaxBubbles - 1)]++;
    if (item < self->runs.size()) self->runs[item]++;
    self->executed++;
  }
  static void teardown(void* user) { static_cast<HostGraphJob*>(user)->teardowns++; }

  pfGraphJobDesc_t desc() { return ::pipefill::testing::graph_job_desc(*this, "host-graph"); }
};

struct OpenFlag {
  HostGraphJob* job;
  static void open_fn(void* user) { static_cast<HostGraphJob*>(user)->open = true; }
  static void close_fn(void* user) {
    auto* job = static_cast<HostGraphJob*>(user);
    job->open = false;
    job->ended++;
  }
};

// Holds the main stream inside the bubble until the job executed `target` items in total.
struct ProgressWait {
  HostGraphJob* job = nullptr;
  uint64_t target = 0;
  static void fn(void* user) {
    auto* self = static_cast<ProgressWait*>(user);
    eventually([&] { return self->job->executed.load() >= self->target; },
               std::chrono::milliseconds(3000));
  }
};

class HostGraphJobTest : public HostRuntimeTest {
 protected:
  void SetUp() override {
    HostRuntimeTest::SetUp();
    waits_.reserve(kMaxBubbles);
  }

  // One bubble that lasts until the job has executed `target` items.
  void bubble(HostGraphJob& job, uint64_t target) {
    // The open flag is set just before the begin event, in stream order: set after it, an item
    // the fill stream starts between the begin event and the flag (the main stream's thread
    // descheduled there, as under a loaded TSan run) would count as outside its bubble.
    ASSERT_EQ(pfHostLaunchHostFunc(main_, &OpenFlag::open_fn, &job), pfSuccess);
    ASSERT_NO_FATAL_FAILURE(begin_open_ended_bubble());
    waits_.push_back(ProgressWait{&job, target});
    ASSERT_EQ(pfHostLaunchHostFunc(main_, &ProgressWait::fn, &waits_.back()), pfSuccess);
    ASSERT_NO_FATAL_FAILURE(end_bubble_and_iteration());
    ASSERT_EQ(pfHostLaunchHostFunc(main_, &OpenFlag::close_fn, &job), pfSuccess);
    // The stage's compute between bubbles: no fill work may run in it.
    ASSERT_EQ(pfHostStreamDelay(main_, 2000.0), pfSuccess);
    ASSERT_EQ(pfHostStreamSynchronize(main_), pfSuccess);
  }

  std::vector<ProgressWait> waits_;
};

TEST_F(HostGraphJobTest, ItemsRunOnceInOrderAndOnlyInsideBubbles) {
  HostGraphJob job(30);
  pfGraphJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt_, &d, &handle));
  int bubbles = 0;
  for (; bubbles < 60 && job.executed.load() < job.items; ++bubbles) {
    const uint64_t target = std::min<uint64_t>(job.items, job.executed.load() + 4);
    ASSERT_NO_FATAL_FAILURE(bubble(job, target));
  }
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  PF_ASSERT_OK(pfJobWait(handle, 5e6));
  EXPECT_EQ(job.executed.load(), job.items);
  for (uint64_t i = 0; i < job.items; ++i) EXPECT_EQ(job.runs[i].load(), 1u) << "item " << i;
  EXPECT_TRUE(job.in_order.load()) << "one graph instance claims items in index order";
  EXPECT_TRUE(job.index_matches.load()) << "the index word holds the item while it runs";
  EXPECT_GE(bubbles, 5) << "the job must span several bubbles";
  // The gate: after a bubble's end at most the one item claimed just before it starts late.
  uint64_t outside = 0;
  for (size_t b = 0; b < kMaxBubbles; ++b) {
    EXPECT_LE(job.started_outside[b].load(), 1u) << "after " << b << " ended bubbles";
    outside += job.started_outside[b].load();
  }
  EXPECT_LE(outside, static_cast<uint64_t>(bubbles));
  pfStats_t s{};
  PF_ASSERT_OK(pfRuntimeGetStats(rt_, &s));
  EXPECT_EQ(s.items_completed, job.items);
  EXPECT_EQ(s.jobs_completed, 1u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(job.teardowns.load(), 1);
}

TEST_F(HostGraphJobTest, DestroyedMidJobRunsNoFurtherItem) {
  HostGraphJob job(1000);
  pfGraphJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt_, &d, &handle));
  ASSERT_NO_FATAL_FAILURE(bubble(job, 3));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(job.teardowns.load(), 1);
  const uint64_t at_destroy = job.executed.load();
  EXPECT_GE(at_destroy, 3u);
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 5000.0;
  PF_ASSERT_OK(pfBubbleBegin(rt_, main_, &hint));
  PF_ASSERT_OK(pfHostStreamDelay(main_, 3000.0));
  PF_ASSERT_OK(pfBubbleEnd(rt_, main_));
  PF_ASSERT_OK(pfHostStreamSynchronize(main_));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  EXPECT_EQ(job.executed.load(), at_destroy);
}

TEST_F(HostGraphJobTest, HostNowReadsTheDeviceClock) {
  double t0 = -1.0, t1 = -1.0;
  PF_ASSERT_OK(pfHostNow(main_, &t0));
  PF_ASSERT_OK(pfHostStreamDelay(main_, 500.0));
  PF_ASSERT_OK(pfHostStreamSynchronize(main_));
  PF_ASSERT_OK(pfHostNow(main_, &t1));
  EXPECT_GE(t0, 0.0);
  EXPECT_GE(t1 - t0, 500.0) << "the clock advanced at least by the stream's delay";
  EXPECT_FAILS_WITH(pfHostNow(main_, nullptr), pfErrorInvalidArgument, "time_us is NULL");
  int not_a_stream = 0;
  double t = 0.0;
  EXPECT_EQ(pfHostNow(&not_a_stream, &t), pfErrorInvalidArgument);
}

}  // namespace
}  // namespace pipefill::host::testing
