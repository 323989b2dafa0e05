// How the host device hands a fill launch to threads (src/host/host_engine.cpp, issue 32 item 2):
// a fill stream runs one block of its own launch on its own thread when a fill slot is free (no
// SM-thread hop before the slice's first item), that thread is then refused waits like an SM
// thread, and every device thread runs with a 1 ns timer slack so that a sleep inside an item or
// a stream's delay ends when asked. Deterministic: thread identities and per-thread settings,
// never durations. Runs under TSan (label "host").
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

struct ThreadLog {
  std::mutex mutex;
  std::set<std::thread::id> item_threads;
  std::thread::id stream_thread;
  std::atomic<uint64_t> items{0};
  std::atomic<int> refused{0};  // item_fn's synchronize calls refused with pfErrorInvalidState
  void* other_stream = nullptr;

  static void item_fn(void* user, uint64_t) {
    auto* self = static_cast<ThreadLog*>(user);
    {
      std::lock_guard lock(self->mutex);
      self->item_threads.insert(std::this_thread::get_id());
    }
    if (self->other_stream != nullptr &&
        pfHostStreamSynchronize(self->other_stream) == pfErrorInvalidState)
      self->refused.fetch_add(1);
    self->items.fetch_add(1);
  }
  static void note_stream_thread(void* user) {
    auto* self = static_cast<ThreadLog*>(user);
    std::lock_guard lock(self->mutex);
    self->stream_thread = std::this_thread::get_id();
  }
};

struct SliceWords {
  uint64_t* words = nullptr;
  pfSliceDesc_t slice{};
  SliceWords(Device& device, uint64_t items, int max_blocks) {
    EXPECT_EQ(device.allocate_words(3, &words), pfSuccess) << pfGetLastErrorMessage();
    // Bubble 1: the gate (0) stays open.
    slice = ticket_slice(words, /*bubble_id=*/1, items, items, max_blocks);
  }
};

// A one-block launch on an idle device runs on the fill stream's own thread: the stream needs no
// SM thread to wake before the first item (the hop the host timeline measured per slice).
TEST(HostBlockDispatch, AOneBlockLaunchRunsOnItsStreamsOwnThread) {
  auto device = make_host_device(4);
  void* fill = make_fill_stream(*device);
  SliceWords w(*device, 50, 1);
  ThreadLog log;
  PF_ASSERT_OK(pfHostLaunchHostFunc(fill, &ThreadLog::note_stream_thread, &log));
  PF_ASSERT_OK(pfHostLaunchTicketKernel(fill, &w.slice, 1, &ThreadLog::item_fn, &log));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill));
  EXPECT_EQ(log.items.load(), 50u);
  ASSERT_EQ(log.item_threads.size(), 1u);
  EXPECT_EQ(*log.item_threads.begin(), log.stream_thread);
  PF_ASSERT_OK(device->free_words(w.words));
}

// Opaque work too, and a later launch on the same stream again (the stream's thread returned to
// its queue after its block and its launch's other blocks).
TEST(HostBlockDispatch, EveryLaunchOfAStreamRunsItsItemsExactlyOnce) {
  auto device = make_host_device(3);
  void* fill = make_fill_stream(*device);
  ItemCounter counter(400);
  SliceWords w(*device, 200, 8);
  PF_ASSERT_OK(pfHostLaunchTicketKernel(fill, &w.slice, 8, &ItemCounter::item_fn, &counter));
  PF_ASSERT_OK(pfHostLaunchOpaque(fill, 200, 200, 8, &ItemCounter::item_fn, &counter));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill));
  EXPECT_EQ(counter.executed.load(), 400u);
  EXPECT_TRUE(counter.none_twice());
  EXPECT_EQ(counter.total_runs(), 400u);
  EXPECT_LE(device->engine().max_concurrent_blocks(), 3);
  PF_ASSERT_OK(device->free_words(w.words));
}

// The stream thread running a block is a fill block for the device's wait rules: an item there
// may not synchronize any stream (it would wait for a stream that waits for the block).
TEST(HostBlockDispatch, AnItemOnAStreamThreadIsRefusedSynchronization) {
  auto device = make_host_device(2);
  void* fill = make_fill_stream(*device);
  void* other = make_stream(*device);
  SliceWords w(*device, 5, 1);
  ThreadLog log;
  log.other_stream = other;
  PF_ASSERT_OK(pfHostLaunchHostFunc(fill, &ThreadLog::note_stream_thread, &log));
  PF_ASSERT_OK(pfHostLaunchTicketKernel(fill, &w.slice, 1, &ThreadLog::item_fn, &log));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill));
  ASSERT_EQ(log.item_threads.size(), 1u);
  EXPECT_EQ(*log.item_threads.begin(), log.stream_thread);
  EXPECT_EQ(log.refused.load(), 5);
  // Back on its own, the stream thread may run host functions that do not synchronize, and the
  // test thread may synchronize it.
  PF_ASSERT_OK(pfHostLaunchHostFunc(fill, &ThreadLog::note_stream_thread, &log));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill));
  PF_ASSERT_OK(device->free_words(w.words));
}

#ifdef __linux__
// Counts calls, and calls whose thread's timer slack was not 1 ns.
struct SlackLog {
  std::atomic<int> calls{0};
  std::atomic<int> other_slack{0};
  void note() {
    calls.fetch_add(1);
    if (prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) != 1) other_slack.fetch_add(1);
  }
  static void item_fn(void* user, uint64_t) { static_cast<SlackLog*>(user)->note(); }
  static void host_fn(void* user) { static_cast<SlackLog*>(user)->note(); }
};

// Linux's default timer slack is 50 µs (a 30 µs sleep in an item may end 50 µs late); the device's
// threads ask for 1 ns, on SM threads and stream threads alike.
TEST(HostBlockDispatch, DeviceThreadsAskForANanosecondTimerSlack) {
  auto device = make_host_device(4);
  void* fill = make_fill_stream(*device);
  void* main = make_stream(*device, kHighestPriority);
  SliceWords w(*device, 64, 4);
  SlackLog on_sm, on_stream;
  // Four blocks (SM threads, and perhaps the fill stream's thread): every item checks its thread.
  PF_ASSERT_OK(pfHostLaunchTicketKernel(fill, &w.slice, 4, &SlackLog::item_fn, &on_sm));
  PF_ASSERT_OK(pfHostLaunchHostFunc(main, &SlackLog::host_fn, &on_stream));
  PF_ASSERT_OK(pfHostLaunchHostFunc(fill, &SlackLog::host_fn, &on_stream));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill));
  PF_ASSERT_OK(pfHostStreamSynchronize(main));
  EXPECT_EQ(on_sm.calls.load(), 64);
  EXPECT_EQ(on_sm.other_slack.load(), 0);
  EXPECT_EQ(on_stream.calls.load(), 2);
  EXPECT_EQ(on_stream.other_slack.load(), 0);
  PF_ASSERT_OK(device->free_words(w.words));
}
#endif

}  // namespace
}  // namespace pipefill::host::testing
