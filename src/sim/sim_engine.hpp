// Private parts of the simulated world shared by its source files. The model is documented in
// docs/simulated-device.md; this header says how the engine is built:
//
//   sim_event_loop.cpp  the discrete-event loop: the event heap, stream heads, records, runs
//   sim_dispatch.cpp    the SM scheduler: pending blocks per device served by (stream priority,
//                       launch order) as SMs free up, and the interference loads
//   sim_fill.cpp        the fill kernel kinds: ticket blocks claiming through the shared
//                       protocol (pipefill/item_protocol.hpp) and opaque blocks, item batches
//   sim_world.cpp       World: lifecycle, hooks, clock, streams, events, running
//   sim_ops.cpp         World: enqueueing the stream operations
//   sim_memory.cpp      World: device words (deferred frees), memory, arenas, the partition
//   sim_handles.cpp     handles, the global registry and the world pins of the C API
//
// Each stream is a FIFO of ops; only its head op can be in progress, so every scheduled event
// can name its target by the stream alone. A binary heap orders the events by (time, sequence
// number), which makes runs byte-identical for the same program and seed. Everything below is
// guarded by World::Impl::mutex; the engine is single-threaded under it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <utility>
#include <string>
#include <vector>

#include "analysis/activity.hpp"
#include "common/mutex.hpp"
#include "common/thread_annotations.hpp"
#include "sim/ring_queue.hpp"
#include "sim/sim_world.hpp"

