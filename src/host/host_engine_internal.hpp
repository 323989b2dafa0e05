// Private parts of the host-device engine shared by its source files (host_engine.cpp: threads,
// streams and operations; host_resources.cpp: events, words, memory, partition, handles).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "host/host_engine.hpp"

namespace pipefill::host {

// A handle is a tag in the top 16 bits and a serial number that is never reused.
inline constexpr uint64_t kStreamTag = 0x4853;  // "HS"
inline constexpr uint64_t kEventTag = 0x4845;   // "HE"
uintptr_t make_handle(uint64_t tag);
inline void* as_pointer(uintptr_t handle) { return reinterpret_cast<void*>(handle); }
inline uintptr_t as_handle(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer); }

// The global stream-handle registry (pfHost* calls find a stream's engine through it).
void register_stream(uintptr_t handle, const std::weak_ptr<Engine>& engine);
void unregister_stream(uintptr_t handle);

// Whether this thread is one of an engine's stream threads / fill-block threads.
struct ThreadRole {
  static inline thread_local const void* stream = nullptr;  // the Stream this thread runs
  static inline thread_local bool block = false;
};

struct Engine::Record {
  bool done = false;       // guarded by the engine mutex
  double time_us = -1.0;
  // Item functions that threw in the fill launches executed on the record's stream after it and
  // before the stream's next record (guarded by the engine mutex): the runtime records a slice's
  // start event right before the slice's launch, so it reads them through that event.
  uint64_t item_failures = 0;
  uint64_t items_not_run = 0;  // opaque launches: items no block took (every block had stopped)
  std::string first_item_failure;
};

struct Engine::Event {
  std::shared_ptr<Record> latest;  // guarded by the engine mutex
};

// One fill launch (ticket or opaque); shared by its op and its queued block tasks.
struct Engine::Launch {
  bool ticket = true;
  pfSliceDesc_t slice{};       // ticket: copied at enqueue
  uint64_t first_item = 0;     // opaque: items first_item .. first_item + items - 1
  uint64_t items = 0;
  std::atomic<uint64_t> next{0};  // opaque: next item index to hand out
  ItemFn item_fn = nullptr;
  void* user = nullptr;
  int blocks = 0;
  int exited = 0;  // guarded by the engine mutex
  // Ticket launches with a time budget (Engine::launch_ticket's time_budget, EngineOptions::
  // time_budget): when the first block first claimed (engine clock, us; < 0 before), and the
  // items its blocks completed and their time.
  bool time_budget = false;
  std::atomic<double> started_us{-1.0};
  std::atomic<uint64_t> items_timed{0};
  std::atomic<uint64_t> item_ns{0};
  // The stream's last record when the launch started executing (item failures go there).
  std::shared_ptr<Record> failures_to;  // guarded by the engine mutex
};

enum class OpType : uint8_t { Delay, HostFunc, Record, Wait, WriteWord, CopyWord, Fill };

struct Engine::Op {
  OpType type = OpType::Delay;
  double duration_us = 0.0;
  HostFn host_fn = nullptr;
  void* user = nullptr;
  std::shared_ptr<Record> record;  // record / wait (null wait: nothing to wait for)
  uint64_t* word = nullptr;        // write / copy destination
  const uint64_t* source = nullptr;
  uint64_t value = 0;
  bool write_max = false;  // write: max(word, value), atomically
  std::shared_ptr<Launch> launch;
  uintptr_t pinned[3] = {};  // word blocks this op keeps alive until it has run
  int pin_count = 0;
};

struct Engine::Stream {
  uintptr_t handle = 0;
  int priority = 0;
  bool fill = false;
  // All below guarded by the engine mutex.
  bool destroyed = false;
  uint64_t enqueued = 0;
  uint64_t executed = 0;
  std::deque<Op> ops;  // the head op stays in place while it executes
  std::shared_ptr<Record> last_record;  // the latest record this stream executed
  CondVar wake;
  std::thread thread;
};

}  // namespace pipefill::host
