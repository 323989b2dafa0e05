// The slice observer for Python (pfRuntimeSetSliceObserver): a Python callable the host
// backend's fill stream threads call when each fill slice starts and ends. pipefill._profiler
// uses it to put the slices into the user's torch.profiler trace.
//
// On the host backend the extension always installs its own native observer (SliceEvents): it
// counts the slices in progress - the fill window, the time the trainer's bubbles are running
// fill work - and forwards each call to the Python observer, if one is set. pipefill.torch's
// feeder and drainer threads wait for that window (Runtime.wait_fill_window, GIL released), so
// that the fill job's own Python work (the dataset, the sink) runs while the trainer waits in
// its bubble, not while it computes: on the host backend, a fill thread holding the GIL outside
// the bubbles made every Python-level op of the trainer wait for it (issue 32: trainer step
// 1.41x while filling).
#pragma once

#include <condition_variable>

#include "common.hpp"

namespace pfpy {

// One observer. The runtime calls observe on a fill stream's thread; it takes the GIL and calls
// fn(phase, job_name, bubble_id, fill_stream, first_item, max_items). The first exception stops
// further calls (the fill stream is never held up by a broken observer) and is kept for
// Runtime.slice_observer_error(). Kept alive by the Runtime object until it is closed, also
// after being replaced.
struct PySliceObserver {
  nb::object fn;
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> calls{0};
  std::mutex mutex;
  std::string error;  // guarded by mutex

  static void observe(void* user, const pfSliceEvent_t* event);
};

// The native observer of a host-backend runtime: the fill window, and the forward to the
// current Python observer (nullptr: none). Lives in the runtime's core, which outlives the
// pfRuntime_t (no call runs after pfRuntimeDestroy).
struct SliceEvents {
  std::atomic<PySliceObserver*> forward{nullptr};
  std::atomic<int> open_slices{0};  // slices started and not ended, on every fill stream
  std::atomic<uint64_t> windows{0};  // times the window opened (0 -> 1 slices in progress)
  std::mutex mutex;
  std::condition_variable opened;

  static void observe(void* user, const pfSliceEvent_t* event);
  bool is_open() const { return open_slices.load(std::memory_order_acquire) > 0; }
  // Blocks (the caller released the GIL) until a slice is in progress or timeout_s passed;
  // returns whether the window is open.
  bool wait_open(double timeout_s);
};

}  // namespace pfpy
