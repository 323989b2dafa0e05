// Helpers of the host-device tests: latches a test releases, ordered marks written by host
// functions on streams, and device construction. Everything here counts and orders; nothing
// measures speed.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/host_device.hpp"
#include "host/host_engine.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::host::testing {

#define PF_ASSERT_OK(expr)                                                   \
  do {                                                                       \
    const pfResult_t pf_r_ = (expr);                                         \
    ASSERT_EQ(pf_r_, pfSuccess) << #expr << ": " << pfGetLastErrorMessage(); \
  } while (0)

// Expects `call` to fail with `code` and a message containing `needle`.
#define EXPECT_FAILS_WITH(call, code, needle)                                      \
  do {                                                                             \
    EXPECT_EQ((call), (code));                                                     \
    EXPECT_NE(std::string(pfGetLastErrorMessage()).find(needle), std::string::npos) \
        << "message: '" << pfGetLastErrorMessage() << "' lacks '" << (needle) << "'"; \
  } while (0)

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

inline std::unique_ptr<HostDevice> make_host_device(int sms) {
  EngineOptions options;
  options.sm_count = sms;
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

}  // namespace pipefill::host::testing
