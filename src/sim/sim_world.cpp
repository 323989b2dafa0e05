// The discrete-event engine behind the simulated device. Model and semantics are documented in
// docs/simulated-device.md; the comments here explain the implementation choices.
//
// Structure: each stream is a FIFO of ops; only its head op can be in progress, so every
// scheduled event can name its target by the stream alone. A binary heap orders the events by
// (time, sequence number), which makes runs byte-identical for the same program and seed.
// Ops that need SMs (kernels, SM-holding waits, fill launches) queue per device in a small
// vector sorted by (fill class, priority, enqueue order); dispatch() serves it strictly in that
// order whenever SMs free up or a new head arrives.
#include "sim/sim_world.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/error.hpp"
#include "common/log.hpp"
#include "sim/rng.hpp"

namespace pipefill::sim {
namespace {

constexpr size_t kWordAlignment = 256;
constexpr size_t kArenaAlignment = 256;
constexpr int kMaxDevices = 1 << 16;
constexpr int kMaxSmCount = 1 << 20;

// ---- Global handle registry: maps bare stream/event/world pointers to their world ----------
// Leaked on purpose so that it outlives every static object that might still use a world.
struct Registry {
  using HandleMap = std::unordered_map<const void*, World*>;
  std::mutex mutex;
  std::unordered_set<const World*> worlds;
  HandleMap streams;
  HandleMap events;

  void add(HandleMap& map, const void* handle, World* world) {
    std::lock_guard lock(mutex);
    map[handle] = world;
  }
  void remove(HandleMap& map, const void* handle) {
    std::lock_guard lock(mutex);
    map.erase(handle);
  }
  World* find(const HandleMap& map, const void* handle) {
    std::lock_guard lock(mutex);
    const auto it = map.find(handle);
    return it == map.end() ? nullptr : it->second;
  }
};

Registry& registry() {
  static Registry* instance = new Registry;
  return *instance;
}

thread_local double t_callback_time_us = std::numeric_limits<double>::quiet_NaN();

bool finite_nonnegative(double value) { return std::isfinite(value) && value >= 0.0; }

// ---- A small growable ring buffer: a FIFO that does not allocate in steady state ------------
template <typename T>
class RingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return slots_[head_]; }
  void push_back(const T& value) {
    if (size_ == slots_.size()) grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = value;
    ++size_;
  }
  void pop_front() {
    slots_[head_] = T{};
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }

 private:
  void grow() {
    std::vector<T> bigger(std::max<size_t>(8, slots_.size() * 2));
    for (size_t i = 0; i < size_; ++i) bigger[i] = slots_[(head_ + i) & (slots_.size() - 1)];
    slots_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<T> slots_;  // capacity is always a power of two (or zero)
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace

// ---- Engine data ----------------------------------------------------------------------------

struct SimStream;

// One record of an event: completes when the record op reaches its stream's head. Shared by the
// event (while it is the latest record), the record op and every wait op that captured it, so it
// is reference counted and recycled through a free list (no allocation per record).
struct Record {
  bool completed = false;
  double time_us = -1.0;
  int references = 0;
  std::vector<SimStream*> waiters;  // streams whose head wait started before completion
};

enum class OpType : uint8_t { Kernel, Delay, Record, Wait, WriteWord, CopyWord, Ticket, Opaque };

struct Op {
  OpType type = OpType::Kernel;
  int sms = 0;           // kernel / wait: SMs needed; ticket / opaque: blocks
  double time_us = 0.0;  // kernel / delay: duration; wait: latency; fill: item cost
  uint64_t sequence = 0; // enqueue order (tie-break among pending ops, correlation id)
  Record* record = nullptr;                // record / wait
  uint64_t* word = nullptr;                // write / copy destination
  const uint64_t* source = nullptr;        // copy source
  uint64_t value = 0;                      // write value; opaque first item
  uint64_t ordinal = 0;  // kernels: index among the stream's kernels; fill: among its launches
  // Fill launches (ticket fields copied from the slice at enqueue time).
  const volatile uint64_t* gate = nullptr;
  uint64_t bubble_id = 0;
  uint64_t* budget_counter = nullptr;
  uint64_t max_items = 0;
  uint64_t* cursor = nullptr;
  uint64_t total_items = 0;  // ticket: job items; opaque: items of this launch
  pfSimItemFn on_item = nullptr;
  void* user = nullptr;
};

struct SimStream {
  int device = 0;
  int priority = 0;
  bool fill = false;
  uint64_t id = 0;
  // Jitter is drawn from (seed, jitter_key, op ordinal[, item]) rather than from one sequence
  // consumed in event order: the main job's kernels then get the same durations whether or not
  // fill work runs beside them, so filled and unfilled runs compare exactly even with jitter.
  uint64_t jitter_key = 0;
  uint64_t kernels_enqueued = 0;
  uint64_t launches_enqueued = 0;
  bool destroyed = false;
  bool in_graveyard = false;
  bool advance_scheduled = false;
  RingQueue<Op> ops;
  // State of the head op once started.
  bool head_started = false;
  double head_start_us = 0.0;
  int held_sms = 0;
  int blocks_unstarted = 0;
  int blocks_active = 0;
  uint64_t opaque_next = 0;
  uint64_t items_done = 0;
  double first_item_start_us = -1.0;
  double last_item_end_us = -1.0;
};

struct SimEvent {
  uint64_t id = 0;
  Record* latest = nullptr;
};

struct PendingEntry {
  SimStream* stream = nullptr;
  bool fill_class = false;
  int priority = 0;
  uint64_t sequence = 0;
  bool operator<(const PendingEntry& other) const {
    if (fill_class != other.fill_class) return !fill_class;  // main work first
    if (priority != other.priority) return priority < other.priority;
    return sequence < other.sequence;
  }
};

struct DeviceState {
  int sm_count = 0;
  size_t memory_total = 0;
  size_t memory_used = 0;
  size_t arena_used = 0;
  double jitter = 0.0;
  double interference = 0.0;
  int reserved_sms = 0;
  int fill_sms = 0;
  int free_sms = 0;
  int fill_in_use = 0;  // SMs held by fill blocks
  uint64_t main_streams_created = 0;  // jitter keys: main and fill streams counted apart
  uint64_t fill_streams_created = 0;
  std::vector<PendingEntry> pending;
  std::vector<ActivityRecord> activities;
  std::unordered_map<uintptr_t, size_t> arenas;
  uintptr_t next_arena_address = 0;
};

enum class EventType : uint8_t { Advance, OpComplete, ItemDone };

struct HeapEntry {
  double time_us;
  uint64_t sequence;
  SimStream* stream;
  uint64_t item;
  EventType type;
};

struct HeapLater {
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    if (a.time_us != b.time_us) return a.time_us > b.time_us;
    return a.sequence > b.sequence;
  }
};

struct World::Impl {
  explicit Impl(uint64_t seed) : seed(seed) {}

