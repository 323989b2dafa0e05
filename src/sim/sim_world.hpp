// The simulated world: one or more simulated GPUs sharing a virtual clock (µs), driven by a
// deterministic discrete-event loop. See docs/simulated-device.md for the execution model and
// src/sim/sim_engine.hpp for how the engine is split into files.
//
// Handles: streams (`void*`), events (`void*`, the same value as a pfSimEvent_t) and worlds are
// opaque values that are never reused (sim_handles.hpp), checked against the world's registry
// before they are used, so a stale, foreign or garbage value gives pfErrorInvalidArgument, never
// a crash. The C API (sim_capi.cpp) finds the world of a bare stream/event handle with
// world_of_stream()/world_of_event() and pins it for the call.
//
// Threading: one mutex per world. Enqueueing and queries may come from any thread. Running
// (run_until*, synchronize_*) holds the lock for the whole run, so work enqueued by another
// thread lands either wholly before or wholly after a run: results stay deterministic as long as
// every producer has finished enqueuing before the run (that is what pre-run hooks are for).
// on_item callbacks run with the lock held: a World method called from inside one of its own
// callbacks refuses (pfErrorInvalidState) instead of deadlocking; now() returns the item's time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/activity.hpp"
#include "device/device.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::sim {

// Stream priorities follow CUDA: 0 is the lowest, kHighestPriority the highest.
inline constexpr int kLowestPriority = 0;
inline constexpr int kHighestPriority = -5;

class World {
 public:
  // desc may be null (PF_SIM_DEVICE_DESC_INITIALIZER); it applies to every device.
  static pfResult_t create(int device_count, const pfSimDeviceDesc_t* desc, uint64_t seed,
                           std::unique_ptr<World>* out);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // ---- Pre-run hooks ----------------------------------------------------------------------
  // Called (registration order, world lock NOT held) at the start of every run_until /
  // run_until_idle. A hook must not run the world nor add/remove hooks.
  void add_pre_run_hook(const void* owner, std::function<void()> hook);
  void remove_pre_run_hook(const void* owner);  // removes every hook of `owner`

  // ---- Clock, devices, activity log -------------------------------------------------------
  double now() const;
  int device_count() const;
  int sm_count(int device) const;  // device must be valid
  // The device's activity log in completion order (deterministic). Empty for a bad index.
  std::vector<ActivityRecord> activities(int device) const;
  // Appends the device's records from index `from` on to *out; returns the log's size (the
  // next `from`). Lets a calibration collector take each iteration's records once.
  size_t activities_since(int device, size_t from, std::vector<ActivityRecord>* out) const;
  // Recording is on by default; turn it off for very long runs to save memory.
  void set_activity_recording(bool enabled);
  // Events the loop has processed so far (a measure of the simulator's work, for tests).
  uint64_t events_processed() const;

  // ---- Streams ----------------------------------------------------------------------------
  // priority in [kHighestPriority, kLowestPriority]. fill = a fill stream (not a main stream).
  pfResult_t create_stream(int device, int priority, bool fill, void** out);
  // Work already enqueued still runs; the handle becomes invalid at once.
  pfResult_t destroy_stream(void* stream);
  // Whether `stream` is a live stream of this world on `device` that is not a fill stream.
  // Safe for any pointer value (never dereferences an unknown pointer).
  bool is_main_stream_of(const void* stream, int device) const;
  bool is_live_stream(const void* stream) const;
  // The stream's id (used in activity records); 0 for an unknown stream.
  uint64_t stream_id(const void* stream) const;

