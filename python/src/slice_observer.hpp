// The slice observer for Python (pfRuntimeSetSliceObserver): a Python callable the host
// backend's fill stream threads call when each fill slice starts and ends. pipefill._profiler
// uses it to put the slices into the user's torch.profiler trace.
#pragma once

#include "common.hpp"

namespace pfpy {

// One observer. The runtime calls observe on a fill stream's thread; it takes the GIL and calls
// fn(phase, job_name, bubble_id, fill_stream, first_item, max_items). The first exception stops
// further calls (the fill stream is never held up by a broken observer) and is kept for
// Runtime.slice_observer_error(). Kept alive by the Runtime object until it is closed, also
// after being replaced (calls already queued may still run).
struct PySliceObserver {
  nb::object fn;
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> calls{0};
  std::mutex mutex;
  std::string error;  // guarded by mutex

  static void observe(void* user, const pfSliceEvent_t* event);
};

}  // namespace pfpy
