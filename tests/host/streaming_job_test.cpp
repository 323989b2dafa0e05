// Streaming jobs (pfJobSetAvailable / pfJobEndInput) on the real-time host device, through the C
// API: a producer thread raises the available bound while the main thread runs bubbles, and
// every item is claimed exactly once, in index order, and never before the producer made it
// available; a job that ran dry is not failed and gets no slice until the bound is raised; the
// job completes only once its input ended and was drained. Bubbles end on fill progress or after
// a fixed delay, so nothing depends on this machine's speed; the real-time waits only turn a
// hang into a failure. Runs under TSan (label "host").
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "host/host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

struct StreamedJob {
  explicit StreamedJob(uint64_t n) : runs(n) {}
  alignas(8) uint64_t index_word = ~uint64_t{0};
  std::vector<std::atomic<uint32_t>> runs;
  std::atomic<uint64_t> executed{0};
  std::atomic<uint64_t> staged{0};         // what the producer made available (stored before the call)
  std::atomic<uint64_t> beyond_staged{0};  // items run that were not staged yet
  std::atomic<bool> in_order{true};

  static void on_item(void* user, uint64_t item) {
    auto* self = static_cast<StreamedJob*>(user);
    if (item >= self->staged.load()) self->beyond_staged++;
    if (item != self->executed.load()) self->in_order = false;
    if (item < self->runs.size()) self->runs[item]++;
    self->executed++;
  }

  pfGraphJobDesc_t desc(uint64_t item_count) {
    pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
    d.name = "streamed";
    d.item_count = item_count;
    d.item_cost_us = 200.0;
    d.index_word = &index_word;
    d.on_item = &on_item;
    d.user = this;
    d.available = 0;  // nothing staged yet
    return d;
  }
};

class HostStreamingJobTest : public HostRuntimeTest {
 protected:
  // One bubble that lasts `wait_us` of the main stream's time.
  void bubble(double wait_us) {
    ASSERT_NO_FATAL_FAILURE(begin_open_ended_bubble());
    ASSERT_EQ(pfHostStreamDelay(main_, wait_us), pfSuccess);
    ASSERT_NO_FATAL_FAILURE(end_bubble_and_iteration());
    ASSERT_EQ(pfHostStreamSynchronize(main_), pfSuccess);
  }
};

TEST_F(HostStreamingJobTest, DryJobWaitsAndRunsNothingUntilTheBoundIsRaised) {
  StreamedJob job(64);
  pfGraphJobDesc_t d = job.desc(64);
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt_, &d, &handle));
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(bubble(3000.0));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  EXPECT_EQ(job.executed.load(), 0u) << "nothing was available";
  EXPECT_EQ(info(handle).status, pfJobPending) << "a dry job is not failed";
  EXPECT_EQ(pfJobWait(handle, 1000.0), pfErrorTimeout) << "a dry job is not finished";

  job.staged = 5;
  PF_ASSERT_OK(pfJobSetAvailable(handle, 5));
  for (int i = 0; i < 40 && job.executed.load() < 5; ++i) ASSERT_NO_FATAL_FAILURE(bubble(3000.0));
  // More bubbles once it ran dry again: no item beyond the bound, still not failed.
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(bubble(3000.0));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  EXPECT_EQ(job.executed.load(), 5u);
  EXPECT_EQ(job.beyond_staged.load(), 0u);
  const pfJobInfo_t dry = info(handle);
  EXPECT_EQ(dry.status, pfJobRunning);
  EXPECT_EQ(dry.items_completed, 5u) << "the completed-items report a producer recycles by";

  // Lowering below what was claimed is refused and changes nothing.
  EXPECT_FAILS_WITH(pfJobSetAvailable(handle, 3), pfErrorInvalidArgument, "available = 3");
  // The input ends at the bound: all of it is done, so the job completes at once.
  PF_ASSERT_OK(pfJobEndInput(handle));
  PF_ASSERT_OK(pfJobWait(handle, 5e6));
  const pfJobInfo_t done = info(handle);
  EXPECT_EQ(done.item_count, 5u);
  EXPECT_EQ(done.items_completed, 5u);
  EXPECT_FAILS_WITH(pfJobSetAvailable(handle, 6), pfErrorInvalidState, "has ended");
  PF_ASSERT_OK(pfJobDestroy(handle));
}

TEST_F(HostStreamingJobTest, ConcurrentRaisesClaimEachItemOnceInOrder) {
  constexpr uint64_t kItems = 120;
  constexpr uint64_t kStep = 7;
  StreamedJob job(kItems);
  pfGraphJobDesc_t d = job.desc(kItems * 10);  // the input's end is not known up front
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt_, &d, &handle));
  std::atomic<bool> producer_failed{false};
  // The producer stages kStep items whenever the job is within 2 items of the bound, then ends
  // the input at kItems.
  std::thread producer([&] {
    uint64_t staged = 0;
    while (staged < kItems) {
      if (!eventually([&] { return job.executed.load() + 2 >= staged; },
                      std::chrono::milliseconds(10000))) {
        producer_failed = true;
        return;
      }
      staged = std::min(kItems, staged + kStep);
      job.staged = staged;
      if (pfJobSetAvailable(handle, staged) != pfSuccess) producer_failed = true;
    }
    if (pfJobEndInput(handle) != pfSuccess) producer_failed = true;
  });
  int bubbles = 0;
  for (; bubbles < 2000 && job.executed.load() < kItems && !producer_failed.load(); ++bubbles) {
    ASSERT_NO_FATAL_FAILURE(bubble(1500.0));
  }
  producer.join();
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  ASSERT_FALSE(producer_failed.load()) << pfGetLastErrorMessage();
  PF_ASSERT_OK(pfJobWait(handle, 5e6));
  EXPECT_EQ(job.executed.load(), kItems);
  for (uint64_t i = 0; i < kItems; ++i) EXPECT_EQ(job.runs[i].load(), 1u) << "item " << i;
  EXPECT_TRUE(job.in_order.load());
  EXPECT_EQ(job.beyond_staged.load(), 0u) << "an item ran before the producer staged it";
  const pfJobInfo_t done = info(handle);
  EXPECT_EQ(done.status, pfJobCompleted);
  EXPECT_EQ(done.item_count, kItems) << "pfJobEndInput: the item count is the final bound";
  EXPECT_EQ(done.items_completed, kItems);
  PF_ASSERT_OK(pfJobDestroy(handle));
}

TEST_F(HostStreamingJobTest, EndInputWithNothingAvailableIsRefused) {
  StreamedJob job(8);
  pfGraphJobDesc_t d = job.desc(8);
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt_, &d, &handle));
  EXPECT_FAILS_WITH(pfJobEndInput(handle), pfErrorInvalidArgument, "available = 0");
  EXPECT_EQ(info(handle).item_count, 8u) << "a refused call changes nothing";
  EXPECT_FAILS_WITH(pfJobSetAvailable(nullptr, 1), pfErrorInvalidArgument, "");
  PF_ASSERT_OK(pfJobDestroy(handle));
}

}  // namespace
}  // namespace pipefill::host::testing
