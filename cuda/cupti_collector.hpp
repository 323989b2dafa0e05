// Calibration-mode CUPTI collector (PIPEFILL_CUPTI=1 or RuntimeOptions::enable_cupti): the main
// job's kernel, memcpy, memset and memory timeline as pipefill::ActivityRecord. No CUPTI type in
// this interface; the conversion lives in cupti_convert.hpp.
//
// CUPTI allows one activity subscriber per process before CUDA 13.3 (PyTorch's profiler, Nsight
// Systems and compute-sanitizer are others): when it is taken, or CUPTI cannot start at all (no
// driver), start_cupti_collector fails with pfErrorCuptiFailure and callers carry on with event
// timings only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "analysis/activity.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda {

class ActivityCollector {
 public:
  virtual ~ActivityCollector() = default;
  // cuptiActivityFlushAll + hands over every record converted since the last call (appended to
  // *out). Call once per iteration, outside bubbles (flushing costs host time, not device time).
  virtual pfResult_t flush(std::vector<ActivityRecord>* out) = 0;
  // Marks a stream's kernels as fill work (ActivityKind::Fill). `stream` is a cudaStream_t.
  virtual pfResult_t register_fill_stream(void* stream) = 0;
  // Records CUPTI reported as dropped (buffers full) so far.
  virtual uint64_t dropped_records() const = 0;
};

// Enables CONCURRENT_KERNEL, MEMCPY, MEMSET and MEMORY2 activity with 4 MiB buffers. Call as early
// as possible (before the main job's first kernel: records only cover what runs after). At most
// one collector per process: a second is pfErrorBusy. `device_clock_us` is the clock the records
// are aligned to (the device's now_us).
pfResult_t start_cupti_collector(std::function<double()> device_clock_us,
                                 std::unique_ptr<ActivityCollector>* out);

}  // namespace pipefill::cuda
