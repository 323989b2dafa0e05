#include "analysis/chrome_trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "common/log.hpp"

namespace pipefill::analysis {
namespace {

using json = nlohmann::json;

// c10::DeviceType::CUDA in PyTorch's "[memory]" events; CPU is 0.
constexpr int kTorchDeviceTypeCuda = 1;

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool starts_with_any(const std::string& name, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) {
    return !p.empty() && name.compare(0, p.size(), p) == 0;
  });
}

// Casts that saturate instead of overflowing (a double outside the target's range is undefined
// behaviour to convert): traces are input, and input can hold anything.
int64_t saturate_i64(double d) {
  if (!(d > -9.2e18)) return d != d ? 0 : INT64_MIN;  // NaN -> 0
  if (d >= 9.2e18) return INT64_MAX;
  return static_cast<int64_t>(d);
}
uint64_t saturate_u64(double d) {
  if (!(d > 0.0)) return 0;
  if (d >= 1.8e19) return UINT64_MAX;
  return static_cast<uint64_t>(d);
}
int saturate_int(int64_t v) {
  return static_cast<int>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX));
}

// A finite number, or a string holding one (some exporters quote numbers).
std::optional<double> number_of(const json& value) {
  if (value.is_number()) {
    const double d = value.get<double>();
    if (std::isfinite(d)) return d;
    return std::nullopt;
  }
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(s.c_str(), &end);
    if (end != s.c_str() && *end == '\0' && errno == 0 && std::isfinite(d)) return d;
  }
  return std::nullopt;
}

std::optional<double> field_number(const json& object, const char* key) {
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  return number_of(*it);
}

// pid/tid/device/stream: a number, or the first integer inside a string ("stream 7").
std::optional<int64_t> id_of(const json& value) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number()) {
    const double d = value.get<double>();
    if (std::isfinite(d)) return saturate_i64(d);
    return std::nullopt;
  }
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    const auto digit = std::find_if(s.begin(), s.end(),
                                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (digit == s.end()) return std::nullopt;
    int64_t v = 0;
    for (auto it = digit; it != s.end() && std::isdigit(static_cast<unsigned char>(*it)); ++it) {
      if (v > (INT64_MAX - 9) / 10) break;  // absurdly long digit runs: keep the prefix
      v = v * 10 + (*it - '0');
    }
    return v;
  }
  return std::nullopt;
}

std::optional<int64_t> field_id(const json& object, const char* key) {
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  return id_of(*it);
}

enum class EventClass { Skip, Kernel, Memcpy, Memset, DeviceMarker, HostMarker, Fill };

// The Trace Event format allows a comma-separated list of categories ("kernel,graph").
bool has_category(const std::string& categories, std::string_view wanted) {
  size_t begin = 0;
  while (begin <= categories.size()) {
    size_t end = categories.find(',', begin);
    if (end == std::string::npos) end = categories.size();
    std::string_view item(categories.data() + begin, end - begin);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item == wanted) return true;
    begin = end + 1;
  }
  return false;
}

EventClass classify_complete_event(const std::string& category, const std::string& name,
                                   const ImportOptions& options) {
  const std::string cat = lowercase(category);
  if (has_category(cat, "kernel")) return EventClass::Kernel;
  if (has_category(cat, "gpu_memcpy") || has_category(cat, "memcpy")) return EventClass::Memcpy;
  if (has_category(cat, "gpu_memset") || has_category(cat, "memset")) return EventClass::Memset;
  if (has_category(cat, "gpu_user_annotation")) return EventClass::DeviceMarker;
  if (has_category(cat, "fill")) return EventClass::Fill;
  if (has_category(cat, "bubble")) return EventClass::DeviceMarker;
  if (has_category(cat, "user_annotation")) return EventClass::HostMarker;
  if (starts_with_any(name, options.marker_prefixes)) return EventClass::HostMarker;
  return EventClass::Skip;
}

class Importer {
 public:
  Importer(const std::string& source, const ImportOptions& options, ImportedTrace* out)
      : source_(source), options_(options), out_(out),
        fill_streams_(options.fill_streams.begin(), options.fill_streams.end()) {}

