// Streaming Chrome-trace importer (PyTorch profiler / Kineto / PipeFill traces): reads a trace
// from a file, stdin or memory, gzip-compressed or not, in fixed-size chunks, and keeps only
// compact records, so memory stays a fraction of the JSON size however large the trace is.
//
// How: a small string- and bracket-aware scanner walks the top-level object, finds the
// "traceEvents" array and cuts it into its elements; each element (one event, a few hundred
// bytes) is parsed in place by simdjson's On-Demand API and handed to the event rules shared
// with the DOM importer (analysis/trace_events.hpp), which keep what the analyser needs
// (interned names, times, ids, sizes). Top-level "deviceProperties" and "distributedInfo" are
// read the same way; every other top-level value is skipped without being kept.
//
// Checks: the structure (strings, brackets, commas, what follows the trace) everywhere; every
// field the rules read fully (a number out of a double's range is an error naming the event and
// the value); values the analyser does not read only for balanced strings and brackets (so a
// malformed CPU-op argument does not stop the analysis of a 4 GB trace).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/io/byte_source.hpp"
#include "analysis/trace_data.hpp"
#include "analysis/trace_events.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::analysis::io {

struct ReadOptions {
  size_t chunk_bytes = size_t{1} << 20;        // bytes read at a time (tests use tiny chunks)
  // Bounds on the work one trace may cause (pipefill-analyze --max-value-mib, --max-events):
  // a larger input is refused with a message naming the bound and its flag.
  size_t max_value_bytes = size_t{256} << 20;  // one event or metadata value larger: an error
  size_t max_events = 50'000'000;              // traceEvents entries (~3 GiB of records)
};

// Reads a whole trace from `source`. Errors name `name` and the event index, the value or the
// byte offset (in the uncompressed stream).
pfResult_t read_trace(ByteSource& source, const std::string& name, const ImportOptions& options,
                      CompactTrace* out, const ReadOptions& read = {});
// A path, or "-" for stdin.
pfResult_t read_trace_file(const std::string& path, const ImportOptions& options,
                           CompactTrace* out, const ReadOptions& read = {});
// Bytes in memory (plain JSON or gzip).
pfResult_t read_trace_bytes(std::string_view bytes, const std::string& name,
                            const ImportOptions& options, CompactTrace* out,
                            const ReadOptions& read = {});

// The trace files of a folder of rank traces: regular files named *.json or *.json.gz, sorted
// by name. pfErrorIo when the folder cannot be read, pfErrorInvalidArgument when it holds none.
pfResult_t list_trace_folder(const std::string& folder, std::vector<std::string>* files);
bool is_directory(const std::string& path);

}  // namespace pipefill::analysis::io
