// Handles of the simulated world and the global registry behind them.
//
// World, stream and event handles are opaque 64-bit values (a tag and a serial number that is
// never reused), not pointers: a stale handle is refused even after the memory of its object
// was reused by a new one (pfSimStreamDestroy then pfSimStreamCreate used to hand out the same
// address, and the stale handle was accepted). The registry maps each live handle to its world.
//
// The C API pins the world it works on for the whole call (WorldPin), and pfSimWorldDestroy
// retires a world only once no call holds a pin, so a call racing the destroy never touches
// freed memory: it either runs wholly before the destroy or finds the handle gone.
#pragma once

#include <cstdint>

#include "pipefill/pipefill.h"

namespace pipefill::sim {

class World;

inline constexpr uint64_t kWorldTag = 0x5357;   // "SW"
inline constexpr uint64_t kStreamTag = 0x5353;  // "SS"
inline constexpr uint64_t kEventTag = 0x5345;   // "SE"
uintptr_t new_handle(uint64_t tag);

void register_world(uintptr_t handle, World* world);
void register_stream(uintptr_t handle, uintptr_t world);
void register_event(uintptr_t handle, uintptr_t world);
void unregister_stream(uintptr_t handle);
void unregister_event(uintptr_t handle);
// Removes the world and every stream/event handle still registered for it.
void unregister_world(uintptr_t handle);

// Unpinned lookups (C++ callers that own the world's lifetime).
World* find_world(uintptr_t handle);
World* find_world_of_stream(const void* stream);
World* find_world_of_event(const void* event);

// Keeps a world from being destroyed through the C API while a call uses it.
class WorldPin {
 public:
  WorldPin() = default;
  WorldPin(World* world, uintptr_t handle) : world_(world), handle_(handle) {}
  WorldPin(WorldPin&& other) noexcept : world_(other.world_), handle_(other.handle_) {
    other.world_ = nullptr;
  }
  WorldPin& operator=(WorldPin&& other) noexcept {
    if (this != &other) {
      release();
      world_ = other.world_;
      handle_ = other.handle_;
      other.world_ = nullptr;
    }
    return *this;
  }
  WorldPin(const WorldPin&) = delete;
  ~WorldPin() { release(); }
  World* get() const { return world_; }
  explicit operator bool() const { return world_ != nullptr; }

 private:
  void release();
  World* world_ = nullptr;
  uintptr_t handle_ = 0;
};

WorldPin pin_world(pfSimWorld_t handle);
WorldPin pin_world_of_stream(const void* stream);
WorldPin pin_world_of_event(const void* event);

// pfSimWorldDestroy's first half: refuses a world with devices attached (pfErrorBusy), waits
// until no call holds a pin on it, and hands it out for deletion (its destructor unregisters
// it). pfErrorInvalidState when this thread itself holds a pin on it.
pfResult_t retire_world(pfSimWorld_t handle, World** out);

}  // namespace pipefill::sim
