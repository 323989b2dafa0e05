// pfRuntimeSetSliceObserver on the real-time host device: every launched slice gets a start call
// and an end call on its fill stream's thread, every item of the slice runs between the two, the
// calls name the slice's bubble and job, removal stops them, and the other backends refuse the
// observer with a message naming theirs. In both launch modes (executor: the slice's tail
// follows it; inline: pfBubbleEnd enqueues the tail). Runs under TSan (label "host"). Counts and
// orders only.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

// What the observer saw, checked by the items: an item that runs while no slice of its job is
// between its start and end call is counted in items_outside.
struct Observed {
  std::mutex mutex;
  std::vector<pfSliceEvent_t> events;  // job_name replaced by nullptr (valid during the call only)
  std::vector<std::string> job_names;
  std::set<std::thread::id> threads;
  std::atomic<int> open{0};
  std::atomic<uint64_t> items{0};
  std::atomic<uint64_t> items_outside{0};

  static void observe(void* user, const pfSliceEvent_t* event) {
    auto* self = static_cast<Observed*>(user);
    if (event->phase == pfSliceStart) self->open.fetch_add(1);
    if (event->phase == pfSliceEnd) self->open.fetch_sub(1);
    std::lock_guard lock(self->mutex);
    pfSliceEvent_t copy = *event;
    copy.job_name = nullptr;
    self->events.push_back(copy);
    self->job_names.emplace_back(event->job_name != nullptr ? event->job_name : "");
    self->threads.insert(std::this_thread::get_id());
  }

  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    if (slice->max_items == 0) return pfSuccess;  // pfJobCreate's warm-up
    return pfHostLaunchTicketKernel(stream, slice, slice->max_blocks, &item, user);
  }
  static void item(void* user, uint64_t) {
    auto* self = static_cast<Observed*>(user);
    self->items.fetch_add(1);
    if (self->open.load() <= 0) self->items_outside.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
};

class SliceObserver : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    setenv("PIPEFILL_HOST_SMS", "2", 1);
    pfConfig_t c = host_test_config();  // every bubble planned from its hint
    c.launch_mode = GetParam();
    PF_ASSERT_OK(pfRuntimeCreate(&c, &rt_));
    PF_ASSERT_OK(pfStreamCreateHighPriority(rt_, &main_));
    pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
    desc.name = "observed-job";
    desc.item_count = 1000000;
    desc.item_cost_hint_us = 100.0;
    desc.launch = &Observed::launch;
    desc.user = &observed_;
    PF_ASSERT_OK(pfJobCreate(rt_, &desc, &job_));
  }
  void TearDown() override {
    if (job_ != nullptr) EXPECT_EQ(pfJobDestroy(job_), pfSuccess) << pfGetLastErrorMessage();
    if (rt_ != nullptr) EXPECT_EQ(pfRuntimeDestroy(rt_), pfSuccess) << pfGetLastErrorMessage();
    unsetenv("PIPEFILL_HOST_SMS");
  }
  void bubbles(int count) {
    for (int i = 0; i < count; ++i) {
      pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
      hint.expected_duration_us = 2000.0;
      ASSERT_EQ(pfBubbleBegin(rt_, main_, &hint), pfSuccess) << pfGetLastErrorMessage();
      ASSERT_EQ(pfHostStreamDelay(main_, 2000.0), pfSuccess);
      ASSERT_EQ(pfBubbleEnd(rt_, main_), pfSuccess) << pfGetLastErrorMessage();
      ASSERT_EQ(pfIterationEnd(rt_), pfSuccess);
      ASSERT_EQ(pfHostStreamSynchronize(main_), pfSuccess);
    }
    PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  }
  uint64_t slices_launched() {
    pfStats_t s{};
    EXPECT_EQ(pfRuntimeGetStats(rt_, &s), pfSuccess);
    return s.slices_launched;
  }

  pfRuntime_t rt_ = nullptr;
  void* main_ = nullptr;
  pfJob_t job_ = nullptr;
  Observed observed_;
};