  mutable std::mutex mutex;
  std::mutex hooks_mutex;  // held while hooks run, so remove_pre_run_hook waits for them
  std::vector<std::pair<const void*, std::function<void()>>> hooks;
  std::atomic<int> attached{0};

  // Everything below is guarded by `mutex`.
  double now = 0.0;
  uint64_t next_sequence = 1;
  uint64_t next_stream_id = 1;
  uint64_t next_event_id = 1;
  uint64_t seed;
  bool record_activities = true;
  std::vector<DeviceState> devices;
  std::vector<HeapEntry> heap;
  std::unordered_map<const void*, std::unique_ptr<SimStream>> streams;
  std::unordered_map<const void*, std::unique_ptr<SimEvent>> events;
  std::vector<std::unique_ptr<Record>> record_storage;
  std::vector<Record*> free_records;
  std::unordered_map<const uint64_t*, size_t> words;
  std::vector<SimStream*> graveyard;

  // ---- Lookups (lock held) ----
  SimStream* live_stream(const void* handle) const {
    auto it = streams.find(handle);
    if (it == streams.end() || it->second->destroyed) return nullptr;
    return it->second.get();
  }
  SimEvent* live_event(const void* handle) const {
    auto it = events.find(handle);
    return it == events.end() ? nullptr : it->second.get();
  }
  bool valid_device(int device) const {
    return device >= 0 && device < static_cast<int>(devices.size());
  }

  // ---- Records ----
  Record* new_record() {
    Record* record;
    if (!free_records.empty()) {
      record = free_records.back();
      free_records.pop_back();
    } else {
      record_storage.push_back(std::make_unique<Record>());
      record = record_storage.back().get();
    }
    record->completed = false;
    record->time_us = -1.0;
    record->references = 0;
    record->waiters.clear();
    return record;
  }
  static void retain(Record* record) {
    if (record) ++record->references;
  }
  void release(Record* record) {
    if (record && --record->references == 0) free_records.push_back(record);
  }

  // ---- Scheduling ----
  void schedule(double time_us, EventType type, SimStream* stream, uint64_t item = 0) {
    heap.push_back(HeapEntry{time_us, next_sequence++, stream, item, type});
    std::push_heap(heap.begin(), heap.end(), HeapLater{});
  }

  // Multiplicative duration jitter for the op identified by (stream key, ordinal, item).
  double jitter_factor(const DeviceState& device, uint64_t stream_key, uint64_t ordinal,
                       uint64_t item = 0) {
    if (device.jitter == 0.0) return 1.0;
    SplitMix64 mixer(seed ^ (stream_key * 0x9E3779B97F4A7C15ull));
    SplitMix64 draw(mixer.next() ^ (ordinal * 0xC2B2AE3D27D4EB4Full) ^
                    (item * 0x165667B19E3779F9ull));
    return std::max(0.05, 1.0 + device.jitter * draw.normal());
  }

  void record_activity(int device, ActivityKind kind, const char* name, const SimStream& stream,
                       double start_us, double end_us, uint64_t correlation, int blocks) {
    if (!record_activities) return;
    ActivityRecord record;
    record.kind = kind;
    record.name = name;
    record.device = device;
    record.stream = stream.id;
    record.start_us = start_us;
    record.end_us = end_us;
    record.correlation = correlation;
    record.grid_blocks = blocks;
    devices[device].activities.push_back(std::move(record));
  }

