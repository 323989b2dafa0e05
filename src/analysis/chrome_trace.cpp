#include "analysis/chrome_trace.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "common/log.hpp"

namespace pipefill::analysis {
namespace {

using json = nlohmann::json;

JsonField::Type type_of(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return JsonField::Type::Null;
    case json::value_t::boolean: return JsonField::Type::Bool;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return JsonField::Type::Number;
    case json::value_t::string: return JsonField::Type::String;
    case json::value_t::array: return JsonField::Type::Array;
    case json::value_t::object: return JsonField::Type::Object;
    default: return JsonField::Type::Null;  // binary / discarded: never produced by parse()
  }
}

JsonField field_of(const json& value) {
  JsonField f;
  f.type = type_of(value);
  if (f.type == JsonField::Type::Number) {
    f.number = value.get<double>();
  } else if (f.type == JsonField::Type::String) {
    f.text = value.get_ref<const std::string&>();
  }
  return f;
}

JsonField member(const json& object, const char* key) {
  if (!object.is_object()) return {};
  const auto it = object.find(key);
  return it == object.end() ? JsonField{} : field_of(*it);
}

class Importer {
 public:
  Importer(const ImportOptions& options, CompactTrace* out) : converter_(options, out), out_(out) {}

  pfResult_t run(const json& root) {
    const json* events = nullptr;
    if (root.is_array()) {
      events = &root;  // the bare "JSON array format" of the Trace Event spec
    } else if (root.is_object()) {
      const auto it = root.find("traceEvents");
      if (it == root.end()) {
        return fail(pfErrorInvalidArgument, "{}: no \"traceEvents\" array in the trace object",
                    out_->source);
      }
      if (!it->is_array()) {
        return fail(pfErrorInvalidArgument, "{}: \"traceEvents\" has JSON type {}, expected an array",
                    out_->source, it->type_name());
      }
      events = &*it;
      read_metadata(root);
    } else {
      return fail(pfErrorInvalidArgument,
                  "{}: the trace has JSON type {}, expected an object with \"traceEvents\" or an array",
                  out_->source, root.type_name());
    }
    out_->records.reserve(events->size() / 2);
    for (size_t index = 0; index < events->size(); ++index) {
      const json& event = (*events)[index];
      if (!event.is_object()) return converter_.not_an_object(type_of(event), index);
      EventFields e;
      e.ph = member(event, "ph");
      e.cat = member(event, "cat");
      e.name = member(event, "name");
      e.pid = member(event, "pid");
      e.tid = member(event, "tid");
      e.ts = member(event, "ts");
      e.dur = member(event, "dur");
      const auto args = event.find("args");
      if (args != event.end() && args->is_object()) {
        e.args_object = true;
        e.device = member(*args, "device");
        e.stream = member(*args, "stream");
        e.correlation = member(*args, "correlation");
        e.bytes = member(*args, "bytes");
        e.device_type = member(*args, "Device Type");
        e.device_id = member(*args, "Device Id");
        e.memory_bytes = member(*args, "Bytes");
        e.total_allocated = member(*args, "Total Allocated");
        const auto grid = args->find("grid");
        if (grid != args->end() && grid->is_array()) {
          GridProduct product;
          for (const json& dim : *grid) product.add(field_of(dim));
          e.grid_blocks = product.blocks();
        }
      }
      PF_TRY(converter_.convert(e, index));
    }
    converter_.finish();
    return pfSuccess;
  }

 private:
  void read_metadata(const json& root) {
    const auto properties = root.find("deviceProperties");
    if (properties != root.end() && properties->is_array()) {
      for (const json& d : *properties) {
        read_device_property(member(d, "id"), member(d, "totalGlobalMem"), out_);
      }
    }
    const auto distributed = root.find("distributedInfo");
    if (distributed != root.end()) read_distributed_rank(member(*distributed, "rank"), out_);
  }

  EventConverter converter_;
  CompactTrace* out_;
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
                               const ImportOptions& options, CompactTrace* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "import_chrome_trace: out is null");
  *out = CompactTrace{};
  out->source = source_name;
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::parse_error& e) {
    return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: {}", source_name, e.byte,
                e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range.406: a number beyond a double
    return fail(pfErrorInvalidArgument, "{}: not a trace nlohmann-json can hold: {}", source_name,
                e.what());
  }
  try {
    PF_TRY(Importer(options, out).run(root));
  } catch (const std::exception& e) {  // nlohmann type errors we did not anticipate
    return fail(pfErrorInvalidArgument, "{}: unexpected trace content: {}", source_name, e.what());
  }
  log::debug("{}: imported {} records from {} events ({} skipped)", source_name,
             out->records.size(), out->events_total, out->events_skipped);
  return pfSuccess;
}

pfResult_t import_chrome_trace(std::string_view json_text, const std::string& source_name,
                               const ImportOptions& options, ImportedTrace* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "import_chrome_trace: out is null");
  CompactTrace compact;
  PF_TRY(import_chrome_trace(json_text, source_name, options, &compact));
  ImportedTrace t;
  t.source = source_name;
  t.records = activity_from_compact(compact);
  t.events_total = compact.events_total;
  t.events_skipped = compact.events_skipped;
  t.device_memory_bytes = std::move(compact.device_memory_bytes);
  t.rank = compact.rank;
  *out = std::move(t);
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
