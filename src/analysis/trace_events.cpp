#include "analysis/trace_events.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "analysis/activity.hpp"
#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

// c10::DeviceType::CUDA in PyTorch's "[memory]" events; CPU is 0.
constexpr int64_t kTorchDeviceTypeCuda = 1;

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// The Trace Event format allows a comma-separated list of categories ("kernel,graph");
// `wanted` is lower case.
bool has_category(std::string_view categories, std::string_view wanted) {
  size_t begin = 0;
  while (begin <= categories.size()) {
    size_t end = categories.find(',', begin);
    if (end == std::string_view::npos) end = categories.size();
    std::string_view item = categories.substr(begin, end - begin);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (equals_ignoring_case(item, wanted)) return true;
    begin = end + 1;
  }
  return false;
}

bool starts_with_any(std::string_view name, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) {
    return !p.empty() && name.substr(0, p.size()) == p;
  });
}

enum class EventClass { Skip, Kernel, Memcpy, Memset, DeviceMarker, HostMarker, Fill, Launch };

std::string_view text_of(const JsonField& f) {
  return f.type == JsonField::Type::String ? f.text : std::string_view();
}

EventClass classify_complete(const JsonField& cat_field, std::string_view name,
                             const ImportOptions& options) {
  const std::string_view cat = text_of(cat_field);
  if (!cat.empty()) {
    if (has_category(cat, "kernel")) return EventClass::Kernel;
    if (has_category(cat, "gpu_memcpy") || has_category(cat, "memcpy")) return EventClass::Memcpy;
    if (has_category(cat, "gpu_memset") || has_category(cat, "memset")) return EventClass::Memset;
    if (has_category(cat, "gpu_user_annotation")) return EventClass::DeviceMarker;
    if (has_category(cat, "fill")) return EventClass::Fill;
    if (has_category(cat, "bubble")) return EventClass::DeviceMarker;
    if (has_category(cat, "user_annotation")) {
      // pipefill.Runtime's torch.profiler ranges ("bubble <class key>", python/pipefill/
      // _profiler.py): bubble markers of the process (pid as the device), like PipeFill's own
      // trace, so a CPU-only torch trace has its bubbles too.
      if (name.starts_with(kBubbleMarkerPrefix)) return EventClass::DeviceMarker;
      // Its fill slices (host backend, "fill slice <job>" on a fill stream thread): fill activity
      // of the same process, so they are measured against those bubbles.
      if (name.starts_with(kFillSpanPrefix)) return EventClass::Fill;
      return EventClass::HostMarker;
    }
  }
  if (starts_with_any(name, options.marker_prefixes)) return EventClass::HostMarker;
  if (!cat.empty() && (has_category(cat, "cuda_runtime") || has_category(cat, "cuda_driver"))) {
    return EventClass::Launch;
  }
  return EventClass::Skip;
}

bool is_memory_event(const JsonField& ph, const JsonField& name) {
  const std::string_view p = text_of(ph);
  return (p == "i" || p == "I") && text_of(name) == "[memory]";
}

// A value for a message: the JSON token of a number, a string quoted and cut short.
std::string shown(const JsonField& f) {
  switch (f.type) {
    case JsonField::Type::Number:
    case JsonField::Type::BadNumber:
      return f.text.empty() ? fmt::format("{}", f.number) : std::string(f.text.substr(0, 64));
    case JsonField::Type::String:
      return fmt::format("\"{}\"{}", f.text.substr(0, 64), f.text.size() > 64 ? "..." : "");
    default:
      return json_type_name(f.type);
  }
}

// "traceEvents[3] ('gemm')", the prefix of messages about an event.
std::string event_label(const std::string& source, size_t index, std::string_view what) {
  return what.empty() ? fmt::format("{}: traceEvents[{}]", source, index)
                      : fmt::format("{}: traceEvents[{}] ({})", source, index, what);
}

std::string quoted_name(std::string_view name) {
  return fmt::format("'{}{}'", name.substr(0, 200), name.size() > 200 ? "..." : "");
}

}  // namespace

const char* json_type_name(JsonField::Type type) {
  switch (type) {
    case JsonField::Type::Missing: return "missing";
    case JsonField::Type::Null: return "null";
    case JsonField::Type::Bool: return "boolean";
    case JsonField::Type::Number: return "number";
    case JsonField::Type::String: return "string";
    case JsonField::Type::Array: return "array";
    case JsonField::Type::Object: return "object";
    case JsonField::Type::BadNumber: return "number";
  }
  return "unknown";
}