TEST_P(SliceObserver, CallsStartAndEndAroundEverySliceOnItsFillStream) {
  PF_ASSERT_OK(pfRuntimeSetSliceObserver(rt_, &Observed::observe, &observed_));
  bubbles(6);
  const uint64_t launched = slices_launched();
  ASSERT_GT(launched, 0u) << "no slice was launched: nothing observed";
  std::lock_guard lock(observed_.mutex);
  ASSERT_EQ(observed_.events.size(), 2 * launched);
  EXPECT_EQ(observed_.open.load(), 0);
  // Calls come in start/end pairs per fill stream (one slice of a stream at a time), each pair
  // naming one bubble of this test (ids 1..6) and the job.
  std::vector<int> open_per_stream(8, 0);
  std::vector<uint64_t> bubble_per_stream(8, 0);
  std::set<uint64_t> bubbles_seen;
  for (size_t i = 0; i < observed_.events.size(); ++i) {
    const pfSliceEvent_t& e = observed_.events[i];
    EXPECT_EQ(e.size, sizeof(pfSliceEvent_t));
    EXPECT_EQ(observed_.job_names[i], "observed-job");
    ASSERT_GE(e.fill_stream, 0);
    ASSERT_LT(e.fill_stream, 8);
    EXPECT_GE(e.bubble_id, 1u);
    EXPECT_LE(e.bubble_id, 6u);
    EXPECT_GE(e.max_items, 1u);
    if (e.phase == pfSliceStart) {
      EXPECT_EQ(open_per_stream[e.fill_stream]++, 0) << "two starts without an end";
      bubble_per_stream[e.fill_stream] = e.bubble_id;
      bubbles_seen.insert(e.bubble_id);
    } else {
      ASSERT_EQ(e.phase, pfSliceEnd);
      EXPECT_EQ(open_per_stream[e.fill_stream]--, 1) << "an end without a start";
      EXPECT_EQ(bubble_per_stream[e.fill_stream], e.bubble_id);
    }
  }
  EXPECT_GE(bubbles_seen.size(), 1u);
  // Every item ran between its slice's start and end call, and none on the test's thread.
  EXPECT_GT(observed_.items.load(), 0u);
  EXPECT_EQ(observed_.items_outside.load(), 0u);
  EXPECT_EQ(observed_.threads.count(std::this_thread::get_id()), 0u);
}

TEST_P(SliceObserver, RemovedObserverIsNotCalledAgain) {
  PF_ASSERT_OK(pfRuntimeSetSliceObserver(rt_, &Observed::observe, &observed_));
  bubbles(2);
  const uint64_t launched = slices_launched();
  ASSERT_GT(launched, 0u);
  PF_ASSERT_OK(pfRuntimeSetSliceObserver(rt_, nullptr, nullptr));
  bubbles(3);
  EXPECT_GT(slices_launched(), launched);  // slices still launched, no longer observed
  std::lock_guard lock(observed_.mutex);
  EXPECT_EQ(observed_.events.size(), 2 * launched);
}

INSTANTIATE_TEST_SUITE_P(LaunchModes, SliceObserver,
                         ::testing::Values(static_cast<int>(pfLaunchExecutor),
                                           static_cast<int>(pfLaunchInline)),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == pfLaunchInline ? std::string("Inline")
                                                               : std::string("Executor");
                         });

TEST(SliceObserverBackends, TheSimulatorRefusesNamingItsBackend) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendSim;
  c.log_level = pfLogWarn;
  pfRuntime_t rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
  Observed observed;
  EXPECT_FAILS_WITH(pfRuntimeSetSliceObserver(rt, &Observed::observe, &observed),
                    pfErrorNotSupported, "needs the host backend");
  EXPECT_FAILS_WITH(pfRuntimeSetSliceObserver(nullptr, &Observed::observe, &observed),
                    pfErrorInvalidArgument, "pfRuntimeSetSliceObserver");
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
}

}  // namespace
}  // namespace pipefill::host::testing