  // Enqueues an op; an idle stream gets an Advance event at the current time (ops never run
  // at enqueue: everything happens inside a run, in event order).
  void enqueue(SimStream* stream, Op op) {
    op.sequence = next_sequence++;
    if (op.type == OpType::Kernel) {
      op.ordinal = stream->kernels_enqueued++;
    } else if (op.type == OpType::Ticket || op.type == OpType::Opaque) {
      op.ordinal = stream->launches_enqueued++;
    }
    const bool was_idle = stream->ops.empty();
    stream->ops.push_back(op);
    if (was_idle && !stream->advance_scheduled) {
      stream->advance_scheduled = true;
      schedule(now, EventType::Advance, stream);
    }
  }

  void pop_head(SimStream* stream) {
    Op& op = stream->ops.front();
    release(op.record);
    stream->ops.pop_front();
    stream->head_started = false;
    stream->held_sms = 0;
    stream->blocks_unstarted = 0;
    stream->blocks_active = 0;
    stream->opaque_next = 0;
    stream->items_done = 0;
    stream->first_item_start_us = -1.0;
    stream->last_item_end_us = -1.0;
  }

  void complete_record(Record* record) {
    record->completed = true;
    record->time_us = now;
    for (SimStream* waiter : record->waiters) {
      schedule(now + waiter->ops.front().time_us, EventType::OpComplete, waiter);
    }
    record->waiters.clear();
  }

  // A started wait: completes at record time + latency, or when the record completes.
  void start_wait(SimStream* stream, Op& op) {
    if (op.record->completed) {
      schedule(std::max(now, op.record->time_us + op.time_us), EventType::OpComplete, stream);
    } else {
      op.record->waiters.push_back(stream);
    }
  }

  void add_pending(SimStream* stream, const Op& op, bool fill_class) {
    PendingEntry entry{stream, fill_class, stream->priority, op.sequence};
    auto& pending = devices[stream->device].pending;
    pending.insert(std::upper_bound(pending.begin(), pending.end(), entry), entry);
  }

  // Runs the head ops that need no time, and starts the first one that does.
  void advance(SimStream* stream) {
    while (!stream->ops.empty() && !stream->head_started) {
      Op& op = stream->ops.front();
      switch (op.type) {
        case OpType::Record:
          complete_record(op.record);
          pop_head(stream);
          continue;
        case OpType::WriteWord:
          *op.word = op.value;
          pop_head(stream);
          continue;
        case OpType::CopyWord:
          *op.word = *op.source;
          pop_head(stream);
          continue;
        case OpType::Delay:
          stream->head_started = true;
          stream->head_start_us = now;
          schedule(now + op.time_us, EventType::OpComplete, stream);
          return;
        case OpType::Kernel:
          stream->head_started = true;
          add_pending(stream, op, false);
          return;
        case OpType::Wait:
          if (op.record == nullptr) {  // the event had no record when the wait was enqueued
            pop_head(stream);
            continue;
          }
          if (op.sms > 0) {
            stream->head_started = true;
            add_pending(stream, op, false);
            return;
          }
          if (op.record->completed && op.record->time_us + op.time_us <= now) {
            pop_head(stream);
            continue;
          }
          stream->head_started = true;
          stream->head_start_us = now;
          start_wait(stream, op);
          return;
        case OpType::Ticket:
        case OpType::Opaque:
          stream->head_started = true;
          stream->head_start_us = now;
          stream->blocks_unstarted = op.sms;
          add_pending(stream, op, true);
          return;
      }
    }
    if (stream->ops.empty() && stream->destroyed && !stream->in_graveyard) {
      stream->in_graveyard = true;
      graveyard.push_back(stream);
    }
  }

  // Claims the next item for a block of the head fill launch (the check a real block makes
  // before each item: gate, slice budget, job cursor; all at the current virtual time).
  static bool claim(SimStream* stream, Op& op, uint64_t* item) {
    if (op.type == OpType::Ticket) {
      if (*op.gate >= op.bubble_id) return false;
      if ((*op.budget_counter)++ >= op.max_items) return false;
      if (*op.cursor >= op.total_items) return false;
      *item = (*op.cursor)++;
      return true;
    }
    if (stream->opaque_next >= op.total_items) return false;
    *item = op.value + stream->opaque_next++;
    return true;
  }

  void start_item(SimStream* stream, Op& op, uint64_t item) {
    if (stream->first_item_start_us < 0.0) stream->first_item_start_us = now;
    const double duration =
        op.time_us * jitter_factor(devices[stream->device], stream->jitter_key, op.ordinal,
                                   item + 1);
    schedule(now + duration, EventType::ItemDone, stream, item);
  }