namespace pipefill::sim {

inline constexpr size_t kWordAlignment = 256;
inline constexpr size_t kArenaAlignment = 256;
inline constexpr int kMaxDevices = 1 << 16;
inline constexpr int kMaxSmCount = 1 << 20;

// Items shorter than this are simulated in batches: one event per block covers
// floor(kItemQuantumUs / item_cost) claims made at once, so a run's events are bounded by its
// virtual duration rather than by its item count. Longer items are simulated one by one.
inline constexpr double kItemQuantumUs = 0.1;
// A simulated ticket launch of items shorter than kItemQuantumUs stops claiming after this many
// items (a bound on the simulator's per-item work; launches of longer items are not capped).
inline constexpr uint64_t kMaxTicketItemsPerLaunch = uint64_t{1} << 20;

bool finite_nonnegative(double value);

struct SimStream;

// One record of an event: completes when the record op reaches its stream's head. Shared by the
// event (while it is the latest record), the record op and every wait op that captured it, so it
// is reference counted and recycled through a free list (no allocation per record).
struct Record {
  bool completed = false;
  double time_us = -1.0;
  int references = 0;
  std::vector<SimStream*> waiters;  // streams whose head wait started before completion
  // Items whose on_item threw in the fill launches enqueued after this record on its stream (the
  // runtime's slice start event: it reads them at harvest, Device::item_failures), the items of
  // their batches left uncalled, and the first failure's message.
  uint64_t item_failures = 0;
  uint64_t items_not_run = 0;
  std::string first_item_failure;
};

enum class OpType : uint8_t { Kernel, Delay, Record, Wait, WriteWord, CopyWord, Ticket, Opaque };

struct Op {
  OpType type = OpType::Kernel;
  int sms = 0;           // kernel / ticket / opaque: blocks (one SM each); wait: SMs held
  double time_us = 0.0;  // kernel: block duration; delay: duration; wait: latency; fill: item cost
  double transfer_us = 0.0;      // wait: the part after the record slowed by comm interference
  double mem_intensity = 0.0;    // fill: HBM share per unit SM share of its blocks
  double mem_sensitivity = 1.0;  // fill: how strongly main work slows its items
  uint64_t sequence = 0; // enqueue order (tie-break among pending ops, correlation id)
  Record* record = nullptr;                // record / wait
  uint64_t* word = nullptr;                // write / copy destination
  const uint64_t* source = nullptr;        // copy source
  uint64_t value = 0;                      // write value; opaque first item
  bool write_max = false;                  // write: max(word, value) instead of value
  uint64_t ordinal = 0;  // kernels: index among the stream's kernels; fill: among its launches
  // Fill launches (ticket fields copied from the slice at enqueue time).
  pfSliceDesc_t slice{};     // ticket: gate, bubble_id, budget, cursor, total_items
  uint64_t total_items = 0;  // opaque: items of this launch
  pfSimItemFn on_item = nullptr;
  void* user = nullptr;
  Record* failures_to = nullptr;  // fill: the stream's record enqueued last before it (retained)
  // World word blocks this op keeps allocated until it has run (deferred frees).
  uintptr_t pinned[3] = {};
  int pin_count = 0;
};

struct SimStream {
  int device = 0;
  int priority = 0;
  bool fill = false;
  uint64_t id = 0;
  const void* handle = nullptr;
  // Jitter is drawn from (seed, jitter_key, op ordinal[, item]) rather than from one sequence
  // consumed in event order: the main job's kernels then get the same durations whether or not
  // fill work runs beside them, so filled and unfilled runs compare exactly even with jitter.
  uint64_t jitter_key = 0;
  uint64_t kernels_enqueued = 0;
  uint64_t launches_enqueued = 0;
  Record* last_enqueued_record = nullptr;  // retained: where the next fill launch's failures go
  bool destroyed = false;
  bool in_graveyard = false;
  bool advance_scheduled = false;
  RingQueue<Op> ops;
  // State of the head op once started.
  bool head_started = false;
  double head_start_us = 0.0;  // kernel / fill: its first block's start
  double head_all_started_us = 0.0;  // kernel: when its last block started (it holds every SM)
  int held_sms = 0;            // wait: the SMs it holds
  int blocks_unstarted = 0;    // kernel / fill: blocks still pending
  int blocks_active = 0;       // kernel / fill: blocks holding an SM
  uint64_t opaque_next = 0;
  uint64_t items_claimed = 0;  // ticket: items claimed by the head launch
  uint64_t items_done = 0;
  double first_item_start_us = -1.0;
  double last_item_end_us = -1.0;
};

struct SimEvent {
  uint64_t id = 0;
  Record* latest = nullptr;
};

// A head op with blocks still pending. Served as the hardware serves pending blocks: higher
// stream priority first; at equal priority main work (kernels, comm waits) before fill launches
// (ticket / opaque), so that main-stream work is always ahead of fill work of its priority; then
// launch (enqueue) order. The runtime's fill streams are at the lowest priority, which already
// puts the main job's pending blocks ahead of them; the tie-break keeps that true for a main
// stream created at the lowest priority too.
struct PendingEntry {
  SimStream* stream = nullptr;
  int priority = 0;
  bool fill_launch = false;
  uint64_t sequence = 0;
  bool operator<(const PendingEntry& other) const {
    if (priority != other.priority) return priority < other.priority;
    if (fill_launch != other.fill_launch) return !fill_launch;
    return sequence < other.sequence;
  }
};

// A group of a main kernel's blocks that started together. It progresses at the rate
// 1 / (1 + beta x L_fill): whenever the fill load of its device changes, the work done so far is
// banked and its end is re-timed (the old end event goes stale through `version`).
struct MainGroup {
  SimStream* stream = nullptr;
  uint64_t id = 0;           // the BlocksDone event's `item`
  uint64_t version = 0;      // the BlocksDone event's `count`; older events are stale
  int blocks = 0;
  double remaining_us = 0.0; // unslowed (jittered) work left at `since_us`
  double since_us = 0.0;
  double factor = 1.0;       // 1 + beta x L_fill since `since_us`
};

// A comm wait's transfer (pfSimStreamWaitEventTransfer) once its record completed: after the
// fixed latency it progresses at the rate 1 / (1 + gamma x L_fill), re-timed whenever the fill
// load of its device changes, as main groups are (the old end event goes stale through
// `version`). Contention for HBM exists only while the fill runs beside the transfer.
struct Transfer {
  SimStream* stream = nullptr;
  uint64_t id = 0;           // the TransferDone event's `item`
  uint64_t version = 0;      // the TransferDone event's `count`; older events are stale
  double remaining_us = 0.0; // unslowed transfer left at `since_us`
  double since_us = 0.0;     // the later of its start (record + latency) and the last re-timing
  double factor = 1.0;       // 1 + gamma x L_fill since `since_us`
};

// The running MainGroup / Transfer with `id` if `version` is still its current one, else end():
// the event that carries (id, version) was replaced by a re-timing (or its item is gone).
template <typename Items>
auto find_current(Items& items, uint64_t id, uint64_t version) {
  auto it = std::find_if(items.begin(), items.end(), [&](const auto& x) { return x.id == id; });
  return it != items.end() && it->version == version ? it : items.end();
}

// The interference model's parameters of one device (pfSimDeviceDesc_t, resolved).
struct InterferenceParams {
  double main_slowdown = 0.0;       // beta
  double fill_slowdown = 0.0;       // beta_f
  double comm_slowdown = 0.0;       // gamma
  double fill_mem_intensity = 1.0;  // default I of a fill launch
  double main_mem_intensity = 1.0;  // I of main-kernel blocks
};

struct DeviceState {
  int sm_count = 0;
  size_t memory_total = 0;
  size_t memory_used = 0;
  size_t arena_used = 0;
  double jitter = 0.0;
  InterferenceParams interference;
  int reserved_sms = 0;
  int fill_sms = 0;
  int free_sms = 0;
  int fill_in_use = 0;         // SMs held by fill blocks
  int main_blocks_active = 0;  // SMs held by main-kernel blocks (not by comm waits)
  std::vector<MainGroup> main_groups;  // running main-kernel block groups, in start order
  std::vector<Transfer> transfers;     // comm transfers in flight, in start order
  bool fill_load_changed = false;      // re-time main_groups and transfers after this instant
  // Streams whose head fill launch has blocks on SMs, in the order their first block started
  // (the fill load is summed in this order: deterministic).
  std::vector<SimStream*> active_fill;
  bool dispatch_due = false;  // in World::Impl::dispatch_queue
  uint64_t main_streams_created = 0;  // jitter keys: main and fill streams counted apart
  uint64_t fill_streams_created = 0;
  std::vector<PendingEntry> pending;
  std::vector<ActivityRecord> activities;
  std::unordered_map<uintptr_t, size_t> arenas;
  uintptr_t next_arena_address = 0;
};

enum class EventType : uint8_t { Advance, OpComplete, ItemDone, BlocksDone, TransferDone };

struct HeapEntry {
  double time_us;
  uint64_t sequence;
  SimStream* stream;
  uint64_t item;   // ItemDone: the batch's first item
  uint64_t count;  // ItemDone: items in the batch (consecutive); BlocksDone / TransferDone: version
  double item_us;  // ItemDone: the duration of each item of the batch
  EventType type;
};

struct HeapLater {
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    if (a.time_us != b.time_us) return a.time_us > b.time_us;
    return a.sequence > b.sequence;
  }
};