  pfResult_t run(const json& root) {
    const json* events = nullptr;
    if (root.is_array()) {
      events = &root;  // the bare "JSON array format" of the Trace Event spec
    } else if (root.is_object()) {
      const auto it = root.find("traceEvents");
      if (it == root.end()) {
        return fail(pfErrorInvalidArgument, "{}: no \"traceEvents\" array in the trace object",
                    source_);
      }
      if (!it->is_array()) {
        return fail(pfErrorInvalidArgument, "{}: \"traceEvents\" has JSON type {}, expected an array",
                    source_, it->type_name());
      }
      events = &*it;
      read_device_properties(root);
    } else {
      return fail(pfErrorInvalidArgument,
                  "{}: the trace has JSON type {}, expected an object with \"traceEvents\" or an array",
                  source_, root.type_name());
    }
    out_->events_total = events->size();
    out_->records.reserve(events->size() / 2);
    for (size_t index = 0; index < events->size(); ++index) {
      PF_TRY(import_event((*events)[index], index));
    }
    return pfSuccess;
  }

 private:
  pfResult_t import_event(const json& event, size_t index) {
    if (!event.is_object()) {
      return fail(pfErrorInvalidArgument, "{}: traceEvents[{}] has JSON type {}, expected an object",
                  source_, index, event.type_name());
    }
    const std::string phase = string_field(event, "ph");
    if (phase == "X") return import_complete(event, index);
    if ((phase == "i" || phase == "I") && string_field(event, "name") == "[memory]") {
      return import_memory(event, index);
    }
    ++out_->events_skipped;  // metadata, flows, counters, CPU instants
    return pfSuccess;
  }

  pfResult_t import_complete(const json& event, size_t index) {
    const auto name_it = event.find("name");
    if (name_it != event.end() && !name_it->is_string()) {
      return fail(pfErrorInvalidArgument, "{}: traceEvents[{}]: \"name\" has JSON type {}, expected a string",
                  source_, index, name_it->type_name());
    }
    std::string name = name_it != event.end() ? name_it->get<std::string>() : std::string();
    const EventClass cls = classify_complete_event(string_field(event, "cat"), name, options_);
    if (cls == EventClass::Skip) {
      ++out_->events_skipped;
      return pfSuccess;
    }
    const auto ts = field_number(event, "ts");
    if (!ts) {
      return fail(pfErrorInvalidArgument,
                  "{}: traceEvents[{}] ('{}'): \"ts\" is missing or not a finite number", source_,
                  index, name);
    }
    const auto dur = field_number(event, "dur");
    if (!dur || *dur < 0.0) {
      return fail(pfErrorInvalidArgument,
                  "{}: traceEvents[{}] ('{}'): \"dur\" is missing, negative or not a number",
                  source_, index, name);
    }
    const json& args = event.contains("args") ? event["args"] : empty_object();

    ActivityRecord r;
    r.name = std::move(name);
    r.start_us = *ts;
    r.end_us = *ts + *dur;
    const auto device = field_id(args, "device") ? field_id(args, "device") : field_id(event, "pid");
    const auto stream = field_id(args, "stream") ? field_id(args, "stream") : field_id(event, "tid");
    r.device = saturate_int(device.value_or(0));
    r.stream = static_cast<uint64_t>(std::max<int64_t>(0, stream.value_or(0)));
    r.correlation = static_cast<uint64_t>(std::max<int64_t>(0, field_id(args, "correlation").value_or(0)));
    switch (cls) {
      case EventClass::Kernel:
        r.kind = kernel_kind(r);
        r.grid_blocks = grid_blocks(args);
        break;
      case EventClass::Fill:
        r.kind = ActivityKind::Fill;
        r.grid_blocks = grid_blocks(args);
        break;
      case EventClass::Memcpy:
      case EventClass::Memset:
        r.kind = cls == EventClass::Memcpy ? ActivityKind::Memcpy : ActivityKind::Memset;
        r.bytes = saturate_u64(field_number(args, "bytes").value_or(0.0));
        break;
      case EventClass::DeviceMarker:
        r.kind = ActivityKind::Marker;
        break;
      case EventClass::HostMarker:
        r.kind = ActivityKind::Marker;
        r.device = kHostDevice;
        break;
      case EventClass::Skip:
        break;
    }
    out_->records.push_back(std::move(r));
    return pfSuccess;
  }