  // Gives free SMs to pending work, strictly in (main before fill, priority, enqueue) order:
  // the first entry that cannot start blocks everything behind it. Never completes an op
  // itself (that would re-enter advance() while `pending` is being walked): a fill launch whose
  // blocks all exited at once gets an OpComplete event at the current time instead.
  void dispatch(int device_index) {
    DeviceState& device = devices[device_index];
    auto& pending = device.pending;
    size_t i = 0;
    while (i < pending.size()) {
      SimStream* stream = pending[i].stream;
      Op& op = stream->ops.front();
      if (!pending[i].fill_class) {
        const int need = std::min(op.sms, device.sm_count);
        if (need > device.free_sms) break;
        device.free_sms -= need;
        stream->held_sms = need;
        stream->head_start_us = now;
        if (op.type == OpType::Kernel) {
          const double slowdown =
              1.0 + device.interference * device.fill_in_use / static_cast<double>(device.sm_count);
          const double duration =
              op.time_us * jitter_factor(device, stream->jitter_key, op.ordinal) * slowdown;
          schedule(now + duration, EventType::OpComplete, stream);
        } else {
          start_wait(stream, op);
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      // A fill launch: blocks start one SM at a time inside the fill partition. A block whose
      // first claim fails exits at once and gives its SM straight back.
      while (stream->blocks_unstarted > 0 && device.free_sms > 0 &&
             device.fill_in_use < device.fill_sms) {
        --stream->blocks_unstarted;
        uint64_t item = 0;
        if (claim(stream, op, &item)) {
          --device.free_sms;
          ++device.fill_in_use;
          ++stream->blocks_active;
          start_item(stream, op, item);
        }
      }
      if (stream->blocks_unstarted > 0) break;
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      if (stream->blocks_active == 0) schedule(now, EventType::OpComplete, stream);
    }
  }

  void complete_head(SimStream* stream) {
    Op& op = stream->ops.front();
    DeviceState& device = devices[stream->device];
    switch (op.type) {
      case OpType::Kernel:
        device.free_sms += stream->held_sms;
        record_activity(stream->device, ActivityKind::Kernel, "sim_kernel", *stream,
                        stream->head_start_us, now, op.sequence, stream->held_sms);
        break;
      case OpType::Delay:
        record_activity(stream->device, ActivityKind::Memcpy, "sim_delay", *stream,
                        stream->head_start_us, now, op.sequence, 0);
        break;
      case OpType::Wait:
        if (stream->held_sms > 0) {
          device.free_sms += stream->held_sms;
          record_activity(stream->device, ActivityKind::Comm, "ncclKernel_SimRecv", *stream,
                          stream->head_start_us, now, op.sequence, stream->held_sms);
        }
        break;
      case OpType::Ticket:
      case OpType::Opaque:
        if (stream->items_done > 0) {
          record_activity(stream->device, ActivityKind::Fill,
                          op.type == OpType::Ticket ? "fill_ticket" : "fill_opaque", *stream,
                          stream->first_item_start_us, stream->last_item_end_us, op.sequence,
                          op.sms);
        }
        break;
      default:
        break;
    }
    pop_head(stream);
    advance(stream);
  }

  void item_done(SimStream* stream, uint64_t item) {
    Op& op = stream->ops.front();
    ++stream->items_done;
    stream->last_item_end_us = now;
    if (op.on_item) {
      t_callback_time_us = now;
      op.on_item(op.user, item);
      t_callback_time_us = std::numeric_limits<double>::quiet_NaN();
    }
    uint64_t next = 0;
    if (claim(stream, op, &next)) {
      start_item(stream, op, next);
      return;
    }
    DeviceState& device = devices[stream->device];
    --stream->blocks_active;
    ++device.free_sms;
    --device.fill_in_use;
    if (stream->blocks_active == 0 && stream->blocks_unstarted == 0) complete_head(stream);
  }

  void process_one() {
    std::pop_heap(heap.begin(), heap.end(), HeapLater{});
    const HeapEntry entry = heap.back();
    heap.pop_back();
    now = entry.time_us;
    SimStream* stream = entry.stream;
    switch (entry.type) {
      case EventType::Advance:
        stream->advance_scheduled = false;
        advance(stream);
        break;
      case EventType::OpComplete:
        complete_head(stream);
        break;
      case EventType::ItemDone:
        item_done(stream, entry.item);
        break;
    }
    dispatch(stream->device);
  }

  void bury_drained_streams() {
    for (SimStream* stream : graveyard) streams.erase(stream);
    graveyard.clear();
  }

  // Called when the heap ran empty: any stream still holding ops can never make progress.
  pfResult_t check_blocked() const {
    const SimStream* first = nullptr;
    size_t blocked = 0;
    for (const auto& [handle, stream] : streams) {
      if (stream->ops.empty()) continue;
      ++blocked;
      if (first == nullptr || stream->id < first->id) first = stream.get();
    }
    if (blocked == 0) return pfSuccess;
    return fail(pfErrorInvalidState,
                "simulated deadlock at t={} us: {} stream(s) still have work but nothing can "
                "run (first: stream id {} on device {}, {} op(s) queued; a wait whose record "
                "never runs, or SMs held by a wait)",
                now, blocked, first->id, first->device, first->ops.size());
  }

  template <typename Done>
  pfResult_t run_while_not(Done done) {
    while (!done()) {
      if (heap.empty()) {
        bury_drained_streams();
        PF_TRY(check_blocked());
        return fail(pfErrorInvalidState, "simulated wait can never complete at t={} us", now);
      }
      process_one();
    }
    bury_drained_streams();
    return pfSuccess;
  }

  void run_hooks() {
    std::lock_guard hooks_lock(hooks_mutex);
    for (auto& [owner, hook] : hooks) hook();
  }
};

// ---- World ----------------------------------------------------------------------------------

World::World() = default;

World::~World() {
  if (!impl_) return;
  {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    reg.worlds.erase(this);
    for (const auto& [handle, stream] : impl_->streams) reg.streams.erase(handle);
    for (const auto& [handle, event] : impl_->events) reg.events.erase(handle);
  }
  for (const auto& [words, count] : impl_->words) {
    ::operator delete[](const_cast<uint64_t*>(words), std::align_val_t{kWordAlignment});
  }
}

pfResult_t World::create(int device_count, const pfSimDeviceDesc_t* desc, uint64_t seed,
                         std::unique_ptr<World>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "world output pointer is NULL");
  if (device_count < 1 || device_count > kMaxDevices) {
    return fail(pfErrorInvalidArgument, "device_count {} is out of range [1, {}]", device_count,
                kMaxDevices);
  }
  const pfSimDeviceDesc_t defaults = PF_SIM_DEVICE_DESC_INITIALIZER;
  const pfSimDeviceDesc_t& d = desc ? *desc : defaults;
  if (d.sm_count < 1 || d.sm_count > kMaxSmCount) {
    return fail(pfErrorInvalidArgument, "sm_count {} is out of range [1, {}]", d.sm_count,
                kMaxSmCount);
  }
  if (d.memory_bytes == 0) return fail(pfErrorInvalidArgument, "memory_bytes 0 must be > 0");
  if (!finite_nonnegative(d.jitter_fraction)) {
    return fail(pfErrorInvalidArgument, "jitter_fraction {} must be finite and >= 0",
                d.jitter_fraction);
  }
  if (!finite_nonnegative(d.interference)) {
    return fail(pfErrorInvalidArgument, "interference {} must be finite and >= 0",
                d.interference);
  }
  std::unique_ptr<World> world(new World());
  world->impl_ = std::make_unique<Impl>(seed);
  world->impl_->devices.resize(static_cast<size_t>(device_count));
  for (int i = 0; i < device_count; ++i) {
    DeviceState& device = world->impl_->devices[static_cast<size_t>(i)];
    device.sm_count = d.sm_count;
    device.memory_total = d.memory_bytes;
    device.jitter = d.jitter_fraction;
    device.interference = d.interference;
    device.fill_sms = d.sm_count;
    device.free_sms = d.sm_count;
    // Simulated arena addresses: a distinct, never-mapped-by-us range per device.
    device.next_arena_address = (uintptr_t{0x5000} << 32) + (uintptr_t(i) << 40);
  }
  {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    reg.worlds.insert(world.get());
  }
  log::debug("simulated world: {} device(s), {} SMs, {} bytes, jitter {}, interference {}, "
             "seed {}", device_count, d.sm_count, d.memory_bytes, d.jitter_fraction,
             d.interference, seed);
  *out = std::move(world);
  return pfSuccess;
}

void World::add_pre_run_hook(const void* owner, std::function<void()> hook) {
  std::lock_guard lock(impl_->hooks_mutex);
  impl_->hooks.emplace_back(owner, std::move(hook));
}

void World::remove_pre_run_hook(const void* owner) {
  std::lock_guard lock(impl_->hooks_mutex);
  std::erase_if(impl_->hooks, [owner](const auto& entry) { return entry.first == owner; });
}

double World::now() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->now;
}

int World::device_count() const { return static_cast<int>(impl_->devices.size()); }

int World::sm_count(int device) const {
  if (!impl_->valid_device(device)) return 0;
  return impl_->devices[static_cast<size_t>(device)].sm_count;  // immutable after create
}

std::vector<ActivityRecord> World::activities(int device) const {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->valid_device(device)) return {};
  return impl_->devices[static_cast<size_t>(device)].activities;
}

