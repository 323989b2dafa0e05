// The engine of the real-time host device (docs/host-device.md): streams are worker threads that
// execute their queued operations in order, in real time; events carry steady-clock timestamps
// (µs since the engine was made); device words are plain 8-byte aligned host memory accessed with
// std::atomic_ref; a ticket fill kernel is a set of "blocks" run by a pool of SM worker threads,
// each block claiming items through pipefill/item_protocol.hpp, the same claim a GPU block makes.
//
// Handles: stream and event handles are opaque 64-bit values (a tag and a serial number that is
// never reused), not pointers, so a stale handle is refused even after its memory is reused.
// Stream handles are registered globally (the pfHost* C functions find their engine from a bare
// stream); an engine found that way is kept alive by a shared_ptr for the duration of the call.
//
// Locking: one mutex per engine guards all its state (streams' queues, events, words, the block
// queue). Operations run with it released: a delay, a host function, a ticket kernel's items.
// Lock order: the global handle registry's mutex is never held while the engine's is taken.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.hpp"
#include "common/thread_annotations.hpp"
#include "device/device.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::host {

// Stream priorities follow CUDA: 0 is the lowest, kHighestPriority the highest. They are
// recorded, not enforced: the OS schedules the threads (docs/host-device.md).
inline constexpr int kLowestPriority = 0;
inline constexpr int kHighestPriority = -5;
inline constexpr int kMaxSmCount = 1024;

using ItemFn = void (*)(void* user, uint64_t item);
using HostFn = void (*)(void* user);

struct EngineOptions {
  int sm_count = 8;                    // PIPEFILL_HOST_SMS
  size_t memory_bytes = size_t{64} << 20;  // PIPEFILL_HOST_MEMORY_BYTES
  // PIPEFILL_HOST_FILL_NICE: added to the nice value of the threads that run fill work (the fill
  // streams' and the SM threads), so that the main job's threads win the cores - the host
  // device's low-priority fill streams. 0 leaves them at the process's. With 8 SM threads per
  // device on 2 cores, 10 took the main job's slowdown from +15-24% to +5% at the same fill
  // (docs/results-host-engine.md, "C++ items on the host device").
  int fill_nice = 10;
  // PIPEFILL_HOST_TIME_BUDGET=1: the launches that ask for it - the graph items of a job whose
  // items are the host thread's own work (a Python item job, whose items the planner counts at
  // their fastest sample) - start no item expected to end more than half an item past the
  // slice's planned time (pfSliceDesc_t::time_budget_us from the launch's first claim, judged by
  // the mean of the launch's items so far). Without it such a slice runs on until the gate, one
  // item past most bubbles' ends into the trainer's step. Opt-in: on this 2-core machine its
  // effect on the trainer's step and the fill is within the noise of the measurements so far
  // (docs/results-host-python.md, "The time budget").
  bool time_budget = false;
};
// Reads PIPEFILL_HOST_SMS, PIPEFILL_HOST_MEMORY_BYTES and PIPEFILL_HOST_FILL_NICE over the
// defaults; a malformed or out-of-range value is pfErrorInvalidArgument naming the variable and
// the value.
pfResult_t engine_options_from_env(EngineOptions* out);

class Engine {
 public:
  // The port interface of the shared device adapter (device/engine_device.hpp).
  static constexpr int kLowestPriority = ::pipefill::host::kLowestPriority;
  static constexpr int kHighestPriority = ::pipefill::host::kHighestPriority;

  static pfResult_t create(const EngineOptions& options, std::shared_ptr<Engine>* out);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Stops the engine: every stream finishes the operation in progress (a host function must
  // return; a ticket kernel's blocks stop at their next claim) and drops the rest; the threads
  // are joined and all memory freed. Idempotent. Never call it from a stream or block thread.
  void shutdown() EXCLUDES(mutex_);

  double now_us() const;
  int sm_count() const { return sm_count_; }

  // ---- Streams ----------------------------------------------------------------------------
  pfResult_t create_stream(int priority, bool fill, void** out) EXCLUDES(mutex_);
  // The handle becomes invalid at once; work already queued still runs, then the thread ends.
  pfResult_t destroy_stream(void* stream) EXCLUDES(mutex_);
  bool is_main_stream(const void* stream) const EXCLUDES(mutex_);
  // Blocks until the stream has executed everything queued before the call. Refused
  // (pfErrorInvalidState) from the stream's own thread and from a fill block.
  pfResult_t synchronize_stream(void* stream) EXCLUDES(mutex_);

  // ---- Stream operations (executed by the stream's thread, in order) ----------------------
  pfResult_t delay(void* stream, double duration_us) EXCLUDES(mutex_);
  pfResult_t host_func(void* stream, HostFn fn, void* user) EXCLUDES(mutex_);
  pfResult_t record_event(void* event, void* stream) EXCLUDES(mutex_);
  // Waits for the record that is the event's latest now (none: no wait).
  pfResult_t wait_event(void* stream, void* event) EXCLUDES(mutex_);
  pfResult_t write_word(void* stream, uint64_t* word, uint64_t value) EXCLUDES(mutex_);
  // The same as an atomic max (pfBubbleCloseFill: a late close cannot move the gate back).
  pfResult_t write_word_max(void* stream, uint64_t* word, uint64_t value) EXCLUDES(mutex_);
  pfResult_t copy_word(void* stream, const uint64_t* source, uint64_t* destination)
      EXCLUDES(mutex_);
  // `time_budget`: the launch's blocks start no item expected to end more than half an item past
  // slice->time_budget_us (when the engine's time_budget option is on; see EngineOptions).
  pfResult_t launch_ticket(void* stream, const pfSliceDesc_t* slice, int blocks, ItemFn item_fn,
                           void* user, bool time_budget = false) EXCLUDES(mutex_);
  pfResult_t launch_opaque(void* stream, uint64_t first_item, uint64_t items, int blocks,
                           ItemFn item_fn, void* user) EXCLUDES(mutex_);

  // ---- Events -----------------------------------------------------------------------------
  pfResult_t create_event(void** out) EXCLUDES(mutex_);
  pfResult_t destroy_event(void* event) EXCLUDES(mutex_);
  // recorded: the event has a record; done: that record executed, at *time_us.
  pfResult_t event_state(void* event, bool* recorded, bool* done, double* time_us) const
      EXCLUDES(mutex_);
  pfResult_t synchronize_event(void* event) EXCLUDES(mutex_);
  // Item functions that threw in the fill launches executed after the event's latest record on
  // its stream (before that stream's next record); *first: the first one's message.
  // *not_run: items of opaque launches no block took because every block had stopped.
  pfResult_t event_item_failures(void* event, uint64_t* count, uint64_t* not_run,
                                 std::string* first) const EXCLUDES(mutex_);

  // ---- Words and memory -------------------------------------------------------------------
  // Zeroed, 256-byte aligned words. A free while queued operations still use the words is
  // deferred until they have run (the words are refused for new operations at once).
  pfResult_t allocate_words(size_t count, uint64_t** words) EXCLUDES(mutex_);
  pfResult_t free_words(uint64_t* words) EXCLUDES(mutex_);
  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) const EXCLUDES(mutex_);
  // Real host memory (not zeroed), so fill items may use their workspace.
  pfResult_t allocate_arena(size_t bytes, void** base) EXCLUDES(mutex_);
  pfResult_t free_arena(void* base) EXCLUDES(mutex_);

