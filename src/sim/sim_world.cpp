// The simulated world's public face (sim_world.hpp): creation and destruction, pre-run hooks,
// the clock and activity log, streams, events and the run entry points. The engine behind it is
// described in sim_engine.hpp; stream operations are enqueued in sim_ops.cpp and sim_fill.cpp,
// words and memory live in sim_memory.cpp.
#include "sim/sim_world.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <utility>

#include "common/error.hpp"
#include "common/log.hpp"
#include "sim/sim_engine.hpp"
#include "sim/sim_handles.hpp"

namespace pipefill::sim {

// Refuses a World method called from inside one of this world's own on_item callbacks (the
// world lock is held there, so the call would deadlock).
#define PF_SIM_REFUSE_IN_OWN_CALLBACK(what) \
  if (callback_world() == impl_.get()) return refuse_in_callback(what)

SimStream* World::Impl::live_stream(const void* handle) const {
  auto it = streams.find(handle);
  if (it == streams.end() || it->second->destroyed) return nullptr;
  return it->second.get();
}

SimEvent* World::Impl::live_event(const void* handle) const {
  auto it = events.find(handle);
  return it == events.end() ? nullptr : it->second.get();
}

// ---- Lifecycle --------------------------------------------------------------------------------

World::World() = default;

World::~World() {
  if (!impl_) return;
  unregister_world(impl_->handle);  // every stream and event handle of the world goes with it
  MutexLock lock(impl_->mutex);
  for (const auto& [base, block] : impl_->words) {
    ::operator delete[](reinterpret_cast<uint64_t*>(base), std::align_val_t{kWordAlignment});
  }
  impl_->words.clear();
}

pfResult_t World::create(int device_count, const pfSimDeviceDesc_t* desc, uint64_t seed,
                         std::unique_ptr<World>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "world output pointer is NULL");
  if (device_count < 1 || device_count > kMaxDevices) {
    return fail(pfErrorInvalidArgument, "device_count {} is out of range [1, {}]", device_count,
                kMaxDevices);
  }
  const pfSimDeviceDesc_t defaults = PF_SIM_DEVICE_DESC_INITIALIZER;
  pfSimDeviceDesc_t d = defaults;
  if (desc != nullptr) {
    if (desc->size == 0) {
      // A version-1 description (its four fields, the rest zero-filled by the aggregate):
      // version 1's meaning, the old model exactly.
      d.sm_count = desc->sm_count;
      d.memory_bytes = desc->memory_bytes;
      d.jitter_fraction = desc->jitter_fraction;
      d.interference = desc->interference;
      d.fill_mem_intensity = 1.0;
      d.fill_slowdown = 0.0;
      d.comm_slowdown = 0.0;
      d.main_mem_intensity = 1.0;
    } else if (desc->size < sizeof(pfSimDeviceDesc_t)) {
      return fail(pfErrorInvalidArgument,
                  "device desc size {} is neither 0 (version 1) nor at least "
                  "sizeof(pfSimDeviceDesc_t) ({}); start from PF_SIM_DEVICE_DESC_INITIALIZER",
                  desc->size, sizeof(pfSimDeviceDesc_t));
    } else {
      d = *desc;  // a larger size comes from a newer header: the fields we know
    }
  }
  if (d.sm_count < 1 || d.sm_count > kMaxSmCount) {
    return fail(pfErrorInvalidArgument, "sm_count {} is out of range [1, {}]", d.sm_count,
                kMaxSmCount);
  }
  if (d.memory_bytes == 0) return fail(pfErrorInvalidArgument, "memory_bytes 0 must be > 0");
  if (!finite_nonnegative(d.jitter_fraction)) {
    return fail(pfErrorInvalidArgument, "jitter_fraction {} must be finite and >= 0",
                d.jitter_fraction);
  }
  const std::pair<const char*, double> coefficients[] = {
      {"interference", d.interference},
      {"fill_mem_intensity", d.fill_mem_intensity},
      {"fill_slowdown", d.fill_slowdown},
      {"comm_slowdown", d.comm_slowdown},
      {"main_mem_intensity", d.main_mem_intensity}};
  for (const auto& [name, value] : coefficients) {
    if (!finite_nonnegative(value)) {
      return fail(pfErrorInvalidArgument, "{} {} must be finite and >= 0", name, value);
    }
  }
  std::unique_ptr<World> world(new World());
  world->impl_ = std::make_unique<Impl>(seed);
  Impl& impl = *world->impl_;
  impl.handle = new_handle(kWorldTag);
  {
    MutexLock lock(impl.mutex);
    impl.devices.resize(static_cast<size_t>(device_count));
    for (int i = 0; i < device_count; ++i) {
      DeviceState& device = impl.devices[static_cast<size_t>(i)];
      device.sm_count = d.sm_count;
      device.memory_total = d.memory_bytes;
      device.jitter = d.jitter_fraction;
      device.interference.main_slowdown = d.interference;
      device.interference.fill_slowdown = d.fill_slowdown;
      device.interference.comm_slowdown = d.comm_slowdown;
      device.interference.fill_mem_intensity = d.fill_mem_intensity;
      device.interference.main_mem_intensity = d.main_mem_intensity;
      device.fill_sms = d.sm_count;
      device.free_sms = d.sm_count;
      // Simulated arena addresses: a distinct, never-mapped-by-us range per device.
      device.next_arena_address = (uintptr_t{0x5000} << 32) + (uintptr_t(i) << 40);
    }
  }
  register_world(impl.handle, world.get());
  log::debug("simulated world: {} device(s), {} SMs, {} bytes, jitter {}, interference: main "
             "{}, fill {}, comm {}, intensity fill {} main {}; seed {}",
             device_count, d.sm_count, d.memory_bytes, d.jitter_fraction, d.interference,
             d.fill_slowdown, d.comm_slowdown, d.fill_mem_intensity, d.main_mem_intensity, seed);
  *out = std::move(world);
  return pfSuccess;
}