size_t World::activities_since(int device, size_t from, std::vector<ActivityRecord>* out) const {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->valid_device(device)) return 0;
  const auto& log = impl_->devices[static_cast<size_t>(device)].activities;
  if (from < log.size()) {
    out->insert(out->end(), log.begin() + static_cast<std::ptrdiff_t>(from), log.end());
  }
  return log.size();
}

void World::set_activity_recording(bool enabled) {
  std::lock_guard lock(impl_->mutex);
  impl_->record_activities = enabled;
}

// ---- Streams ----

pfResult_t World::create_stream(int device, int priority, bool fill, void** out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "stream output pointer is NULL");
  if (!impl_->valid_device(device)) {
    return fail(pfErrorInvalidArgument, "device {} is out of range [0, {})", device,
                device_count());
  }
  if (priority < kHighestPriority || priority > kLowestPriority) {
    return fail(pfErrorInvalidArgument,
                "stream priority {} is out of range [{}, {}] (lower number = higher priority)",
                priority, kHighestPriority, kLowestPriority);
  }
  auto stream = std::make_unique<SimStream>();
  stream->device = device;
  stream->priority = priority;
  stream->fill = fill;
  SimStream* raw = stream.get();
  {
    std::lock_guard lock(impl_->mutex);
    stream->id = impl_->next_stream_id++;
    DeviceState& state = impl_->devices[static_cast<size_t>(device)];
    const uint64_t index = fill ? state.fill_streams_created++ : state.main_streams_created++;
    stream->jitter_key = (static_cast<uint64_t>(device) << 40) ^ (fill ? (1ull << 39) : 0) ^
                         (index + 1);
    impl_->streams.emplace(raw, std::move(stream));
  }
  registry().add(registry().streams, raw, this);
  *out = raw;
  return pfSuccess;
}

