// The real-time host device on its own (src/host/): stream order, concurrency between streams,
// events with real timestamps, stream-ordered words, ticket kernels claiming exactly once inside
// the fill partition, the gate stopping claims with an overrun of at most one item per block,
// handle validation and the pfHost* C API. Runs under TSan (label "host").
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/callback_scope.hpp"
#include "host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

TEST(HostDevice, OperationsOfOneStreamRunInOrder) {
  auto device = make_host_device(4);
  void* stream = make_stream(*device);
  MarkLog log;
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(2, &words));
  PF_ASSERT_OK(pfHostLaunchHostFunc(stream, &MarkLog::mark_fn, log.mark(1)));
  PF_ASSERT_OK(pfHostStreamDelay(stream, 300.0));
  PF_ASSERT_OK(pfHostLaunchHostFunc(stream, &MarkLog::mark_fn, log.mark(2)));
  PF_ASSERT_OK(device->write_word(stream, &words[0], 41));
  PF_ASSERT_OK(device->copy_word_to_host(stream, &words[0], &words[1]));
  PF_ASSERT_OK(device->write_word(stream, &words[0], 42));
  PF_ASSERT_OK(pfHostLaunchHostFunc(stream, &MarkLog::mark_fn, log.mark(3)));
  PF_ASSERT_OK(device->synchronize_stream(stream));
  EXPECT_EQ(log.marks(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(words[0], 42u);
  EXPECT_EQ(words[1], 41u);  // the copy ran between the two writes
  PF_ASSERT_OK(device->free_words(words));
}

// pfBubbleCloseFill's gate write: an atomic max in stream order, so a close that lands after a
// later bubble's plain close leaves the later id in place.
TEST(HostDevice, WriteWordMaxNeverLowersTheWord) {
  auto device = make_host_device(4);
  void* stream = make_stream(*device);
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(3, &words));
  PF_ASSERT_OK(device->write_word(stream, &words[0], 5));
  PF_ASSERT_OK(device->write_word_max(stream, &words[0], 3));  // lower: no change
  PF_ASSERT_OK(device->copy_word_to_host(stream, &words[0], &words[1]));
  PF_ASSERT_OK(device->write_word_max(stream, &words[0], 9));  // higher: raised
  PF_ASSERT_OK(device->copy_word_to_host(stream, &words[0], &words[2]));
  PF_ASSERT_OK(device->synchronize_stream(stream));
  EXPECT_EQ(words[1], 5u);
  EXPECT_EQ(words[2], 9u);
  EXPECT_EQ(words[0], 9u);
  EXPECT_FAILS_WITH(device->write_word_max(stream, nullptr, 1), pfErrorInvalidArgument, "NULL");
  PF_ASSERT_OK(device->free_words(words));
}

TEST(HostDevice, StreamsRunIndependently) {
  auto device = make_host_device(4);
  void* blocked = make_stream(*device);
  void* free_running = make_stream(*device);
  Latch latch;
  MarkLog log;
  PF_ASSERT_OK(pfHostLaunchHostFunc(blocked, &Latch::wait_fn, &latch));
  PF_ASSERT_OK(pfHostLaunchHostFunc(blocked, &MarkLog::mark_fn, log.mark(1)));
  PF_ASSERT_OK(pfHostLaunchHostFunc(free_running, &MarkLog::mark_fn, log.mark(2)));
  // The second stream drains while the first one is still blocked.
  PF_ASSERT_OK(pfHostStreamSynchronize(free_running));
  EXPECT_EQ(log.marks(), (std::vector<int>{2}));
  latch.open();
  PF_ASSERT_OK(pfHostStreamSynchronize(blocked));
  EXPECT_EQ(log.marks(), (std::vector<int>{2, 1}));
}