bool number_of(const JsonField& f, double* out) {
  if (f.type == JsonField::Type::Number) {
    if (!std::isfinite(f.number)) return false;
    *out = f.number;
    return true;
  }
  if (f.type == JsonField::Type::String) {
    // strtod needs a terminated string; numbers longer than this are not numbers we accept.
    char buffer[64];
    if (f.text.empty() || f.text.size() >= sizeof(buffer)) return false;
    std::memcpy(buffer, f.text.data(), f.text.size());
    buffer[f.text.size()] = '\0';
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(buffer, &end);
    if (end != buffer && *end == '\0' && errno == 0 && std::isfinite(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

bool id_of(const JsonField& f, int64_t* out) {
  if (f.type == JsonField::Type::Number) {
    const double d = f.number;
    if (!std::isfinite(d)) return false;
    // Saturate: a double outside int64's range is undefined behaviour to convert.
    *out = d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : static_cast<int64_t>(d);
    return true;
  }
  if (f.type == JsonField::Type::String) {
    const std::string_view s = f.text;
    const auto digit = std::find_if(s.begin(), s.end(),
                                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (digit == s.end()) return false;
    int64_t v = 0;
    for (auto it = digit; it != s.end() && std::isdigit(static_cast<unsigned char>(*it)); ++it) {
      if (v > (INT64_MAX - 9) / 10) break;  // absurdly long digit runs: keep the prefix
      v = v * 10 + (*it - '0');
    }
    *out = v;
    return true;
  }
  return false;
}

void GridProduct::add(const JsonField& dimension) {
  ++count_;
  double d = 0.0;
  if (!number_of(dimension, &d) || d < 0.0) {
    valid_ = false;
    return;
  }
  product_ = std::min(product_ * d, 1e300);
}

int GridProduct::blocks() const {
  if (!valid_ || count_ == 0) return 0;
  return product_ > static_cast<double>(INT32_MAX) ? INT32_MAX : static_cast<int>(product_);
}

EventNeed args_needed(const JsonField& ph, const JsonField& cat, const JsonField& name,
                      const ImportOptions& options) {
  if (text_of(ph) == "X") {
    return classify_complete(cat, text_of(name), options) == EventClass::Skip ? EventNeed::Nothing
                                                                              : EventNeed::Args;
  }
  return is_memory_event(ph, name) ? EventNeed::Args : EventNeed::Nothing;
}

EventConverter::EventConverter(const ImportOptions& options, CompactTrace* out)
    : options_(options), out_(out) {}

pfResult_t EventConverter::not_an_object(JsonField::Type type, size_t index) {
  ++out_->events_total;
  return fail(pfErrorInvalidArgument, "{}: traceEvents[{}] has JSON type {}, expected an object",
              out_->source, index, json_type_name(type));
}

pfResult_t EventConverter::convert(const EventFields& e, size_t index) {
  ++out_->events_total;
  if (text_of(e.ph) == "X") return complete_event(e, index);
  if (is_memory_event(e.ph, e.name)) return memory_event(e, index);
  skip();  // metadata, flows, counters, CPU instants
  return pfSuccess;
}

pfResult_t EventConverter::time_of(const EventFields& e, size_t index, std::string_view what,
                                   double* ts) {
  const JsonField& f = e.ts;
  const std::string label = event_label(out_->source, index, what);
  if (!f.present()) return fail(pfErrorInvalidArgument, "{}: \"ts\" is missing", label);
  if (f.type == JsonField::Type::BadNumber) {
    return fail(pfErrorInvalidArgument, "{}: \"ts\" {} is outside the range of a double", label,
                shown(f));
  }
  if (!number_of(f, ts)) {
    return fail(pfErrorInvalidArgument, "{}: \"ts\" {} is not a finite number", label, shown(f));
  }
  if (std::fabs(*ts) >= kMaxTraceTimeUs) {
    return fail(pfErrorInvalidArgument,
                "{}: \"ts\" {} us is beyond 2^52 us (about 142 years), where a double no longer "
                "resolves half a microsecond; is the trace in nanoseconds?",
                label, shown(f));
  }
  return pfSuccess;
}

pfResult_t EventConverter::device_of(const EventFields& e, size_t index, std::string_view what,
                                     int* device) {
  int64_t id = 0;
  const JsonField* from = nullptr;
  if (id_of(e.device, &id)) {
    from = &e.device;
  } else if (id_of(e.pid, &id)) {
    from = &e.pid;
  }
  if (from == nullptr) {
    *device = 0;
    return pfSuccess;
  }
  if (id < 0 || id > INT32_MAX) {
    return fail(pfErrorInvalidArgument, "{}: device id {} (from {}) is outside [0, {}]",
                event_label(out_->source, index, what), shown(*from),
                from == &e.device ? "args.device" : "pid", INT32_MAX);
  }
  *device = static_cast<int>(id);
  return pfSuccess;
}

pfResult_t EventConverter::bytes_of(const JsonField& f, const char* key, size_t index,
                                    std::string_view what, bool allow_negative, double* bytes) {
  if (f.type == JsonField::Type::BadNumber ||
      (f.type == JsonField::Type::Number &&
       !(std::fabs(f.number) <= kMaxTraceBytes && (allow_negative || f.number >= 0.0)))) {
    return fail(pfErrorInvalidArgument, "{}: \"{}\" {} is outside [{}, 2^53]",
                event_label(out_->source, index, what), key, shown(f),
                allow_negative ? "-2^53" : "0");
  }
  if (!number_of(f, bytes)) return pfSuccess;  // loosely typed: unknown
  if (!(std::fabs(*bytes) <= kMaxTraceBytes && (allow_negative || *bytes >= 0.0))) {
    return fail(pfErrorInvalidArgument, "{}: \"{}\" {} is outside [{}, 2^53]",
                event_label(out_->source, index, what), key, shown(f),
                allow_negative ? "-2^53" : "0");
  }
  return pfSuccess;
}

ActivityKind EventConverter::kernel_kind(std::string_view name, uint64_t stream) const {
  if (std::find(options_.fill_streams.begin(), options_.fill_streams.end(), stream) !=
      options_.fill_streams.end()) {
    return ActivityKind::Fill;
  }
  for (const std::string& s : options_.fill_name_substrings) {
    if (!s.empty() && name.find(s) != std::string_view::npos) return ActivityKind::Fill;
  }
  return is_communication_kernel_name(name, options_.comm_name_patterns) ? ActivityKind::Comm
                                                                         : ActivityKind::Kernel;
}

pfResult_t EventConverter::complete_event(const EventFields& e, size_t index) {
  if (e.name.present() && e.name.type != JsonField::Type::String) {
    return fail(pfErrorInvalidArgument,
                "{}: traceEvents[{}]: \"name\" has JSON type {}, expected a string", out_->source,
                index, json_type_name(e.name.type));
  }
  const std::string_view name = text_of(e.name);
  const EventClass cls = classify_complete(e.cat, name, options_);
  if (cls == EventClass::Skip) {
    skip();
    return pfSuccess;
  }
  if (cls == EventClass::Launch) {
    int64_t correlation = 0, pid = 0;
    if (id_of(e.correlation, &correlation) && correlation > 0 && id_of(e.pid, &pid)) {
      launches_.emplace_back(static_cast<uint64_t>(correlation), pid);
    }
    skip();
    return pfSuccess;
  }
  const std::string what = quoted_name(name);
  double ts = 0.0;
  PF_TRY(time_of(e, index, what, &ts));
  double dur = 0.0;
  const std::string label = event_label(out_->source, index, what);
  if (!e.dur.present()) return fail(pfErrorInvalidArgument, "{}: \"dur\" is missing", label);
  if (e.dur.type == JsonField::Type::BadNumber) {
    return fail(pfErrorInvalidArgument, "{}: \"dur\" {} is outside the range of a double", label,
                shown(e.dur));
  }
  if (!number_of(e.dur, &dur)) {
    return fail(pfErrorInvalidArgument, "{}: \"dur\" {} is not a finite number", label,
                shown(e.dur));
  }
  if (dur < 0.0) return fail(pfErrorInvalidArgument, "{}: \"dur\" {} is negative", label, shown(e.dur));
  if (dur >= kMaxTraceTimeUs) {
    return fail(pfErrorInvalidArgument, "{}: \"dur\" {} us is beyond 2^52 us (about 142 years)",
                label, shown(e.dur));
  }

  TraceRecord r;
  r.event_index = index;
  r.name = out_->names.intern(name);
  r.start_us = ts;
  r.end_us = ts + dur;
  int64_t id = 0;
  if (cls == EventClass::HostMarker) {
    r.device = kHostDevice;
    if (id_of(e.pid, &id)) r.process = id;
  } else {
    PF_TRY(device_of(e, index, what, &r.device));
  }
  if (id_of(e.stream, &id) || id_of(e.tid, &id)) r.stream = static_cast<uint64_t>(std::max<int64_t>(0, id));
  if (id_of(e.correlation, &id)) r.correlation = static_cast<uint64_t>(std::max<int64_t>(0, id));
  switch (cls) {
    case EventClass::Kernel:
      r.kind = kernel_kind(name, r.stream);
      r.grid_blocks = e.grid_blocks;
      break;
    case EventClass::Fill:
      r.kind = ActivityKind::Fill;
      r.grid_blocks = e.grid_blocks;
      break;
    case EventClass::Memcpy:
    case EventClass::Memset: {
      r.kind = cls == EventClass::Memcpy ? ActivityKind::Memcpy : ActivityKind::Memset;
      double bytes = 0.0;
      PF_TRY(bytes_of(e.bytes, "bytes", index, what, false, &bytes));
      r.bytes = static_cast<uint64_t>(bytes);
      break;
    }
    case EventClass::DeviceMarker:
    case EventClass::HostMarker:
      r.kind = ActivityKind::Marker;
      break;
    case EventClass::Skip:
    case EventClass::Launch:
      break;
  }
  out_->records.push_back(r);
  return pfSuccess;
}

pfResult_t EventConverter::memory_event(const EventFields& e, size_t index) {
  int64_t device_type = 0, device_id = 0;
  const bool has_type = id_of(e.device_type, &device_type);
  const bool has_id = id_of(e.device_id, &device_id);
  // Host allocations (Device Type 0, Device Id -1) are not device memory.
  const bool on_gpu = has_type ? device_type == kTorchDeviceTypeCuda : has_id && device_id >= 0;
  if (!on_gpu) {
    skip();
    return pfSuccess;
  }
  double ts = 0.0;
  PF_TRY(time_of(e, index, "[memory]", &ts));
  double delta = 0.0, total = 0.0;
  const bool has_delta = number_of(e.memory_bytes, &delta);
  const bool has_total = number_of(e.total_allocated, &total);
  PF_TRY(bytes_of(e.memory_bytes, "Bytes", index, "[memory]", true, &delta));
  // A negative total means "unknown" to some exporters: ignored, like a missing one.
  if (has_total && total >= 0.0) {
    PF_TRY(bytes_of(e.total_allocated, "Total Allocated", index, "[memory]", false, &total));
  } else if (e.total_allocated.type == JsonField::Type::BadNumber) {
    PF_TRY(bytes_of(e.total_allocated, "Total Allocated", index, "[memory]", false, &total));
  }
  if (!has_delta && !has_total && e.memory_bytes.type != JsonField::Type::BadNumber) {
    skip();  // nothing to learn from it
    return pfSuccess;
  }
  if (has_id && (device_id < 0 || device_id > INT32_MAX)) {
    return fail(pfErrorInvalidArgument, "{}: \"Device Id\" {} is outside [0, {}]",
                event_label(out_->source, index, "[memory]"), shown(e.device_id), INT32_MAX);
  }
  TraceRecord r;
  r.event_index = index;
  r.name = out_->names.intern("[memory]");
  r.device = has_id ? static_cast<int>(device_id) : 0;
  r.start_us = r.end_us = ts;
  r.kind = delta < 0.0 ? ActivityKind::MemoryFree : ActivityKind::MemoryAlloc;
  r.bytes = static_cast<uint64_t>(std::fabs(delta));
  if (has_total && total >= 0.0) r.in_use_bytes = static_cast<int64_t>(total);
  int64_t stream = 0;
  if (id_of(e.tid, &stream)) r.stream = static_cast<uint64_t>(std::max<int64_t>(0, stream));
  out_->records.push_back(r);
  return pfSuccess;
}

void EventConverter::finish() {
  if (launches_.empty()) return;
  std::sort(launches_.begin(), launches_.end());
  for (TraceRecord& r : out_->records) {
    if (r.device == kHostDevice || r.correlation == 0) continue;
    auto it = std::lower_bound(launches_.begin(), launches_.end(),
                               std::pair<uint64_t, int64_t>(r.correlation, INT64_MIN));
    if (it == launches_.end() || it->first != r.correlation) continue;
    const auto next = it + 1;
    // The same id from two processes (traces of several ranks merged): unknown.
    if (next != launches_.end() && next->first == r.correlation && next->second != it->second) {
      continue;
    }
    r.process = it->second;
  }
  launches_.clear();
  launches_.shrink_to_fit();
}

void read_device_property(const JsonField& id, const JsonField& total_global_mem,
                          CompactTrace* out) {
  int64_t device = 0;
  double memory = 0.0;
  // Informative only: a malformed or absurd entry is ignored, never an error.
  if (id_of(id, &device) && device >= 0 && device <= INT32_MAX &&
      number_of(total_global_mem, &memory) && memory > 0.0 && memory <= kMaxTraceBytes) {
    out->device_memory_bytes[static_cast<int>(device)] = static_cast<uint64_t>(memory);
  }
}

void read_distributed_rank(const JsonField& rank, CompactTrace* out) {
  int64_t r = 0;
  if (id_of(rank, &r) && r >= 0 && r <= INT32_MAX) out->rank = static_cast<int>(r);
}

}  // namespace pipefill::analysis