pfResult_t World::destroy_stream(void* handle) {
  {
    std::lock_guard lock(impl_->mutex);
    SimStream* stream = impl_->live_stream(handle);
    if (stream == nullptr) {
      return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world",
                  handle);
    }
    stream->destroyed = true;
    // A drained stream goes now; one with work left goes when it drains (advance()).
    if (stream->ops.empty()) impl_->streams.erase(handle);
  }
  registry().remove(registry().streams, handle);
  return pfSuccess;
}

bool World::is_main_stream_of(const void* handle, int device) const {
  std::lock_guard lock(impl_->mutex);
  const SimStream* stream = impl_->live_stream(handle);
  return stream != nullptr && !stream->fill && stream->device == device;
}

bool World::is_live_stream(const void* handle) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->live_stream(handle) != nullptr;
}

uint64_t World::stream_id(const void* handle) const {
  std::lock_guard lock(impl_->mutex);
  const SimStream* stream = impl_->live_stream(handle);
  return stream ? stream->id : 0;
}

// ---- Stream operations ----

#define PF_SIM_LOOKUP_STREAM(var, handle)                                                     \
  SimStream* var = impl_->live_stream(handle);                                               \
  if (var == nullptr) {                                                                      \
    return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world", \
                static_cast<const void*>(handle));                                           \
  }

pfResult_t World::launch_kernel(void* handle, double duration_us, int sm_count) {
  if (!finite_nonnegative(duration_us)) {
    return fail(pfErrorInvalidArgument, "kernel duration_us {} must be finite and >= 0",
                duration_us);
  }
  if (sm_count < 1) return fail(pfErrorInvalidArgument, "kernel sm_count {} must be >= 1", sm_count);
  std::lock_guard lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::Kernel;
  op.sms = std::min(sm_count, impl_->devices[static_cast<size_t>(stream->device)].sm_count);
  op.time_us = duration_us;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::delay(void* handle, double duration_us) {
  if (!finite_nonnegative(duration_us)) {
    return fail(pfErrorInvalidArgument, "delay duration_us {} must be finite and >= 0",
                duration_us);
  }
  std::lock_guard lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::Delay;
  op.time_us = duration_us;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::record_event(void* event_handle, void* stream_handle) {
  std::lock_guard lock(impl_->mutex);
  SimEvent* event = impl_->live_event(event_handle);
  if (event == nullptr) {
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                event_handle);
  }
  PF_SIM_LOOKUP_STREAM(stream, stream_handle);
  Record* record = impl_->new_record();
  Impl::retain(record);  // the op's reference
  Impl::retain(record);  // the event's reference (latest record)
  impl_->release(event->latest);
  event->latest = record;
  Op op;
  op.type = OpType::Record;
  op.record = record;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::wait_event(void* stream_handle, void* event_handle, double latency_us,
                             int sm_count) {
  if (!finite_nonnegative(latency_us)) {
    return fail(pfErrorInvalidArgument, "wait latency_us {} must be finite and >= 0", latency_us);
  }
  if (sm_count < 0) return fail(pfErrorInvalidArgument, "wait sm_count {} must be >= 0", sm_count);
  std::lock_guard lock(impl_->mutex);
  SimEvent* event = impl_->live_event(event_handle);
  if (event == nullptr) {
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                event_handle);
  }
  PF_SIM_LOOKUP_STREAM(stream, stream_handle);
  Op op;
  op.type = OpType::Wait;
  op.record = event->latest;  // CUDA semantics: the record that is latest now
  Impl::retain(op.record);
  op.time_us = latency_us;
  op.sms = std::min(sm_count, impl_->devices[static_cast<size_t>(stream->device)].sm_count);
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::write_word(void* handle, uint64_t* word, uint64_t value) {
  if (word == nullptr) return fail(pfErrorInvalidArgument, "word pointer is NULL");
  std::lock_guard lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::WriteWord;
  op.word = word;
  op.value = value;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::copy_word(void* handle, const uint64_t* source, uint64_t* destination) {
  if (source == nullptr) return fail(pfErrorInvalidArgument, "source word pointer is NULL");
  if (destination == nullptr) {
    return fail(pfErrorInvalidArgument, "destination word pointer is NULL");
  }
  std::lock_guard lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::CopyWord;
  op.source = source;
  op.word = destination;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::launch_ticket(void* handle, const pfSliceDesc_t* slice, int blocks,
                                double item_cost_us, pfSimItemFn on_item, void* user) {
  if (slice == nullptr) return fail(pfErrorInvalidArgument, "slice pointer is NULL");
  if (slice->gate == nullptr) return fail(pfErrorInvalidArgument, "slice->gate is NULL");
  if (slice->cursor == nullptr) return fail(pfErrorInvalidArgument, "slice->cursor is NULL");
  if (slice->budget_counter == nullptr) {
    return fail(pfErrorInvalidArgument, "slice->budget_counter is NULL");
  }
  if (slice->max_blocks < 1) {
    return fail(pfErrorInvalidArgument, "slice->max_blocks {} must be >= 1", slice->max_blocks);
  }
  if (blocks < 1) return fail(pfErrorInvalidArgument, "ticket blocks {} must be >= 1", blocks);
  if (!std::isfinite(item_cost_us) || item_cost_us <= 0.0) {
    return fail(pfErrorInvalidArgument, "ticket item_cost_us {} must be finite and > 0",
                item_cost_us);
  }
  std::lock_guard lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  const DeviceState& device = impl_->devices[static_cast<size_t>(stream->device)];
  Op op;
  op.type = OpType::Ticket;
  op.sms = std::min({blocks, slice->max_blocks, device.fill_sms});
  op.time_us = item_cost_us;
  op.gate = slice->gate;
  op.bubble_id = slice->bubble_id;
  op.budget_counter = slice->budget_counter;
  op.max_items = slice->max_items;
  op.cursor = slice->cursor;
  op.total_items = slice->total_items;
  op.on_item = on_item;
  op.user = user;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::launch_opaque(void* handle, uint64_t first_item, uint64_t items, int blocks,
                                double item_cost_us, pfSimItemFn on_item, void* user) {
  if (blocks < 1) return fail(pfErrorInvalidArgument, "opaque blocks {} must be >= 1", blocks);
  if (!std::isfinite(item_cost_us) || item_cost_us <= 0.0) {
    return fail(pfErrorInvalidArgument, "opaque item_cost_us {} must be finite and > 0",
                item_cost_us);
  }
  if (items > std::numeric_limits<uint64_t>::max() - first_item) {
    return fail(pfErrorInvalidArgument, "opaque first_item {} + items {} overflows", first_item,
                items);
  }
  std::lock_guard lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::Opaque;
  op.sms = blocks;
  op.time_us = item_cost_us;
  op.value = first_item;
  op.total_items = items;
  op.on_item = on_item;
  op.user = user;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

#undef PF_SIM_LOOKUP_STREAM

// ---- Events ----

pfResult_t World::create_event(void** out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "event output pointer is NULL");
  auto event = std::make_unique<SimEvent>();
  SimEvent* raw = event.get();
  {
    std::lock_guard lock(impl_->mutex);
    event->id = impl_->next_event_id++;
    impl_->events.emplace(raw, std::move(event));
  }
  registry().add(registry().events, raw, this);
  *out = raw;
  return pfSuccess;
}

pfResult_t World::destroy_event(void* handle) {
  {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->events.find(handle);
    if (it == impl_->events.end()) {
      return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                  handle);
    }
    // Records already captured by ops stay alive through their own references.
    impl_->release(it->second->latest);
    impl_->events.erase(it);
  }
  registry().remove(registry().events, handle);
  return pfSuccess;
}

bool World::is_live_event(const void* handle) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->live_event(handle) != nullptr;
}

pfResult_t World::event_state(void* handle, bool* recorded, bool* done, double* time_us) const {
  std::lock_guard lock(impl_->mutex);
  const SimEvent* event = impl_->live_event(handle);
  if (event == nullptr) {
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                handle);
  }
  const Record* record = event->latest;
  if (recorded) *recorded = record != nullptr;
  if (done) *done = record != nullptr && record->completed;
  if (time_us) *time_us = (record != nullptr && record->completed) ? record->time_us : -1.0;
  return pfSuccess;
}

// ---- Running ----

pfResult_t World::run_until(double time_us) {
  if (std::isnan(time_us)) return fail(pfErrorInvalidArgument, "run_until time_us {} is NaN", time_us);
  impl_->run_hooks();
  std::lock_guard lock(impl_->mutex);
  Impl& w = *impl_;
  while (!w.heap.empty() && w.heap.front().time_us <= time_us) w.process_one();
  w.bury_drained_streams();
  if (!w.heap.empty()) {
    // Not idle: the clock stands at the requested time (it never goes backwards).
    if (std::isfinite(time_us)) w.now = std::max(w.now, time_us);
    return pfSuccess;
  }
  return w.check_blocked();
}

pfResult_t World::run_until_idle() {
  impl_->run_hooks();
  std::lock_guard lock(impl_->mutex);
  Impl& w = *impl_;
  while (!w.heap.empty()) w.process_one();
  w.bury_drained_streams();
  return w.check_blocked();
}

pfResult_t World::synchronize_stream(void* handle) {
  std::lock_guard lock(impl_->mutex);
  SimStream* stream = impl_->live_stream(handle);
  if (stream == nullptr) {
    return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world",
                handle);
  }
  return impl_->run_while_not([stream] { return stream->ops.empty(); });
}

pfResult_t World::synchronize_event(void* handle) {
  std::lock_guard lock(impl_->mutex);
  SimEvent* event = impl_->live_event(handle);
  if (event == nullptr) {
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                handle);
  }
  Record* record = event->latest;
  if (record == nullptr) return pfSuccess;  // never recorded: nothing to wait for (CUDA)
  // Hold a reference: an on_item callback cannot re-record the event (no sim calls under the
  // lock), but the loop must not depend on that to keep `record` alive.
  Impl::retain(record);
  const pfResult_t result = impl_->run_while_not([record] { return record->completed; });
  impl_->release(record);
  return result;
}

// ---- Words ----

pfResult_t World::allocate_words(size_t count, uint64_t** words) {
  if (words == nullptr) return fail(pfErrorInvalidArgument, "words output pointer is NULL");
  if (count == 0 || count > (size_t{1} << 32)) {
    return fail(pfErrorInvalidArgument, "word count {} is out of range [1, 2^32]", count);
  }
  auto* memory = static_cast<uint64_t*>(
      ::operator new[](count * sizeof(uint64_t), std::align_val_t{kWordAlignment}));
  std::fill(memory, memory + count, uint64_t{0});
  std::lock_guard lock(impl_->mutex);
  impl_->words.emplace(memory, count);
  *words = memory;
  return pfSuccess;
}

pfResult_t World::free_words(uint64_t* words) {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->words.find(words);
  if (it == impl_->words.end()) {
    return fail(pfErrorInvalidArgument, "words {} were not allocated by this simulated world",
                static_cast<const void*>(words));
  }
  impl_->words.erase(it);
  ::operator delete[](words, std::align_val_t{kWordAlignment});
  return pfSuccess;
}

// ---- Memory ----

#define PF_SIM_CHECK_DEVICE(device)                                                        \
  if (!impl_->valid_device(device)) {                                                     \
    return fail(pfErrorInvalidArgument, "device {} is out of range [0, {})", device,       \
                device_count());                                                           \
  }

pfResult_t World::set_memory_used(int device, size_t bytes) {
  PF_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  if (bytes > state.memory_total) {
    return fail(pfErrorInvalidArgument, "memory used {} bytes exceeds the device's {} bytes",
                bytes, state.memory_total);
  }
  state.memory_used = bytes;
  return pfSuccess;
}

pfResult_t World::memory_info(int device, size_t* free_bytes, size_t* total_bytes) const {
  PF_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(impl_->mutex);
  const DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  const size_t taken = state.memory_used + state.arena_used;
  if (free_bytes) *free_bytes = taken >= state.memory_total ? 0 : state.memory_total - taken;
  if (total_bytes) *total_bytes = state.memory_total;
  return pfSuccess;
}

pfResult_t World::allocate_arena(int device, size_t bytes, void** base) {
  PF_SIM_CHECK_DEVICE(device);
  if (base == nullptr) return fail(pfErrorInvalidArgument, "arena output pointer is NULL");
  if (bytes == 0) return fail(pfErrorInvalidArgument, "arena bytes 0 must be > 0");
  std::lock_guard lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  const size_t taken = state.memory_used + state.arena_used;
  const size_t free_bytes = taken >= state.memory_total ? 0 : state.memory_total - taken;
  if (bytes > free_bytes) {
    return fail(pfErrorOutOfMemory,
                "arena of {} bytes does not fit the {} bytes free on simulated device {}", bytes,
                free_bytes, device);
  }
  const uintptr_t address = state.next_arena_address;
  const size_t rounded = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  state.next_arena_address += rounded + kArenaAlignment;  // a gap keeps arenas distinct
  state.arena_used += bytes;
  state.arenas.emplace(address, bytes);
  *base = reinterpret_cast<void*>(address);
  return pfSuccess;
}

pfResult_t World::free_arena(int device, void* base) {
  PF_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  auto it = state.arenas.find(reinterpret_cast<uintptr_t>(base));
  if (it == state.arenas.end()) {
    return fail(pfErrorInvalidArgument, "{} is not an arena of simulated device {}", base, device);
  }
  state.arena_used -= it->second;
  state.arenas.erase(it);
  return pfSuccess;
}

// ---- Partition ----

pfResult_t World::configure_partition(int device, int reserved_sms, FillPartition* partition) {
  PF_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  if (reserved_sms < 0 || reserved_sms >= state.sm_count) {
    return fail(pfErrorInvalidArgument, "reserved_sms {} is out of range [0, {}) for {} SMs",
                reserved_sms, state.sm_count, state.sm_count);
  }
  state.reserved_sms = reserved_sms;
  state.fill_sms = state.sm_count - reserved_sms;
  if (partition) {
    partition->total_sms = state.sm_count;
    partition->fill_sms = state.fill_sms;
    partition->reserved_sms = reserved_sms;
    partition->hardware_confined = true;
    partition->mode = "simulated-partition";
  }
  return pfSuccess;
}

#undef PF_SIM_CHECK_DEVICE

int World::fill_sms(int device) const {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->valid_device(device)) return 0;
  return impl_->devices[static_cast<size_t>(device)].fill_sms;
}

// ---- Attachment, lookups ----

void World::attach() { impl_->attached.fetch_add(1); }
void World::detach() { impl_->attached.fetch_sub(1); }
int World::attached_count() const { return impl_->attached.load(); }

double World::callback_time_us() { return t_callback_time_us; }

World* World::world_of_stream(const void* stream) {
  return registry().find(registry().streams, stream);
}

World* World::world_of_event(const void* event) { return registry().find(registry().events, event); }

World* world_from_handle(pfSimWorld_t handle) {
  auto* world = reinterpret_cast<World*>(handle);
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  return reg.worlds.count(world) ? world : nullptr;
}

pfSimWorld_t handle_of(World* world) { return reinterpret_cast<pfSimWorld_t>(world); }

}  // namespace pipefill::sim