TEST(HostDevice, EventsCompleteInStreamOrderWithRealTimestamps) {
  auto device = make_host_device(4);
  void* stream = make_stream(*device);
  void* first = make_event(*device);
  void* second = make_event(*device);
  bool done = true;
  double t = 0.0;
  EXPECT_EQ(device->query_event(first, &done, &t), pfErrorInvalidState);  // never recorded
  PF_ASSERT_OK(device->synchronize_event(first));  // never recorded: nothing to wait for
  Latch latch;
  const double before = device->now_us();
  PF_ASSERT_OK(pfHostLaunchHostFunc(stream, &Latch::wait_fn, &latch));
  PF_ASSERT_OK(device->record_event(first, stream));
  PF_ASSERT_OK(pfHostStreamDelay(stream, 2000.0));
  PF_ASSERT_OK(device->record_event(second, stream));
  PF_ASSERT_OK(device->query_event(first, &done, &t));
  EXPECT_FALSE(done);  // behind the latch
  latch.open();
  PF_ASSERT_OK(device->synchronize_event(second));
  double t1 = 0.0, t2 = 0.0;
  PF_ASSERT_OK(device->query_event(first, &done, &t1));
  EXPECT_TRUE(done);
  PF_ASSERT_OK(device->query_event(second, &done, &t2));
  EXPECT_TRUE(done);
  EXPECT_GE(t1, before);
  // A delay sleeps at least its duration, so the second record is at least 2 ms later.
  EXPECT_GE(t2 - t1, 2000.0);
  EXPECT_LE(t2, device->now_us());
}

TEST(HostDevice, WaitCapturesTheRecordThatIsLatestWhenEnqueued) {
  auto device = make_host_device(4);
  void* producer = make_stream(*device);
  void* consumer = make_stream(*device);
  void* other = make_stream(*device);
  void* event = make_event(*device);
  Latch latch;
  MarkLog log;
  PF_ASSERT_OK(pfHostLaunchHostFunc(producer, &Latch::wait_fn, &latch));
  PF_ASSERT_OK(pfHostLaunchHostFunc(producer, &MarkLog::mark_fn, log.mark(1)));
  PF_ASSERT_OK(device->record_event(event, producer));
  PF_ASSERT_OK(device->stream_wait_event(consumer, event));
  PF_ASSERT_OK(pfHostLaunchHostFunc(consumer, &MarkLog::mark_fn, log.mark(2)));
  // A later record of the same event completes at once; the wait still waits for the first.
  PF_ASSERT_OK(device->record_event(event, other));
  PF_ASSERT_OK(pfHostStreamSynchronize(other));
  PF_ASSERT_OK(pfHostLaunchHostFunc(other, &MarkLog::mark_fn, log.mark(3)));
  PF_ASSERT_OK(pfHostStreamSynchronize(other));
  EXPECT_EQ(log.marks(), (std::vector<int>{3}));
  latch.open();
  PF_ASSERT_OK(pfHostStreamSynchronize(consumer));
  EXPECT_EQ(log.marks(), (std::vector<int>{3, 1, 2}));
}

TEST(HostDevice, WordsAreAlignedZeroedAndFreedOnce) {
  auto device = make_host_device(2);
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(5, &words));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(words) % 256, 0u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(words[i], 0u);
  PF_ASSERT_OK(device->free_words(words));
  EXPECT_FAILS_WITH(device->free_words(words), pfErrorInvalidArgument, "not allocated");
  EXPECT_FAILS_WITH(device->allocate_words(0, &words), pfErrorInvalidArgument, "word count 0");
}

// Freeing words that queued operations still use defers the free until they ran (ASan checks
// that the late write does not touch freed memory); new operations on them are refused.
TEST(HostDevice, FreeingWordsInUseIsDeferredUntilTheQueuedOperationsRan) {
  auto device = make_host_device(2);
  void* stream = make_stream(*device);
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(3, &words));
  Latch latch;
  PF_ASSERT_OK(pfHostLaunchHostFunc(stream, &Latch::wait_fn, &latch));
  PF_ASSERT_OK(device->write_word(stream, &words[2], 7));
  PF_ASSERT_OK(device->free_words(words));
  EXPECT_FAILS_WITH(device->write_word(stream, &words[1], 1), pfErrorInvalidArgument, "freed");
  EXPECT_FAILS_WITH(device->free_words(words), pfErrorInvalidArgument, "freed already");
  latch.open();
  PF_ASSERT_OK(pfHostStreamSynchronize(stream));
}

