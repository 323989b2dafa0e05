// The simulated world's handle registry (sim_handles.hpp). Leaked on purpose so that it
// outlives every static object that might still use a world.
#include "sim/sim_handles.hpp"

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "common/mutex.hpp"
#include "common/thread_annotations.hpp"
#include "sim/sim_world.hpp"

namespace pipefill::sim {
namespace {

struct WorldEntry {
  World* world = nullptr;
  int calls = 0;          // C calls holding a pin
  bool retiring = false;  // pfSimWorldDestroy is waiting for the calls to finish
};

struct Registry {
  Mutex mutex;
  CondVar unpinned;
  std::unordered_map<uintptr_t, WorldEntry> worlds GUARDED_BY(mutex);
  std::unordered_map<uintptr_t, uintptr_t> streams GUARDED_BY(mutex);  // stream -> world
  std::unordered_map<uintptr_t, uintptr_t> events GUARDED_BY(mutex);   // event -> world
};

Registry& registry() {
  static Registry* instance = new Registry;
  return *instance;
}

std::atomic<uint64_t> g_next_serial{1};
// Worlds this thread holds pins on (a destroy from inside such a call would wait for itself).
thread_local std::vector<uintptr_t> t_pinned;

uintptr_t key(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }

// Pins the world `world_handle` if it is live and not retiring. Registry lock held.
WorldPin pin_locked(Registry& reg, uintptr_t world_handle) REQUIRES(reg.mutex) {
  const auto it = reg.worlds.find(world_handle);
  if (it == reg.worlds.end() || it->second.retiring) return WorldPin();
  ++it->second.calls;
  t_pinned.push_back(world_handle);
  return WorldPin(it->second.world, world_handle);
}

}  // namespace

uintptr_t new_handle(uint64_t tag) {
  const uint64_t serial = g_next_serial.fetch_add(1) & ((uint64_t{1} << 48) - 1);
  return static_cast<uintptr_t>((tag << 48) | serial);
}

void register_world(uintptr_t handle, World* world) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  reg.worlds[handle] = WorldEntry{world, 0, false};
}

void register_stream(uintptr_t handle, uintptr_t world) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  reg.streams[handle] = world;
}

void register_event(uintptr_t handle, uintptr_t world) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  reg.events[handle] = world;
}

void unregister_stream(uintptr_t handle) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  reg.streams.erase(handle);
}

void unregister_event(uintptr_t handle) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  reg.events.erase(handle);
}

void unregister_world(uintptr_t handle) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  auto it = reg.worlds.find(handle);
  if (it != reg.worlds.end()) {
    // No new pins; wait for the calls in progress on other threads (a pin this thread holds
    // cannot be waited for).
    it->second.retiring = true;
    const int own = static_cast<int>(std::count(t_pinned.begin(), t_pinned.end(), handle));
    reg.unpinned.wait(reg.mutex, [&] {
      reg.mutex.assert_held();
      return reg.worlds.at(handle).calls <= own;
    });
    reg.worlds.erase(handle);
  }
  std::erase_if(reg.streams, [handle](const auto& entry) { return entry.second == handle; });
  std::erase_if(reg.events, [handle](const auto& entry) { return entry.second == handle; });
}

World* find_world(uintptr_t handle) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  const auto it = reg.worlds.find(handle);
  return it == reg.worlds.end() ? nullptr : it->second.world;
}

World* find_world_of_stream(const void* stream) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  const auto it = reg.streams.find(key(stream));
  if (it == reg.streams.end()) return nullptr;
  const auto world = reg.worlds.find(it->second);
  return world == reg.worlds.end() ? nullptr : world->second.world;
}

World* find_world_of_event(const void* event) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  const auto it = reg.events.find(key(event));
  if (it == reg.events.end()) return nullptr;
  const auto world = reg.worlds.find(it->second);
  return world == reg.worlds.end() ? nullptr : world->second.world;
}

void WorldPin::release() {
  if (world_ == nullptr) return;
  world_ = nullptr;
  Registry& reg = registry();
  {
    MutexLock lock(reg.mutex);
    const auto it = reg.worlds.find(handle_);
    if (it != reg.worlds.end()) --it->second.calls;
    const auto mine = std::find(t_pinned.rbegin(), t_pinned.rend(), handle_);
    if (mine != t_pinned.rend()) t_pinned.erase(std::next(mine).base());
  }
  reg.unpinned.notify_all();
}

WorldPin pin_world(pfSimWorld_t handle) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  return pin_locked(reg, key(handle));
}

WorldPin pin_world_of_stream(const void* stream) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  const auto it = reg.streams.find(key(stream));
  return it == reg.streams.end() ? WorldPin() : pin_locked(reg, it->second);
}

WorldPin pin_world_of_event(const void* event) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  const auto it = reg.events.find(key(event));
  return it == reg.events.end() ? WorldPin() : pin_locked(reg, it->second);
}

pfResult_t retire_world(pfSimWorld_t handle, World** out) {
  const uintptr_t world_handle = key(handle);
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  auto it = reg.worlds.find(world_handle);
  if (it == reg.worlds.end() || it->second.retiring) {
    return fail(pfErrorInvalidArgument, "world {} is not a live simulated world",
                static_cast<const void*>(handle));
  }
  World* world = it->second.world;
  auto busy = [&]() -> pfResult_t {
    return fail(pfErrorBusy,
                "world {} still has {} runtime(s)/device(s) attached; destroy them first",
                static_cast<const void*>(handle), world->attached_count());
  };
  if (world->attached_count() > 0) return busy();
  if (std::find(t_pinned.begin(), t_pinned.end(), world_handle) != t_pinned.end()) {
    return fail(pfErrorInvalidState,
                "world {} cannot be destroyed from inside a call that is using it (a pre-run "
                "hook or callback of a run of that world)", static_cast<const void*>(handle));
  }
  it->second.retiring = true;  // no new pins from here on
  reg.unpinned.wait(reg.mutex, [&] {
    reg.mutex.assert_held();
    return reg.worlds.at(world_handle).calls == 0;
  });
  // A device may have attached through a call that was still running (pfRuntimeCreate).
  if (world->attached_count() > 0) {
    reg.worlds.at(world_handle).retiring = false;
    return busy();
  }
  *out = world;
  return pfSuccess;
}

}  // namespace pipefill::sim