void World::add_pre_run_hook(const void* owner, std::function<void()> hook) {
  MutexLock lock(impl_->hooks_mutex);
  impl_->hooks.emplace_back(owner, std::move(hook));
}

void World::remove_pre_run_hook(const void* owner) {
  MutexLock lock(impl_->hooks_mutex);
  std::erase_if(impl_->hooks, [owner](const auto& entry) { return entry.first == owner; });
}

// ---- Clock, devices, activity log -------------------------------------------------------------

double World::now() const {
  if (callback_world() == impl_.get()) return callback_time_us();  // the item's time
  MutexLock lock(impl_->mutex);
  return impl_->now;
}

int World::device_count() const { return static_cast<int>(impl_->device_count()); }

int World::sm_count(int device) const {
  return impl_->valid_device(device) ? impl_->sm_count_of(device) : 0;
}

std::vector<ActivityRecord> World::activities(int device) const {
  if (callback_world() == impl_.get()) return {};
  MutexLock lock(impl_->mutex);
  if (!impl_->valid_device(device)) return {};
  return impl_->devices[static_cast<size_t>(device)].activities;
}

size_t World::activities_since(int device, size_t from, std::vector<ActivityRecord>* out) const {
  if (callback_world() == impl_.get()) return from;
  MutexLock lock(impl_->mutex);
  if (!impl_->valid_device(device)) return 0;
  const auto& log = impl_->devices[static_cast<size_t>(device)].activities;
  if (from < log.size()) {
    out->insert(out->end(), log.begin() + static_cast<std::ptrdiff_t>(from), log.end());
  }
  return log.size();
}

void World::set_activity_recording(bool enabled) {
  if (callback_world() == impl_.get()) return;
  MutexLock lock(impl_->mutex);
  impl_->record_activities = enabled;
}

uint64_t World::events_processed() const {
  if (callback_world() == impl_.get()) return 0;
  MutexLock lock(impl_->mutex);
  return impl_->events_processed;
}

