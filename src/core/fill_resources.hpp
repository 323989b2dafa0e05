// Every device object a runtime's fill work uses, made once at pfRuntimeCreate and never inside a
// bubble: the fill partition and stream, the bubble and slice event pools, the device words (the
// gate, and per job slot a cursor and a budget counter), the host read-back words and the fill
// arena. After creation the handles are read-only, so every thread may use them without a lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "device/device.hpp"

namespace pipefill::core {

// Fixed pool sizes (docs/architecture.md, "Objects of a runtime"). The event pools default to
// RuntimeOptions::bubble_event_slots (512) and slice_slots (1024).
inline constexpr size_t kMaxJobs = 256;            // live jobs (device word slots)
inline constexpr size_t kQueueCapacity = 4096;     // bubble messages in flight

struct FillResources {
  FillPartition partition;
  double launch_overhead_us = 0.0;   // planner's fixed cost of starting one slice
  Stream fill_stream = nullptr;
  std::vector<Event> bubble_begin_events, bubble_end_events;
  std::vector<Event> slice_start_events, slice_end_events;
  uint64_t* words = nullptr;         // [0] gate, then 2 per job slot (cursor, budget counter)
  uint64_t* host_words = nullptr;    // one per slice slot (cursor read-back)
  void* arena_base = nullptr;
  size_t arena_bytes = 0;
  std::string shared_partition_key;  // non-empty: this runtime holds a shared partition

  Event begin_event(uint64_t bubble_id) const {
    return bubble_begin_events[bubble_id % bubble_begin_events.size()];
  }
  Event end_event(uint64_t bubble_id) const {
    return bubble_end_events[bubble_id % bubble_end_events.size()];
  }
  uint64_t* gate() const { return words; }
  uint64_t* cursor_word(int slot) const { return &words[1 + 2 * slot]; }
  uint64_t* budget_word(int slot) const { return &words[2 + 2 * slot]; }
};

// Creates everything on `device`. Writes the values it resolved back into *options
// (reserved_sms, arena_bytes). On failure the caller releases what was made.
pfResult_t create_fill_resources(Device& device, RuntimeOptions* options, FillResources* out);
// Drains the fill stream, then frees everything; safe on a partly created set and twice.
// Failures are logged, never returned: nothing else can be done about them at teardown.
void release_fill_resources(Device& device, FillResources* resources);

// The arena made when arena_bytes is left unset (0): CUDA min(2 GiB, free / 8) - room for fill
// jobs without crowding the main job, which keeps growing (NCCL buffers, allocator caches); the
// other devices min(1 GiB, free).
size_t default_arena_bytes(pfBackend_t backend, size_t free_bytes, size_t total_bytes);

}  // namespace pipefill::core
