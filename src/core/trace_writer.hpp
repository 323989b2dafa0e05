// The trace writer: Chrome-trace JSON (Perfetto, chrome://tracing) of the harvested bubbles and
// fill slices, plus the calibration records of enable_cupti mode. Rendering is a pure function of
// the records, so the same simulated run always gives the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/activity.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::core {

struct TraceBubble {
  uint64_t id = 0;
  uint64_t iteration = 0;
  std::string class_key;
  int kind = pfBubbleOther;
  double begin_us = 0.0, end_us = 0.0, predicted_us = 0.0;
  size_t slices = 0;
};

struct TraceSlice {
  uint64_t bubble_id = 0;
  std::string job_name;
  double start_us = 0.0, end_us = 0.0;
  uint64_t items = 0;
  int config_index = 0;
  bool late = false;  // enqueued after its bubble had ended (ran no item: the gate was closed)
};

// What a runtime keeps for pfTraceWrite: the first kMaxRecords of each kind.
struct TraceRecords {
  static constexpr size_t kMaxRecords = size_t{1} << 20;
  // Chrome-trace thread ids of calibration records: this base plus the device's stream id.
  static constexpr uint64_t kCalibrationTidBase = 1000;

  std::vector<TraceBubble> bubbles;
  std::vector<TraceSlice> slices;
  std::vector<ActivityRecord> calibration;
  bool truncated = false;

  void add(TraceBubble bubble);
  void add(TraceSlice slice);
  void add(ActivityRecord record);
};

// The whole trace as Chrome-trace JSON; process id = `pid` (the pipeline stage).
std::string render_chrome_trace(const TraceRecords& records, int pid);

// Writes `text` to `path`; pfErrorIo naming the path and the reason.
pfResult_t write_text_file(const char* path, const std::string& text);

}  // namespace pipefill::core