// ---- Streams ----------------------------------------------------------------------------------

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
  PF_SIM_REFUSE_IN_OWN_CALLBACK("create_stream");
  auto stream = std::make_unique<SimStream>();
  stream->device = device;
  stream->priority = priority;
  stream->fill = fill;
  const uintptr_t handle = new_handle(kStreamTag);
  stream->handle = reinterpret_cast<const void*>(handle);
  {
    MutexLock lock(impl_->mutex);
    stream->id = impl_->next_stream_id++;
    DeviceState& state = impl_->devices[static_cast<size_t>(device)];
    const uint64_t index = fill ? state.fill_streams_created++ : state.main_streams_created++;
    stream->jitter_key = (static_cast<uint64_t>(device) << 40) ^ (fill ? (1ull << 39) : 0) ^
                         (index + 1);
    impl_->streams.emplace(stream->handle, std::move(stream));
  }
  register_stream(handle, impl_->handle);
  *out = reinterpret_cast<void*>(handle);
  return pfSuccess;
}

pfResult_t World::destroy_stream(void* handle) {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("destroy_stream");
  {
    MutexLock lock(impl_->mutex);
    SimStream* stream = impl_->live_stream(handle);
    if (stream == nullptr) {
      return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world",
                  handle);
    }
    stream->destroyed = true;
    // A drained stream goes now; one with work left goes when it drains (advance()).
    if (stream->ops.empty()) impl_->streams.erase(handle);
  }
  unregister_stream(reinterpret_cast<uintptr_t>(handle));
  return pfSuccess;
}

bool World::is_main_stream_of(const void* handle, int device) const {
  if (callback_world() == impl_.get()) return false;
  MutexLock lock(impl_->mutex);
  const SimStream* stream = impl_->live_stream(handle);
  return stream != nullptr && !stream->fill && stream->device == device;
}

bool World::is_live_stream(const void* handle) const {
  if (callback_world() == impl_.get()) return false;
  MutexLock lock(impl_->mutex);
  return impl_->live_stream(handle) != nullptr;
}

uint64_t World::stream_id(const void* handle) const {
  if (callback_world() == impl_.get()) return 0;
  MutexLock lock(impl_->mutex);
  const SimStream* stream = impl_->live_stream(handle);
  return stream ? stream->id : 0;
}

// ---- Events -----------------------------------------------------------------------------------

pfResult_t World::create_event(void** out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "event output pointer is NULL");
  PF_SIM_REFUSE_IN_OWN_CALLBACK("create_event");
  auto event = std::make_unique<SimEvent>();
  const uintptr_t handle = new_handle(kEventTag);
  {
    MutexLock lock(impl_->mutex);
    event->id = impl_->next_event_id++;
    impl_->events.emplace(reinterpret_cast<const void*>(handle), std::move(event));
  }
  register_event(handle, impl_->handle);
  *out = reinterpret_cast<void*>(handle);
  return pfSuccess;
}

pfResult_t World::destroy_event(void* handle) {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("destroy_event");
  {
    MutexLock lock(impl_->mutex);
    auto it = impl_->events.find(handle);
    if (it == impl_->events.end()) {
      return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                  handle);
    }
    // Records already captured by ops stay alive through their own references.
    impl_->release(it->second->latest);
    impl_->events.erase(it);
  }
  unregister_event(reinterpret_cast<uintptr_t>(handle));
  return pfSuccess;
}

bool World::is_live_event(const void* handle) const {
  if (callback_world() == impl_.get()) return false;
  MutexLock lock(impl_->mutex);
  return impl_->live_event(handle) != nullptr;
}

namespace {

// Runs read(record) on the event's latest record (nullptr: never recorded), under the world's
// lock; an event that is not live is refused.
template <class Read>
pfResult_t read_latest_record(World::Impl& impl, void* handle, Read&& read) {
  MutexLock lock(impl.mutex);
  const SimEvent* event = impl.live_event(handle);
  if (event == nullptr) {
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                handle);
  }
  read(event->latest);
  return pfSuccess;
}

}  // namespace