TEST(HostDevice, PartitionLimitsConcurrentFillBlocks) {
  auto device = make_host_device(6);
  FillPartition partition;
  EXPECT_FAILS_WITH(device->configure_partition(6, &partition), pfErrorInvalidArgument,
                    "reserved_sms 6");
  PF_ASSERT_OK(device->configure_partition(2, &partition));
  EXPECT_EQ(partition.fill_sms, 4);
  EXPECT_EQ(partition.total_sms, 6);
  EXPECT_EQ(partition.mode, "host-threads");
  void* fill_a = make_fill_stream(*device);
  void* fill_b = make_fill_stream(*device);
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(3, &words));
  pfSliceDesc_t slice = ticket_slice(words, 1, 200, 200, 6);
  ItemCounter counter(300, /*sleep_us=*/50);
  // Two fill streams ask for 6 + 6 blocks; only 4 may run at once.
  PF_ASSERT_OK(pfHostLaunchTicketKernel(fill_a, &slice, 6, &ItemCounter::item_fn, &counter));
  PF_ASSERT_OK(pfHostLaunchOpaque(fill_b, 200, 100, 6, &ItemCounter::item_fn, &counter));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill_a));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill_b));
  EXPECT_EQ(counter.executed.load(), 300u);
  for (uint64_t i = 0; i < 300; ++i) ASSERT_EQ(counter.runs[i].load(), 1u) << "item " << i;
  EXPECT_LE(counter.max_in_flight.load(), 4);
  EXPECT_LE(device->engine().max_concurrent_blocks(), 4);
  EXPECT_GE(device->engine().max_concurrent_blocks(), 1);
  PF_ASSERT_OK(device->free_words(words));
}

// A ticket launch that asks for the time budget (the host device's Python-item graph launches do)
// starts no item expected to end more than half an item past its slice's time_budget_us (the mean
// of its items so far judges): 2 ms of 500 us items on one block runs 4 of its 40 planned items
// (3 if the machine stretches them) - what ran past each bubble's end when the planner counted
// items at their fastest. A launch that does not ask (the C API's, the C++ ticket kernels), or an
// engine with the option off (PIPEFILL_HOST_TIME_BUDGET unset or 0), runs all 40.
TEST(HostDevice, TicketLaunchesThatAskStopAtTheirSlicesTimeBudget) {
  struct Case {
    bool engine_option, launch_asks;
  };
  for (const Case c : {Case{true, true}, Case{true, false}, Case{false, true}}) {
    auto device = make_host_device(2, c.engine_option);
    void* fill = make_fill_stream(*device);
    uint64_t* words = nullptr;
    PF_ASSERT_OK(device->allocate_words(3, &words));
    pfSliceDesc_t slice = ticket_slice(words, 1, 40, 40, 1);
    slice.time_budget_us = 2000.0;
    ItemCounter counter(40, /*sleep_us=*/500);
    PF_ASSERT_OK(device->engine().launch_ticket(fill, &slice, 1, &ItemCounter::item_fn, &counter,
                                                c.launch_asks));
    PF_ASSERT_OK(pfHostStreamSynchronize(fill));
    if (c.engine_option && c.launch_asks) {
      EXPECT_GE(counter.executed.load(), 1u);
      EXPECT_LE(counter.executed.load(), 4u) << "no item started that would end past 2250 us";
    } else {
      EXPECT_EQ(counter.executed.load(), 40u)
          << "option " << c.engine_option << ", launch asks " << c.launch_asks;
    }
    PF_ASSERT_OK(device->free_words(words));
  }
}

