// Helpers of the host-device tests: latches a test releases, ordered marks written by host
// functions on streams, device construction, and a fixture with a host-device runtime. Everything here counts and orders; nothing
// measures speed.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/host_device.hpp"
#include "host/host_engine.hpp"
#include "pipefill/pipefill.h"
#include "support/api_checks.hpp"

namespace pipefill::host::testing {

// A ticket slice over three device words (gate, cursor, budget counter, in that order): bubble
// `bubble_id`, a budget of `max_items` of the job's `total_items`, at most `max_blocks` blocks.
inline pfSliceDesc_t ticket_slice(uint64_t* words, uint64_t bubble_id, uint64_t max_items,
                                  uint64_t total_items, int max_blocks) {
  pfSliceDesc_t slice{};
  slice.bubble_id = bubble_id;
  slice.max_items = max_items;
  slice.total_items = total_items;
  slice.max_blocks = max_blocks;
  slice.gate = &words[0];
  slice.cursor = &words[1];
  slice.budget_counter = &words[2];
  return slice;
}

// A gate a host function waits on until the test opens it.
class Latch {
 public:
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }
  // A pfHostFn: blocks the stream until the latch opens.
  static void wait_fn(void* user) { static_cast<Latch*>(user)->wait(); }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// An ordered log of integers appended by host functions (and by the test).
class MarkLog {
 public:
  void add(int value) {
    std::lock_guard lock(mutex_);
    marks_.push_back(value);
  }
  std::vector<int> marks() {
    std::lock_guard lock(mutex_);
    return marks_;
  }
  // The host function argument that appends `value`; lives as long as the log.
  void* mark(int value) {
    std::lock_guard lock(mutex_);
    refs_.push_back(std::make_unique<Ref>(Ref{this, value}));
    return refs_.back().get();
  }
  static void mark_fn(void* user) {
    auto* ref = static_cast<Ref*>(user);
    ref->log->add(ref->value);
  }

 private:
  struct Ref {
    MarkLog* log;
    int value;
  };
  std::mutex mutex_;
  std::vector<int> marks_;
  std::vector<std::unique_ptr<Ref>> refs_;
};

// Sets an atomic flag (a pfHostFn).
inline void set_flag_fn(void* user) { static_cast<std::atomic<bool>*>(user)->store(true); }

// Spins (yielding) until `done()` or a generous deadline; returns done(). The deadline only
// turns a hang into a failure; no test asserts on how long anything took.
template <typename Done>
bool eventually(Done done, std::chrono::milliseconds deadline = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return done();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

inline std::unique_ptr<HostDevice> make_host_device(int sms, bool time_budget = false) {
  EngineOptions options;
  options.sm_count = sms;
  options.time_budget = time_budget;
  std::shared_ptr<Engine> engine;
  EXPECT_EQ(Engine::create(options, &engine), pfSuccess) << pfGetLastErrorMessage();
  return std::make_unique<HostDevice>(std::move(engine));
}

inline void* make_stream(Device& device, int priority = 0) {
  void* stream = nullptr;
  EXPECT_EQ(device.create_stream(priority, &stream), pfSuccess) << pfGetLastErrorMessage();
  return stream;
}

inline void* make_fill_stream(Device& device) {
  void* stream = nullptr;
  EXPECT_EQ(device.create_fill_stream(&stream), pfSuccess) << pfGetLastErrorMessage();
  return stream;
}

inline void* make_event(Device& device) {
  void* event = nullptr;
  EXPECT_EQ(device.create_event(&event), pfSuccess) << pfGetLastErrorMessage();
  return event;
}

// Counts item executions per item, and how many run at once.
struct ItemCounter {
  explicit ItemCounter(uint64_t items, int sleep_us = 0)
      : runs(items), sleep_us(sleep_us) {}
  std::vector<std::atomic<uint32_t>> runs;
  std::atomic<uint64_t> started{0};
  std::atomic<uint64_t> executed{0};
  std::atomic<int> in_flight{0};
  std::atomic<int> max_in_flight{0};
  int sleep_us = 0;

  static void item_fn(void* user, uint64_t item) {
    auto* self = static_cast<ItemCounter*>(user);
    self->started.fetch_add(1);
    const int now = self->in_flight.fetch_add(1) + 1;
    int seen = self->max_in_flight.load();
    while (now > seen && !self->max_in_flight.compare_exchange_weak(seen, now)) {
    }
    if (item < self->runs.size()) self->runs[item].fetch_add(1);
    if (self->sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(self->sleep_us));
    self->executed.fetch_add(1);
    self->in_flight.fetch_sub(1);
  }
  uint64_t total_runs() const {
    uint64_t n = 0;
    for (const auto& r : runs) n += r.load();
    return n;
  }
  bool none_twice() const {
    for (const auto& r : runs) {
      if (r.load() > 1) return false;
    }
    return true;
  }
};

// The runtime config of the host-device runtime tests: no reserved SMs, margins off, a small
// arena, and never enough history (min_samples): every bubble is planned from its hint, so what
// the runtime launches does not depend on how long real bubbles happened to take on this machine.
inline pfConfig_t host_test_config() {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendHost;
  c.reserved_sms = 0;
  c.safety_margin_us = 0.0;
  c.safety_margin_fraction = 0.0;
  c.arena_bytes = size_t{1} << 20;
  c.log_level = pfLogWarn;
  c.min_samples = 1000000;
  return c;
}

// A fixture with a runtime on a 4-SM host device (config_, host_test_config unless a derived
// fixture's constructor changes it) and a high-priority main stream of it.
class HostRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PIPEFILL_HOST_SMS", "4", 1);
    ASSERT_NO_FATAL_FAILURE(create_runtime(config_));
  }
  void TearDown() override {
    if (rt_ != nullptr) EXPECT_EQ(pfRuntimeDestroy(rt_), pfSuccess) << pfGetLastErrorMessage();
    unsetenv("PIPEFILL_HOST_SMS");
  }

  // Replaces the runtime (and its main stream) by one with `config`.
  void create_runtime(const pfConfig_t& config) {
    if (rt_ != nullptr) PF_ASSERT_OK(pfRuntimeDestroy(rt_));
    rt_ = nullptr;
    PF_ASSERT_OK(pfRuntimeCreate(&config, &rt_));
    PF_ASSERT_OK(pfStreamCreateHighPriority(rt_, &main_));
  }

  // Begins a bubble on the main stream whose hint allows far more items than it will hold, so
  // that the gate, not the budget, ends its slice.
  void begin_open_ended_bubble() {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 1e5;
    ASSERT_EQ(pfBubbleBegin(rt_, main_, &hint), pfSuccess) << pfGetLastErrorMessage();
  }
  // Ends the open bubble and the iteration (which enqueues nothing).
  void end_bubble_and_iteration() {
    ASSERT_EQ(pfBubbleEnd(rt_, main_), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(pfIterationEnd(rt_), pfSuccess) << pfGetLastErrorMessage();
  }

  pfJobInfo_t info(pfJob_t job) {
    pfJobInfo_t i{};
    EXPECT_EQ(pfJobGetStatus(job, &i), pfSuccess) << pfGetLastErrorMessage();
    return i;
  }

  pfConfig_t config_ = host_test_config();
  pfRuntime_t rt_ = nullptr;
  void* main_ = nullptr;
};

}  // namespace pipefill::host::testing
