// The rules that turn one Chrome-trace event into a TraceRecord, shared by both importers (the
// DOM importer in chrome_trace.cpp and the streaming one in analysis/io/), so that they agree
// on every event: an importer only reports the fields it saw (JsonField), the converter here
// decides what they mean and which values are errors.
//
// Recognised events ("ph":"X" unless noted), everything else is counted and skipped:
//   cat "kernel"                -> Kernel, Comm (comm-name pattern) or Fill (fill stream / name)
//   cat "gpu_memcpy" / "memcpy" -> Memcpy        cat "gpu_memset" / "memset" -> Memset
//   cat "gpu_user_annotation"   -> Marker on the device
//   cat "user_annotation" named "bubble <key>" (pipefill.Runtime's torch.profiler ranges)
//                               -> bubble Marker on device = pid (explicit-bubble mode)
//   cat "user_annotation", or any name starting with a marker prefix -> Marker on the host,
//                                  tagged with its pid (process)
//   cat "fill"                  -> Fill (PipeFill traces)   cat "bubble" -> Marker
//   cat "cuda_runtime" / "cuda_driver" with args.correlation -> no record; tells which process
//                                  launched the device records with that correlation id
//   "ph":"i"/"I" named "[memory]" with "Device Type" CUDA -> MemoryAlloc (Bytes >= 0) or
//   MemoryFree (Bytes < 0), with "Total Allocated" as the absolute level when present.
// Device: args.device, else pid; stream: args.stream, else tid (numbers, or the first integer in
// a string such as "stream 7"). Times are the trace's "ts"/"dur" in microseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "analysis/trace_data.hpp"
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
  // Kernels whose name contains one of these (case-insensitively) are communication.
  std::vector<std::string> comm_name_patterns = default_comm_name_patterns();
};

// Largest |ts| and dur accepted, in us: 2^52 us (about 142 years). Above it a double no longer
// resolves half a microsecond, so kernel durations would silently round away.
inline constexpr double kMaxTraceTimeUs = 4503599627370496.0;
// Largest byte count accepted (2^53, 8 PiB): exact in a double, and sums of many stay in int64.
inline constexpr double kMaxTraceBytes = 9007199254740992.0;

// One field as the importer found it.
struct JsonField {
  enum class Type : uint8_t { Missing, Null, Bool, Number, String, Array, Object, BadNumber };
  Type type = Type::Missing;
  double number = 0.0;    // Number
  std::string_view text;  // String: the unescaped contents; Number / BadNumber: the JSON token
  bool present() const { return type != Type::Missing; }
};
const char* json_type_name(JsonField::Type type);

// The fields of one event the rules read. Views must stay valid until convert() returns.
struct EventFields {
  JsonField ph, cat, name, pid, tid, ts, dur;
  bool args_object = false;  // "args" is present and an object (else its fields stay Missing)
  JsonField device, stream, correlation, bytes;        // args of device activity
  JsonField device_type, device_id, memory_bytes, total_allocated;  // args of "[memory]"
  int grid_blocks = 0;  // product of args.grid (see GridProduct), 0 unknown
};

// Product of the dimensions of args.grid, 0 when any is not a non-negative number; saturates.
class GridProduct {
 public:
  void add(const JsonField& dimension);
  int blocks() const;
 private:
  double product_ = 1.0;
  bool valid_ = true;
  int count_ = 0;
};

// What the rules need to see of an event before the importer reads its "args" (streaming
// importers skip the args of the other events unparsed).
enum class EventNeed { Nothing, Args };
EventNeed args_needed(const JsonField& ph, const JsonField& cat, const JsonField& name,
                      const ImportOptions& options);

// Turns events into the records of `out` (records, names, counts). Errors name the source, the
// event index and the offending value.
class EventConverter {
 public:
  EventConverter(const ImportOptions& options, CompactTrace* out);

  // Called once per entry of traceEvents, in order.
  pfResult_t convert(const EventFields& event, size_t index);
  // An entry that is not a JSON object.
  pfResult_t not_an_object(JsonField::Type type, size_t index);
  // After the last event: assigns launching processes to device records.
  void finish();

 private:
  pfResult_t complete_event(const EventFields& e, size_t index);
  pfResult_t memory_event(const EventFields& e, size_t index);
  pfResult_t time_of(const EventFields& e, size_t index, std::string_view what, double* ts);
  pfResult_t device_of(const EventFields& e, size_t index, std::string_view what, int* device);
  pfResult_t bytes_of(const JsonField& f, const char* key, size_t index, std::string_view what,
                      bool allow_negative, double* bytes);
  ActivityKind kernel_kind(std::string_view name, uint64_t stream) const;
  void skip() { ++out_->events_skipped; }

  const ImportOptions& options_;
  CompactTrace* out_;
  std::vector<std::pair<uint64_t, int64_t>> launches_;  // correlation -> launching pid
};

// Top-level metadata, shared too: "deviceProperties" entries and "distributedInfo".
void read_device_property(const JsonField& id, const JsonField& total_global_mem,
                          CompactTrace* out);
void read_distributed_rank(const JsonField& rank, CompactTrace* out);

// Integer id of a pid/tid/device/stream field: a number, or the first integer in a string.
bool id_of(const JsonField& f, int64_t* out);
// A finite number, or a string holding one (some exporters quote numbers).
bool number_of(const JsonField& f, double* out);

}  // namespace pipefill::analysis