  pfResult_t configure_partition(int reserved_sms, FillPartition* partition) EXCLUDES(mutex_);
  int fill_sms() const EXCLUDES(mutex_);
  // The most fill blocks that ever ran at once (tests check it never exceeds fill_sms).
  int max_concurrent_blocks() const EXCLUDES(mutex_);

  // The engine of a live stream handle (nullptr when unknown or destroyed). Safe for any value.
  static std::shared_ptr<Engine> engine_of_stream(const void* stream);

 private:
  struct Record;
  struct Event;
  struct Launch;
  struct Op;
  struct Stream;
  struct WordBlock {
    size_t count = 0;
    int pins = 0;        // queued operations using these words
    bool freed = false;  // free_words was called; deleted when pins reaches 0
  };

  explicit Engine(const EngineOptions& options);
  pfResult_t start() EXCLUDES(mutex_);

  Stream* live_stream(const void* handle) const REQUIRES(mutex_);
  Event* live_event(const void* handle) const REQUIRES(mutex_);
  pfResult_t check_open() const REQUIRES(mutex_);
  // Pins the word block holding `word` (if the engine allocated it) for a queued operation.
  pfResult_t pin_word(const void* word, Op* op) REQUIRES(mutex_);
  void unpin_words(Op& op) REQUIRES(mutex_);
  pfResult_t enqueue(void* stream, Op op) EXCLUDES(mutex_);
  pfResult_t enqueue_locked(Stream* stream, Op op) REQUIRES(mutex_);
  // Whether a block of a ticket launch may claim another item within its slice's time budget.
  bool within_time_budget(Launch& launch) const;
  pfResult_t enqueue_write(void* stream, uint64_t* word, uint64_t value, bool write_max)
      EXCLUDES(mutex_);

  void stream_main(Stream* stream) EXCLUDES(mutex_);
  void execute(Stream* stream, Op& op) REQUIRES(mutex_);
  void block_main() EXCLUDES(mutex_);
  // Runs one block of `launch` on the calling thread (an SM thread, or a stream thread running a
  // block of its own launch), counted in the fill partition; the lock is released meanwhile.
  void run_block_here(Launch& launch) REQUIRES(mutex_);
  void run_block(Launch& launch);

  const int sm_count_;
  const int fill_nice_;
  const bool time_budget_;
  const size_t memory_bytes_;
  const std::chrono::steady_clock::time_point origin_;

  mutable Mutex mutex_;
  CondVar progress_;   // a record, an operation or a block completed
  CondVar block_cv_;   // block tasks queued, or a fill slot freed
  CondVar stop_cv_;    // the engine is stopping (interrupts delays)
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::atomic<bool> stopping_flag_{false};  // read by running blocks between claims
  bool started_ GUARDED_BY(mutex_) = false;
  int fill_sms_ GUARDED_BY(mutex_);
  int reserved_sms_ GUARDED_BY(mutex_) = 0;
  int fill_running_ GUARDED_BY(mutex_) = 0;
  int max_fill_running_ GUARDED_BY(mutex_) = 0;
  size_t arena_used_ GUARDED_BY(mutex_) = 0;
  std::unordered_map<uintptr_t, std::unique_ptr<Stream>> streams_ GUARDED_BY(mutex_);
  std::vector<std::unique_ptr<Stream>> retired_streams_ GUARDED_BY(mutex_);
  std::unordered_map<uintptr_t, std::unique_ptr<Event>> events_ GUARDED_BY(mutex_);
  std::map<uintptr_t, WordBlock> words_ GUARDED_BY(mutex_);
  std::unordered_map<uintptr_t, size_t> arenas_ GUARDED_BY(mutex_);
  std::deque<std::shared_ptr<Launch>> block_queue_ GUARDED_BY(mutex_);  // one entry per block
  std::vector<std::thread> block_threads_;  // made in start(), joined in shutdown()
  std::weak_ptr<Engine> self_;
};

}  // namespace pipefill::host
