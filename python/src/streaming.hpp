// Streaming item jobs for Python: a graph fill job (pfJobCreateGraph) whose items call a Python
// callable on the simulated and host backends, plus the streaming bound (pfJobSetAvailable /
// pfJobEndInput). pipefill.torch (_streaming.py) builds inference_job / training_job on them.
#pragma once

#include "common.hpp"

namespace pfpy {

// The host side of an item job. The runtime calls on_item on the device's thread that runs the
// item (host backend: a fill worker thread; simulated backend: the thread running the world, at
// the item's virtual completion); it takes the GIL and calls fn(item). The first exception ends
// the job's work: later items do nothing, and the error is kept for the Python side, which
// cancels the job (on_item must not call into PipeFill).
struct PyItemRecord {
  std::string name;
  alignas(8) uint64_t index_word = ~uint64_t{0};
  nb::object fn;  // None once released (close): breaks the cycle job -> fn -> job
  std::atomic<bool> failed{false};
  std::atomic<bool> stopped{false};  // the job is being destroyed: items no longer call fn
  std::atomic<uint64_t> items_run{0};
  std::mutex mutex;
  std::string error;  // guarded by mutex

  static void on_item(void* user, uint64_t item);
};

}  // namespace pfpy