// What the runtime does per bubble: zero the budget, launch a ticket kernel on the fill stream;
// the main stream closes the gate once the blocks ran 20 items of the bubble (items past the
// 20th are still running when the gate closes: they wait for it). Every item runs exactly once,
// and after each close at most one item per block starts (the overrun bound).
TEST(HostDevice, TicketKernelsClaimEveryItemOnceAndStopAtTheGate) {
  constexpr int kSms = 4;
  constexpr uint64_t kTotal = 600;
  constexpr uint64_t kPerBubble = 20;
  auto device = make_host_device(kSms);
  void* fill = make_fill_stream(*device);
  void* main = make_stream(*device, kHighestPriority);
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(3, &words));
  struct Bubble {
    uint64_t id = 0;
    uint64_t* gate = nullptr;
    std::vector<std::atomic<uint32_t>>* runs = nullptr;
    std::atomic<uint64_t> started{0};
    uint64_t started_at_close = 0;
    static void item_fn(void* user, uint64_t item) {
      auto* self = static_cast<Bubble*>(user);
      const uint64_t n = self->started.fetch_add(1);
      (*self->runs)[item].fetch_add(1);
      if (n >= kPerBubble) {
        while (std::atomic_ref<uint64_t>(*self->gate).load() < self->id) std::this_thread::yield();
      }
    }
    static void wait_for_progress(void* user) {  // the main stream, inside the bubble
      auto* self = static_cast<Bubble*>(user);
      eventually([&] { return self->started.load() >= kPerBubble; },
                 std::chrono::milliseconds(200));  // the end of the job: fewer items left
    }
    static void snapshot(void* user) {
      auto* self = static_cast<Bubble*>(user);
      self->started_at_close = self->started.load();
    }
  };
  std::vector<std::atomic<uint32_t>> runs(kTotal);
  std::vector<std::unique_ptr<Bubble>> bubbles;
  uint64_t mid_job_closes = 0;
  while (std::atomic_ref<uint64_t>(words[1]).load() < kTotal && bubbles.size() < 100) {
    bubbles.push_back(std::make_unique<Bubble>());
    Bubble& b = *bubbles.back();
    b.id = bubbles.size();
    b.gate = &words[0];
    b.runs = &runs;
    PF_ASSERT_OK(device->write_word(fill, &words[2], 0));
    pfSliceDesc_t slice = ticket_slice(words, b.id, b.id % 3 == 0 ? 30 : kTotal, kTotal, kSms);
    PF_ASSERT_OK(pfHostLaunchTicketKernel(fill, &slice, 8, &Bubble::item_fn, &b));
    PF_ASSERT_OK(pfHostLaunchHostFunc(main, &Bubble::wait_for_progress, &b));
    PF_ASSERT_OK(device->write_word(main, &words[0], b.id));
    PF_ASSERT_OK(pfHostLaunchHostFunc(main, &Bubble::snapshot, &b));
    PF_ASSERT_OK(device->synchronize_stream(main));
    PF_ASSERT_OK(device->synchronize_stream(fill));
    // Items started after the close were claimed before it: one per block at most.
    EXPECT_LE(b.started.load() - b.started_at_close, static_cast<uint64_t>(kSms))
        << "bubble " << b.id;
    if (std::atomic_ref<uint64_t>(words[1]).load() < kTotal) ++mid_job_closes;
  }
  // Each bubble runs 20 to 24 items: the job needs at least 25 bubbles, all but the last mid-job.
  EXPECT_GE(mid_job_closes, kTotal / (kPerBubble + kSms) - 1);
  ASSERT_GE(std::atomic_ref<uint64_t>(words[1]).load(), kTotal);
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(runs[i].load(), 1u) << "item " << i;
  EXPECT_LE(device->engine().max_concurrent_blocks(), kSms);
  PF_ASSERT_OK(device->free_words(words));
}

TEST(HostDevice, ClosedGateStopsEveryClaimButOpaqueWorkIgnoresIt) {
  auto device = make_host_device(4);
  void* fill = make_fill_stream(*device);
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(3, &words));
  words[0] = 7;  // bubbles up to 7 ended
  pfSliceDesc_t slice = ticket_slice(words, 7, 100, 100, 4);
  ItemCounter counter(200);
  PF_ASSERT_OK(pfHostLaunchTicketKernel(fill, &slice, 4, &ItemCounter::item_fn, &counter));
  PF_ASSERT_OK(pfHostLaunchOpaque(fill, 100, 100, 4, &ItemCounter::item_fn, &counter));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill));
  EXPECT_EQ(words[1], 0u);  // the cursor never moved
  EXPECT_EQ(words[2], 0u);  // nor the budget
  EXPECT_EQ(counter.executed.load(), 100u);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(counter.runs[i].load(), 0u);
  for (uint64_t i = 100; i < 200; ++i) EXPECT_EQ(counter.runs[i].load(), 1u);
  PF_ASSERT_OK(device->free_words(words));
}