  pfResult_t import_memory(const json& event, size_t index) {
    const json& args = event.contains("args") ? event["args"] : empty_object();
    const auto device_type = field_id(args, "Device Type");
    const auto device_id = field_id(args, "Device Id");
    // Host allocations (Device Type 0, Device Id -1) are not device memory.
    const bool on_gpu = device_type ? *device_type == kTorchDeviceTypeCuda
                                    : device_id.has_value() && *device_id >= 0;
    if (!on_gpu) {
      ++out_->events_skipped;
      return pfSuccess;
    }
    const auto ts = field_number(event, "ts");
    if (!ts) {
      return fail(pfErrorInvalidArgument,
                  "{}: traceEvents[{}] ([memory]): \"ts\" is missing or not a finite number",
                  source_, index);
    }
    const auto bytes = field_number(args, "Bytes");
    const auto total = field_number(args, "Total Allocated");
    if (!bytes && !total) {
      ++out_->events_skipped;  // nothing to learn from it
      return pfSuccess;
    }
    ActivityRecord r;
    r.name = "[memory]";
    r.device = saturate_int(device_id.value_or(0));
    r.start_us = r.end_us = *ts;
    const double delta = bytes.value_or(0.0);
    r.kind = delta < 0.0 ? ActivityKind::MemoryFree : ActivityKind::MemoryAlloc;
    r.bytes = saturate_u64(std::fabs(delta));
    if (total && *total >= 0.0) r.in_use_bytes = saturate_i64(*total);
    out_->records.push_back(std::move(r));
    return pfSuccess;
  }

  // Optional and informative only: a malformed entry is ignored, never an error.
  void read_device_properties(const json& root) {
    const auto it = root.find("deviceProperties");
    if (it == root.end() || !it->is_array()) return;
    for (const json& d : *it) {
      const auto id = field_id(d, "id");
      const auto memory = field_number(d, "totalGlobalMem");
      if (id && memory && *memory > 0.0) {
        out_->device_memory_bytes[saturate_int(*id)] = saturate_u64(*memory);
      }
    }
  }

  ActivityKind kernel_kind(const ActivityRecord& r) const {
    if (fill_streams_.count(r.stream) != 0) return ActivityKind::Fill;
    for (const std::string& s : options_.fill_name_substrings) {
      if (!s.empty() && r.name.find(s) != std::string::npos) return ActivityKind::Fill;
    }
    return is_communication_kernel_name(r.name) ? ActivityKind::Comm : ActivityKind::Kernel;
  }

  static int grid_blocks(const json& args) {
    if (!args.is_object()) return 0;
    const auto it = args.find("grid");
    if (it == args.end() || !it->is_array() || it->empty()) return 0;
    double blocks = 1.0;
    for (const json& dim : *it) {
      const auto d = number_of(dim);
      if (!d || *d < 0.0) return 0;
      blocks *= *d;
    }
    return blocks > static_cast<double>(INT32_MAX) ? INT32_MAX : static_cast<int>(blocks);
  }

  static std::string string_field(const json& object, const char* key) {
    const auto it = object.find(key);
    if (it == object.end() || !it->is_string()) return {};
    return it->get<std::string>();
  }

  static const json& empty_object() {
    static const json kEmpty = json::object();
    return kEmpty;
  }

  const std::string& source_;
  const ImportOptions& options_;
  ImportedTrace* out_;
  std::set<uint64_t> fill_streams_;
};

}  // namespace

std::vector<int> ImportedTrace::devices() const {
  std::set<int> devices;
  for (const ActivityRecord& r : records) {
    if (r.device != kHostDevice) devices.insert(r.device);
  }
  return {devices.begin(), devices.end()};
}

pfResult_t import_chrome_trace(std::string_view json_text, const std::string& source_name,
                               const ImportOptions& options, ImportedTrace* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "import_chrome_trace: out is null");
  *out = ImportedTrace{};
  out->source = source_name;
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::parse_error& e) {
    return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: {}", source_name, e.byte,
                e.what());
  }
  try {
    const pfResult_t result = Importer(source_name, options, out).run(root);
    if (result != pfSuccess) return result;
  } catch (const std::exception& e) {  // nlohmann type errors we did not anticipate
    return fail(pfErrorInvalidArgument, "{}: unexpected trace content: {}", source_name, e.what());
  }
  log::debug("{}: imported {} records from {} events ({} skipped)", source_name,
             out->records.size(), out->events_total, out->events_skipped);
  return pfSuccess;
}

pfResult_t import_chrome_trace_file(const std::string& path, const ImportOptions& options,
                                    ImportedTrace* out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return fail(pfErrorIo, "cannot open trace '{}': {}", path, std::strerror(errno));
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return fail(pfErrorIo, "cannot read trace '{}'", path);
  return import_chrome_trace(text.view(), path, options, out);
}

}  // namespace pipefill::analysis