  // ---- Stream operations (executed in virtual time, in stream order) ----------------------
  // min(sm_count, SMs of the device) blocks of duration_us (one wave when SMs are free).
  pfResult_t launch_kernel(void* stream, double duration_us, int sm_count);
  // `blocks` blocks of block_us, one SM each, in waves when blocks > SMs.
  pfResult_t launch_kernel_blocks(void* stream, int blocks, double block_us);
  pfResult_t delay(void* stream, double duration_us);
  pfResult_t record_event(void* event, void* stream);
  // Waits for the record that was the event's latest when this call was made (+ latency),
  // holding sm_count SMs from when the wait reaches the stream head (0: none).
  // With sm_count > 0 the latency is the comm kernel's transfer (wait_event_transfer(s, e, 0,
  // latency, n)); with 0 a plain delay (wait_event_transfer(s, e, latency, 0, 0)).
  pfResult_t wait_event(void* stream, void* event, double latency_us, int sm_count);
  // Completes at record time + latency_us + transfer_us x (1 + comm_slowdown x fill load when
  // the transfer starts), or at once when the wait starts later than that.
  pfResult_t wait_event_transfer(void* stream, void* event, double latency_us,
                                 double transfer_us, int sm_count);
  pfResult_t write_word(void* stream, uint64_t* word, uint64_t value);
  // The same as an atomic max: the word becomes max(word, value) (an early gate close that
  // arrives late cannot move the gate back; pfBubbleCloseFill).
  pfResult_t write_word_max(void* stream, uint64_t* word, uint64_t value);
  pfResult_t copy_word(void* stream, const uint64_t* source, uint64_t* destination);
  pfResult_t launch_ticket(void* stream, const pfSliceDesc_t* slice, int blocks,
                           double item_cost_us, pfSimItemFn on_item, void* user);
  pfResult_t launch_opaque(void* stream, uint64_t first_item, uint64_t items, int blocks,
                           double item_cost_us, pfSimItemFn on_item, void* user);
  // The same with the job's memory behaviour (fill may be null: the defaults).
  pfResult_t launch_ticket(void* stream, const pfSliceDesc_t* slice, int blocks,
                           double item_cost_us, const pfSimFillDesc_t* fill, pfSimItemFn on_item,
                           void* user);
  pfResult_t launch_opaque(void* stream, uint64_t first_item, uint64_t items, int blocks,
                           double item_cost_us, const pfSimFillDesc_t* fill, pfSimItemFn on_item,
                           void* user);

  // ---- Events -----------------------------------------------------------------------------
  pfResult_t create_event(void** out);
  pfResult_t destroy_event(void* event);
  bool is_live_event(const void* event) const;
  // recorded: the event has a record; done: that record completed at *time_us.
  pfResult_t event_state(void* event, bool* recorded, bool* done, double* time_us) const;
  // The item failures recorded on the event's latest record (Record::item_failures): items
  // whose on_item threw in the fill launches enqueued after it on its stream.
  pfResult_t event_item_failures(void* event, uint64_t* count, uint64_t* not_run,
                                 std::string* first) const;

  // ---- Running ----------------------------------------------------------------------------
  // Both call the pre-run hooks first. pfErrorInvalidState when the world went idle with work
  // still blocked (a deadlock: e.g. SMs held by a wait whose record can never run).
  pfResult_t run_until(double time_us);
  pfResult_t run_until_idle();
  // Whether the calling thread is the one that last ran the world (run_until*), or created it
  // when it never ran: virtual time cannot advance while that thread blocks.
  bool is_driven_by_calling_thread() const;
  // Run the event loop (no hooks) until the stream has drained / the event's latest record has
  // completed. pfErrorInvalidState if that can never happen.
  pfResult_t synchronize_stream(void* stream);
  pfResult_t synchronize_event(void* event);

  // ---- Device words (plain host memory owned by the world) --------------------------------
  pfResult_t allocate_words(size_t count, uint64_t** words);
  // Queued ops that use the words (a word write or copy, a ticket launch's gate/cursor/budget)
  // keep them allocated until they ran; the words are refused for new ops at once.
  pfResult_t free_words(uint64_t* words);

  // ---- Memory -----------------------------------------------------------------------------
  // Memory the main job uses on `device` (free = total - used - arenas, floored at 0).
  pfResult_t set_memory_used(int device, size_t bytes);
  pfResult_t memory_info(int device, size_t* free_bytes, size_t* total_bytes) const;
  // Arenas are simulated address ranges: unique, aligned, and never to be dereferenced.
  pfResult_t allocate_arena(int device, size_t bytes, void** base);
  pfResult_t free_arena(int device, void* base);

  // ---- SM partition -----------------------------------------------------------------------
  // Keeps `reserved_sms` (0 <= reserved < sm_count) free of fill work on `device`.
  pfResult_t configure_partition(int device, int reserved_sms, FillPartition* partition);
  int fill_sms(int device) const;

  // ---- Attachment (devices/runtimes using the world) --------------------------------------
  void attach();
  void detach();
  int attached_count() const;

  // The virtual time of the item being reported, for use inside a pfSimItemFn callback (which
  // must not call into the world); NaN outside a callback.
  static double callback_time_us();

  // The world's C handle (never reused by another world).
  pfSimWorld_t handle() const;

  // Finds the world owning a live stream / event handle (nullptr when unknown). Global lookup.
  static World* world_of_stream(const void* stream);
  static World* world_of_event(const void* event);

  struct Impl;

 private:
  World();
  pfResult_t enqueue_write(void* stream, uint64_t* word, uint64_t value, bool write_max);
  std::unique_ptr<Impl> impl_;
};

// The C handle of a world and back. world_from_handle returns nullptr for a handle that is not
// a live world (safe for any value); it does not pin the world (see sim_handles.hpp).
World* world_from_handle(pfSimWorld_t handle);
pfSimWorld_t handle_of(World* world);

}  // namespace pipefill::sim