struct WordBlock {
  size_t count = 0;
  int pins = 0;        // queued ops using these words
  bool freed = false;  // free_words was called; deleted when pins reaches 0
};

struct World::Impl {
  explicit Impl(uint64_t seed) : seed(seed) {}

  mutable Mutex mutex;
  Mutex hooks_mutex ACQUIRED_BEFORE(mutex);  // held while hooks run (remove waits for them)
  std::vector<std::pair<const void*, std::function<void()>>> hooks GUARDED_BY(hooks_mutex);
  std::atomic<int> attached{0};
  // The thread that last ran the world (run_until*), or created it before any run: a wait on it
  // for something only a run can bring would never return (World::is_driven_by_calling_thread).
  std::atomic<std::thread::id> driver{std::this_thread::get_id()};
  uintptr_t handle = 0;  // the world's C handle (immutable after create)
  std::vector<DeviceState> devices GUARDED_BY(mutex);  // size immutable after create

  double now GUARDED_BY(mutex) = 0.0;
  uint64_t next_sequence GUARDED_BY(mutex) = 1;
  uint64_t next_group_id GUARDED_BY(mutex) = 1;  // MainGroup ids
  uint64_t next_transfer_id GUARDED_BY(mutex) = 1;  // Transfer ids
  uint64_t next_stream_id GUARDED_BY(mutex) = 1;
  uint64_t next_event_id GUARDED_BY(mutex) = 1;
  uint64_t events_processed GUARDED_BY(mutex) = 0;
  const uint64_t seed;
  bool record_activities GUARDED_BY(mutex) = true;
  std::vector<HeapEntry> heap GUARDED_BY(mutex);
  std::vector<int> dispatch_queue GUARDED_BY(mutex);  // devices to dispatch after this instant
  std::unordered_map<const void*, std::unique_ptr<SimStream>> streams GUARDED_BY(mutex);
  std::unordered_map<const void*, std::unique_ptr<SimEvent>> events GUARDED_BY(mutex);
  std::vector<std::unique_ptr<Record>> record_storage GUARDED_BY(mutex);
  std::vector<Record*> free_records GUARDED_BY(mutex);
  std::map<uintptr_t, WordBlock> words GUARDED_BY(mutex);
  std::vector<SimStream*> graveyard GUARDED_BY(mutex);

  // ---- Lookups (sim_world.cpp) ----
  SimStream* live_stream(const void* handle) const REQUIRES(mutex);
  SimEvent* live_event(const void* handle) const REQUIRES(mutex);
  // The device list and each device's sm_count never change after create: read without lock.
  bool valid_device(int device) const { return device >= 0 && device < int(device_count()); }
  size_t device_count() const NO_THREAD_SAFETY_ANALYSIS { return devices.size(); }
  int sm_count_of(int device) const NO_THREAD_SAFETY_ANALYSIS {
    return devices[static_cast<size_t>(device)].sm_count;
  }

