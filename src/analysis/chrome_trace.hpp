// DOM Chrome-trace importer: parses a whole PyTorch profiler / Kineto JSON trace (or PipeFill's
// own pfTraceWrite output) with nlohmann-json and turns it into ActivityRecords. It needs the
// whole text in memory (and a DOM of several times its size), so it suits PipeFill's own
// traces and tests; pipefill-analyze reads files with the streaming importer in
// analysis/io/ (gzip, stdin, a fraction of the memory). Both apply the same event rules
// (analysis/trace_events.hpp), so they produce the same records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/activity.hpp"
#include "analysis/trace_data.hpp"
#include "analysis/trace_events.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::analysis {

struct ImportedTrace {
  std::string source;                  // file name (or the name given for a string)
  std::vector<ActivityRecord> records; // in trace order
  size_t events_total = 0;             // entries of traceEvents
  size_t events_skipped = 0;           // not device activity (CPU ops, runtime calls, metadata)
  // Device memory by device id from PyTorch's "deviceProperties" ("id", "totalGlobalMem").
  std::map<int, uint64_t> device_memory_bytes;
  int rank = -1;  // "distributedInfo": {"rank": N}

  // Devices with at least one non-host record, ascending.
  std::vector<int> devices() const;
};

// Parses `json_text`. On malformed input returns pfErrorInvalidArgument with a message naming
// `source_name` and the offending event index and value (or the JSON parse position).
pfResult_t import_chrome_trace(std::string_view json_text, const std::string& source_name,
                               const ImportOptions& options, ImportedTrace* out);
// The same into compact records.
pfResult_t import_chrome_trace(std::string_view json_text, const std::string& source_name,
                               const ImportOptions& options, CompactTrace* out);

// Reads and parses a file; pfErrorIo when it cannot be read.
pfResult_t import_chrome_trace_file(const std::string& path, const ImportOptions& options,
                                    ImportedTrace* out);

}  // namespace pipefill::analysis