pfResult_t World::event_state(void* handle, bool* recorded, bool* done, double* time_us) const {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("event_state");
  return read_latest_record(*impl_, handle, [&](const Record* record) {
    if (recorded) *recorded = record != nullptr;
    if (done) *done = record != nullptr && record->completed;
    if (time_us) *time_us = (record != nullptr && record->completed) ? record->time_us : -1.0;
  });
}

pfResult_t World::event_item_failures(void* handle, uint64_t* count, uint64_t* not_run,
                                      std::string* first) const {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("event_item_failures");
  return read_latest_record(*impl_, handle, [&](const Record* record) {
    *count = record != nullptr ? record->item_failures : 0;
    *not_run = record != nullptr ? record->items_not_run : 0;
    if (first != nullptr && record != nullptr) *first = record->first_item_failure;
  });
}

// ---- Running ----------------------------------------------------------------------------------

pfResult_t World::run_until(double time_us) {
  if (std::isnan(time_us)) return fail(pfErrorInvalidArgument, "run_until time_us {} is NaN", time_us);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("run_until");
  impl_->driver.store(std::this_thread::get_id(), std::memory_order_relaxed);
  impl_->run_hooks();
  MutexLock lock(impl_->mutex);
  impl_->drop_stale_front();
  while (!impl_->heap.empty() && impl_->heap.front().time_us <= time_us) {
    impl_->process_one();
    impl_->drop_stale_front();
  }
  impl_->bury_drained_streams();
  if (!impl_->heap.empty()) {
    // Not idle: the clock stands at the requested time (it never goes backwards).
    if (std::isfinite(time_us)) impl_->now = std::max(impl_->now, time_us);
    return pfSuccess;
  }
  return impl_->check_blocked();
}

pfResult_t World::run_until_idle() {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("run_until_idle");
  impl_->driver.store(std::this_thread::get_id(), std::memory_order_relaxed);
  impl_->run_hooks();
  MutexLock lock(impl_->mutex);
  while (!impl_->heap.empty()) impl_->process_one();
  impl_->bury_drained_streams();
  return impl_->check_blocked();
}

bool World::is_driven_by_calling_thread() const {
  return impl_->driver.load(std::memory_order_relaxed) == std::this_thread::get_id();
}

pfResult_t World::synchronize_stream(void* handle) {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("synchronize_stream");
  MutexLock lock(impl_->mutex);
  SimStream* stream = impl_->live_stream(handle);
  if (stream == nullptr) {
    return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world",
                handle);
  }
  return impl_->run_while_not([stream] { return stream->ops.empty(); });
}

pfResult_t World::synchronize_event(void* handle) {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("synchronize_event");
  MutexLock lock(impl_->mutex);
  SimEvent* event = impl_->live_event(handle);
  if (event == nullptr) {
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world",
                handle);
  }
  Record* record = event->latest;
  if (record == nullptr) return pfSuccess;  // never recorded: nothing to wait for (CUDA)
  // Hold a reference: the loop must not depend on the event keeping `record` alive.
  Impl::retain(record);
  const pfResult_t result = impl_->run_while_not([record] { return record->completed; });
  impl_->release(record);
  return result;
}

#undef PF_SIM_REFUSE_IN_OWN_CALLBACK

// ---- Attachment, lookups ----------------------------------------------------------------------

void World::attach() { impl_->attached.fetch_add(1); }
void World::detach() { impl_->attached.fetch_sub(1); }
int World::attached_count() const { return impl_->attached.load(); }

World* World::world_of_stream(const void* stream) { return find_world_of_stream(stream); }
World* World::world_of_event(const void* event) { return find_world_of_event(event); }

World* world_from_handle(pfSimWorld_t handle) {
  return find_world(reinterpret_cast<uintptr_t>(handle));
}

pfSimWorld_t World::handle() const { return reinterpret_cast<pfSimWorld_t>(impl_->handle); }

pfSimWorld_t handle_of(World* world) { return world == nullptr ? nullptr : world->handle(); }

}  // namespace pipefill::sim
