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
#include <memory>

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
// current Python observer (nullptr: none). Owned by the runtime's core, which outlives the
// pfRuntime_t (no observer call runs after pfRuntimeDestroy), and by each bubble-end marker
// still queued on a main stream.
//
// The window is open while a fill slice is in progress and its bubble has not ended: the
// bubble's end on the trainer's stream (a host function queued behind pfBubbleEnd, or behind
// pfBubbleCloseFill) closes it, although the item in flight at the gate may run on. That item
// is fill work past the bubble; the feeder's and drainer's Python beside it would compete
// with the trainer's compute for the GIL and the cores (issue 32: with the window closed at
// the slice's end instead, the feeder ran ~0.5 ms of its dataset per 8.5 ms trainer step
// after the bubble, the last item waiting for the GIL among them).
struct SliceEvents {
  std::atomic<PySliceObserver*> forward{nullptr};
  std::atomic<int> open_slices{0};  // slices started and not ended, on every fill stream
  std::atomic<uint64_t> starts{0};  // slices started, ever
  std::atomic<uint64_t> closed_at{0};  // `starts` when the latest bubble end ran on its stream
  std::atomic<uint64_t> windows{0};  // times the window opened
  std::mutex mutex;
  std::condition_variable opened;

  static void observe(void* user, const pfSliceEvent_t* event);
  // Host function queued on the trainer's stream behind a bubble's end; `user` is a
  // heap-allocated std::shared_ptr<SliceEvents>, deleted here.
  static void bubble_ended(void* user);
  bool is_open() const {
    return open_slices.load(std::memory_order_acquire) > 0 &&
           starts.load(std::memory_order_acquire) > closed_at.load(std::memory_order_acquire);
  }
  // Blocks (the caller released the GIL) until a window is open or has opened since the call,
  // or timeout_s passed; returns whether one is open or opened (false: the timeout).
  bool wait_open(double timeout_s);
};

}  // namespace pfpy