TEST(HostDevice, StaleAndForeignHandlesAreRefused) {
  auto device = make_host_device(2);
  void* stream = make_stream(*device);
  PF_ASSERT_OK(device->destroy_stream(stream));
  EXPECT_FAILS_WITH(pfHostStreamDelay(stream, 1.0), pfErrorInvalidArgument,
                    "not a live host-device stream");
  EXPECT_FALSE(device->is_valid_main_stream(stream));
  // A new stream never reuses a handle value.
  void* next = make_stream(*device);
  EXPECT_NE(next, stream);
  EXPECT_FAILS_WITH(pfHostStreamDelay(stream, 1.0), pfErrorInvalidArgument, "not a live");
  PF_ASSERT_OK(pfHostStreamDelay(next, 1.0));
  int not_a_stream = 0;
  EXPECT_FAILS_WITH(pfHostLaunchHostFunc(&not_a_stream, &set_flag_fn, nullptr),
                    pfErrorInvalidArgument, "not a live");
  EXPECT_FAILS_WITH(pfHostStreamSynchronize(nullptr), pfErrorInvalidArgument, "not a live");
  void* fill = make_fill_stream(*device);
  EXPECT_FALSE(device->is_valid_main_stream(fill));
  EXPECT_TRUE(device->is_valid_main_stream(next));
  void* event = make_event(*device);
  PF_ASSERT_OK(device->destroy_event(event));
  EXPECT_EQ(device->record_event(event, next), pfErrorInvalidArgument);
  // Handles of a destroyed device are refused too.
  device.reset();
  EXPECT_FAILS_WITH(pfHostStreamDelay(next, 1.0), pfErrorInvalidArgument, "not a live");
}

TEST(HostDevice, CApiValidatesArgumentsAndClearsTheLastError) {
  auto device = make_host_device(2);
  void* stream = make_stream(*device);
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(4, &words));
  pfSliceDesc_t good = ticket_slice(words, 1, 1, 1, 1);
  EXPECT_FAILS_WITH(pfHostLaunchTicketKernel(stream, nullptr, 1, nullptr, nullptr),
                    pfErrorInvalidArgument, "slice pointer is NULL");
  pfSliceDesc_t slice = good;
  slice.cursor = nullptr;
  EXPECT_FAILS_WITH(pfHostLaunchTicketKernel(stream, &slice, 1, nullptr, nullptr),
                    pfErrorInvalidArgument, "slice->cursor is NULL");
  slice = good;
  slice.budget_counter = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(&words[2]) + 4);
  EXPECT_FAILS_WITH(pfHostLaunchTicketKernel(stream, &slice, 1, nullptr, nullptr),
                    pfErrorInvalidArgument, "slice->budget_counter");
  slice = good;
  slice.max_blocks = 0;
  EXPECT_FAILS_WITH(pfHostLaunchTicketKernel(stream, &slice, 1, nullptr, nullptr),
                    pfErrorInvalidArgument, "max_blocks 0");
  EXPECT_FAILS_WITH(pfHostLaunchTicketKernel(stream, &good, -3, nullptr, nullptr),
                    pfErrorInvalidArgument, "blocks -3");
  EXPECT_FAILS_WITH(pfHostLaunchOpaque(stream, 0, 1, 0, nullptr, nullptr), pfErrorInvalidArgument,
                    "blocks 0");
  EXPECT_FAILS_WITH(pfHostLaunchOpaque(stream, ~uint64_t{0}, 2, 1, nullptr, nullptr),
                    pfErrorInvalidArgument, "overflows");
  EXPECT_FAILS_WITH(pfHostStreamDelay(stream, -1.5), pfErrorInvalidArgument, "duration_us -1.5");
  EXPECT_FAILS_WITH(pfHostStreamDelay(stream, std::numeric_limits<double>::quiet_NaN()),
                    pfErrorInvalidArgument, "duration_us nan");
  EXPECT_FAILS_WITH(pfHostLaunchHostFunc(stream, nullptr, nullptr), pfErrorInvalidArgument,
                    "fn is NULL");
  EXPECT_STRNE(pfGetLastErrorMessage(), "");
  PF_ASSERT_OK(pfHostLaunchTicketKernel(stream, &good, 1, nullptr, nullptr));
  EXPECT_STREQ(pfGetLastErrorMessage(), "");  // success clears it
  // Nothing the failing calls tried was enqueued: the one valid launch claimed the one item.
  PF_ASSERT_OK(pfHostStreamSynchronize(stream));
  EXPECT_EQ(words[1], 1u);
  EXPECT_STREQ(pfGetLastErrorMessage(), "");
  PF_ASSERT_OK(device->free_words(words));
}