  // ---- Event loop (sim_event_loop.cpp) ----
  Record* new_record() REQUIRES(mutex);
  static void retain(Record* record);
  void release(Record* record) REQUIRES(mutex);
  void schedule(double time_us, EventType type, SimStream* stream, uint64_t item = 0,
                uint64_t count = 0, double item_us = 0.0) REQUIRES(mutex);
  double jitter_factor(const DeviceState& device, uint64_t stream_key, uint64_t ordinal,
                       uint64_t item = 0) const;
  void record_activity(int device, ActivityKind kind, const char* name, const SimStream& stream,
                       double start_us, double end_us, uint64_t correlation, int blocks,
                       double all_blocks_started_us = -1.0)
      REQUIRES(mutex);
  // Enqueues an op; an idle stream gets an Advance event at the current time (ops never run
  // at enqueue: everything happens inside a run, in event order).
  void enqueue(SimStream* stream, Op op) REQUIRES(mutex);
  void pop_head(SimStream* stream) REQUIRES(mutex);
  void complete_record(Record* record) REQUIRES(mutex);
  void start_wait(SimStream* stream, Op& op) REQUIRES(mutex);
  // Latency + slowed transfer of a wait whose transfer starts now (after its record completed).
  double wait_span(const SimStream& stream, const Op& op) const REQUIRES(mutex);
  // A wait whose record completed at record_us: its end after latency + transfer
  // (sim_transfers.cpp).
  void start_transfer(SimStream* stream, const Op& op, double record_us) REQUIRES(mutex);
  void retime_transfers(int device) REQUIRES(mutex);
  void transfer_done(int device, uint64_t id, uint64_t version) REQUIRES(mutex);
  void advance(SimStream* stream) REQUIRES(mutex);
  void complete_head(SimStream* stream) REQUIRES(mutex);
  // Processes the events of the earliest instant, then dispatches the devices they touched.
  void process_one() REQUIRES(mutex);
  // A main group's or a transfer's end event that a re-timing replaced.
  bool stale(const HeapEntry& entry) const REQUIRES(mutex);
  void drop_stale_front() REQUIRES(mutex);
  void bury_drained_streams() REQUIRES(mutex);
  pfResult_t check_blocked() const REQUIRES(mutex);
  pfResult_t run_while_not(const std::function<bool()>& done) REQUIRES(mutex);
  void run_hooks() EXCLUDES(mutex);

  // ---- SM scheduler and interference loads (sim_dispatch.cpp) ----
  void add_pending(SimStream* stream, const Op& op) REQUIRES(mutex);
  void dispatch(int device_index) REQUIRES(mutex);
  // Starts `count` blocks of the head kernel now (one event for the group).
  void start_kernel_blocks(SimStream* stream, Op& op, int count) REQUIRES(mutex);
  // A group's end event: completes the group unless the event is stale (re-timed since).
  void kernel_group_done(int device, uint64_t group_id, uint64_t version) REQUIRES(mutex);
  // Banks the progress of the device's running groups and re-times them at the current load.
  void retime_main_groups(int device) REQUIRES(mutex);
  // L_fill: sum over resident fill blocks of their intensity, per SM of the device.
  double fill_load(const DeviceState& device) const;
  // L_main: resident main-kernel blocks x main_mem_intensity, per SM of the device.
  static double main_load(const DeviceState& device);
  void fill_block_started(SimStream* stream) REQUIRES(mutex);
  void fill_block_exited(SimStream* stream) REQUIRES(mutex);

  // ---- Fill kernels (sim_fill.cpp) ----
  // Claims the next item for a block of the head fill launch; false: the block exits.
  bool claim(SimStream* stream, Op& op, uint64_t* item) REQUIRES(mutex);
  // Claims a batch for a block (one item, or several when items are shorter than the quantum)
  // and schedules its completion; false when not even one item could be claimed.
  bool start_batch(SimStream* stream, Op& op) REQUIRES(mutex);
  void batch_done(SimStream* stream, uint64_t first_item, uint64_t count, double item_us)
      REQUIRES(mutex);

  // ---- Words (sim_memory.cpp) ----
  // Pins the world word block holding `word` (if any) for `op`; refuses freed words.
  pfResult_t pin_word(const void* word, Op* op) REQUIRES(mutex);
  void unpin_words(Op& op) REQUIRES(mutex);
};

// The world whose on_item callback this thread is running (its lock is held), or null.
const World::Impl* callback_world();
// A pfResult_t-returning World method called from inside one of its own on_item callbacks
// would deadlock on the world lock: it fails instead with this error.
pfResult_t refuse_in_callback(const char* what);

}  // namespace pipefill::sim
