// Chrome-trace importer: turns a PyTorch profiler / Kineto JSON trace (or PipeFill's own
// pfTraceWrite output) into device-agnostic ActivityRecords for the analyser.
//
// Recognised events ("ph":"X" unless noted), everything else is counted and skipped:
//   cat "kernel"                -> Kernel, Comm (NCCL name) or Fill (fill stream / fill name)
//   cat "gpu_memcpy" / "memcpy" -> Memcpy        cat "gpu_memset" / "memset" -> Memset
//   cat "gpu_user_annotation"   -> Marker on the device
//   cat "user_annotation", or any name starting with a marker prefix -> Marker on the host
//   cat "fill"                  -> Fill (PipeFill traces)   cat "bubble" -> Marker
//   "ph":"i"/"I" named "[memory]" with "Device Type" CUDA -> MemoryAlloc (Bytes >= 0) or
//   MemoryFree (Bytes < 0), with "Total Allocated" as the absolute level when present.
// Device: args.device, else pid; stream: args.stream, else tid (numbers, or the first integer in
// a string such as "stream 7"). Times are the trace's "ts"/"dur" in microseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/activity.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::analysis {

struct ImportOptions {
  // Kernels on these stream ids (any device) are fill work, not the main job's.
  std::vector<uint64_t> fill_streams;
  // Kernels whose name contains one of these (case-sensitive) are fill work.
  std::vector<std::string> fill_name_substrings = {"pipefill"};
  // Events of any category whose name starts with one of these are imported as markers
  // (iteration detection): PyTorch's ProfilerStep#N is a "user_annotation" in recent versions
  // and a "cpu_op" in older ones.
  std::vector<std::string> marker_prefixes = {"ProfilerStep"};
};

struct ImportedTrace {
  std::string source;                  // file name (or the name given for a string)
  std::vector<ActivityRecord> records; // in trace order
  size_t events_total = 0;             // entries of traceEvents
  size_t events_skipped = 0;           // not device activity (CPU ops, runtime calls, metadata)
  // Device memory by device id from PyTorch's "deviceProperties" ("id", "totalGlobalMem").
  std::map<int, uint64_t> device_memory_bytes;

  // Devices with at least one non-host record, ascending.
  std::vector<int> devices() const;
};

// Parses `json_text`. On malformed input returns pfErrorInvalidArgument with a message naming
// `source_name` and the offending event index (or the JSON parse position).
pfResult_t import_chrome_trace(std::string_view json_text, const std::string& source_name,
                               const ImportOptions& options, ImportedTrace* out);

// Reads and parses a file; pfErrorIo when it cannot be read.
pfResult_t import_chrome_trace_file(const std::string& path, const ImportOptions& options,
                                    ImportedTrace* out);

}  // namespace pipefill::analysis