// Synchronising from inside a host function or an item function would wait for the caller:
// refused with pfErrorInvalidState naming the callback, never a hang.
TEST(HostDevice, SynchronizingFromInsideACallbackIsRefused) {
  auto device = make_host_device(2);
  void* stream = make_stream(*device);
  struct Probe {
    void* stream;
    Device* device;
    pfResult_t c_api = pfSuccess;
    pfResult_t device_call = pfSuccess;
    std::string message;
    static void host_fn(void* user) {
      auto* self = static_cast<Probe*>(user);
      self->c_api = pfHostStreamSynchronize(self->stream);
      self->message = pfGetLastErrorMessage();
      self->device_call = self->device->synchronize_stream(self->stream);
    }
    static void item_fn(void* user, uint64_t) { host_fn(user); }
  };
  Probe in_host_fn{stream, device.get()};
  PF_ASSERT_OK(pfHostLaunchHostFunc(stream, &Probe::host_fn, &in_host_fn));
  PF_ASSERT_OK(pfHostStreamSynchronize(stream));
  EXPECT_EQ(in_host_fn.c_api, pfErrorInvalidState);
  EXPECT_NE(in_host_fn.message.find("host_fn"), std::string::npos) << in_host_fn.message;
  EXPECT_EQ(in_host_fn.device_call, pfErrorInvalidState);

  Probe in_item{stream, device.get()};
  PF_ASSERT_OK(pfHostLaunchOpaque(stream, 0, 1, 1, &Probe::item_fn, &in_item));
  PF_ASSERT_OK(pfHostStreamSynchronize(stream));
  EXPECT_EQ(in_item.c_api, pfErrorInvalidState);
  EXPECT_NE(in_item.message.find("item_fn"), std::string::npos) << in_item.message;
  EXPECT_EQ(in_item.device_call, pfErrorInvalidState);
  {
    CallbackScope scope("launch");  // as inside a job's launch callback
    EXPECT_FAILS_WITH(pfHostStreamSynchronize(stream), pfErrorInvalidState, "launch");
  }
}

// Destroying the device drops queued work: a long delay is interrupted, what follows never runs,
// and a ticket kernel with budget left stops at its next claim.
TEST(HostDevice, DestroyingTheDeviceDropsQueuedWork) {
  auto device = make_host_device(2);
  void* stream = make_stream(*device);
  void* fill = make_fill_stream(*device);
  std::atomic<bool> ran_after_delay{false};
  uint64_t* words = nullptr;
  PF_ASSERT_OK(device->allocate_words(3, &words));
  pfSliceDesc_t slice = ticket_slice(words, 1, ~uint64_t{0}, ~uint64_t{0} - 1, 2);
  ItemCounter counter(0, /*sleep_us=*/10);
  PF_ASSERT_OK(pfHostLaunchTicketKernel(fill, &slice, 2, &ItemCounter::item_fn, &counter));
  PF_ASSERT_OK(pfHostStreamDelay(stream, 60e6));  // a minute
  PF_ASSERT_OK(pfHostLaunchHostFunc(stream, &set_flag_fn, &ran_after_delay));
  ASSERT_TRUE(eventually([&] { return counter.executed.load() > 0; }));
  device.reset();
  EXPECT_FALSE(ran_after_delay.load());
  const uint64_t executed = counter.executed.load();
  EXPECT_GT(executed, 0u);
  EXPECT_EQ(counter.started.load(), executed);  // every block stopped: none is mid-item
}

}  // namespace
}  // namespace pipefill::host::testing
