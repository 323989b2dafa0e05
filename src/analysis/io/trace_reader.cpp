#include "analysis/io/trace_reader.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"

namespace pipefill::analysis::io {
namespace {

namespace od = simdjson::ondemand;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The JSON type a value starting with `c` has (for messages).
const char* type_of_first(char c) {
  switch (c) {
    case '{': return "object";
    case '[': return "array";
    case '"': return "string";
    case 't':
    case 'f': return "boolean";
    case 'n': return "null";
    default: return (c == '-' || (c >= '0' && c <= '9')) ? "number" : "invalid";
  }
}

JsonField::Type field_type_of_first(char c) {
  switch (c) {
    case '{': return JsonField::Type::Object;
    case '[': return JsonField::Type::Array;
    case '"': return JsonField::Type::String;
    case 't':
    case 'f': return JsonField::Type::Bool;
    case 'n': return JsonField::Type::Null;
    default: return JsonField::Type::Number;
  }
}

std::string_view trimmed(std::string_view token) {
  while (!token.empty() && is_space(token.back())) token.remove_suffix(1);
  return token;
}

// A token that is a valid JSON number whose magnitude no double holds ("1e400", "-2e308").
bool beyond_double(std::string_view token) {
  size_t i = 0;
  auto digits = [&] {
    const size_t from = i;
    while (i < token.size() && token[i] >= '0' && token[i] <= '9') ++i;
    return i > from;
  };
  if (i < token.size() && token[i] == '-') ++i;
  if (i < token.size() && token[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < token.size() && token[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < token.size() && (token[i] == 'e' || token[i] == 'E')) {
    ++i;
    if (i < token.size() && (token[i] == '+' || token[i] == '-')) ++i;
    if (!digits()) return false;
  }
  if (i != token.size() || token.size() >= 512) return false;
  char buffer[512];
  std::memcpy(buffer, token.data(), token.size());
  buffer[token.size()] = '\0';
  return std::isinf(std::strtod(buffer, nullptr));
}

// Reads one value into `f`. Containers are only typed (and skipped by the caller's iteration).
simdjson::error_code read_field(od::value value, JsonField* f) {
  od::json_type type;
  if (const auto e = value.type().get(type)) return e;
  switch (type) {
    case od::json_type::object: f->type = JsonField::Type::Object; return simdjson::SUCCESS;
    case od::json_type::array: f->type = JsonField::Type::Array; return simdjson::SUCCESS;
    case od::json_type::string: {
      std::string_view text;
      if (const auto e = value.get_string().get(text)) return e;
      f->type = JsonField::Type::String;
      f->text = text;
      return simdjson::SUCCESS;
    }
    case od::json_type::number: {
      f->text = trimmed(value.raw_json_token());
      double d = 0.0;
      if (const auto e = value.get_double().get(d); e != simdjson::SUCCESS || !std::isfinite(d)) {
        // 1e400: a JSON number beyond a double, which the rules name; 1.2.3: not JSON.
        if (!beyond_double(f->text)) return e != simdjson::SUCCESS ? e : simdjson::NUMBER_ERROR;
        f->type = JsonField::Type::BadNumber;
        return simdjson::SUCCESS;
      }
      f->type = JsonField::Type::Number;
      f->number = d;
      return simdjson::SUCCESS;
    }
    case od::json_type::boolean: {
      bool b = false;
      if (const auto e = value.get_bool().get(b)) return e;
      f->type = JsonField::Type::Bool;
      return simdjson::SUCCESS;
    }
    case od::json_type::null: {
      bool is_null = false;
      if (const auto e = value.is_null().get(is_null)) return e;
      if (!is_null) return simdjson::N_ATOM_ERROR;
      f->type = JsonField::Type::Null;
      return simdjson::SUCCESS;
    }
  }
  return simdjson::INCORRECT_TYPE;
}

// Blanks the SIMDJSON_PADDING bytes after a value while simdjson parses it, restoring them
// afterwards: the padding simdjson reads past a value must not hold the next event, or a
// malformed event can be accepted (or not) depending on what follows it in the buffer.
class BlankPadding {
 public:
  explicit BlankPadding(char* after) : after_(after) {
    std::memcpy(saved_, after_, sizeof(saved_));
    std::memset(after_, ' ', sizeof(saved_));
  }
  ~BlankPadding() { std::memcpy(after_, saved_, sizeof(saved_)); }
  BlankPadding(const BlankPadding&) = delete;
  BlankPadding& operator=(const BlankPadding&) = delete;

 private:
  char* after_;
  char saved_[simdjson::SIMDJSON_PADDING];
};

class Reader {
 public:
  Reader(ByteSource& source, const std::string& name, const ImportOptions& options,
         CompactTrace* out, const ReadOptions& read)
      : source_(source), name_(name), options_(options), out_(out), read_(read),
        converter_(options, out) {
    read_.chunk_bytes = std::max<size_t>(1, read_.chunk_bytes);
    capacity_ = std::max<size_t>(2 * read_.chunk_bytes, 64);
    buffer_.resize(capacity_ + simdjson::SIMDJSON_PADDING);
  }

  pfResult_t run() {
    // A UTF-8 byte-order mark before the JSON.
    PF_TRY(need(3));
    if (end_ - pos_ >= 3 && std::memcmp(buffer_.data() + pos_, "\xEF\xBB\xBF", 3) == 0) pos_ += 3;
    PF_TRY(skip_space());
    if (at_end()) return fail(pfErrorInvalidArgument, "{}: the trace is empty", name_);
    const char first = buffer_[pos_];
    if (first == '[') {
      ++pos_;
      PF_TRY(stream_events());
    } else if (first == '{') {
      ++pos_;
      PF_TRY(top_level_object());
    } else {
      const char* type = type_of_first(first);
      if (std::string_view(type) == "invalid") {
        return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: unexpected '{}'{}",
                    name_, offset(), printable(first), looks_binary(first));
      }
      return fail(pfErrorInvalidArgument,
                  "{}: the trace has JSON type {}, expected an object with \"traceEvents\" or an "
                  "array",
                  name_, type);
    }
    PF_TRY(skip_space());
    if (!at_end()) {
      return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: unexpected '{}' after "
                  "the end of the trace", name_, offset(), printable(buffer_[pos_]));
    }
    converter_.finish();
    out_->records.shrink_to_fit();
    return pfSuccess;
  }

 private:
  // ---- buffer ---------------------------------------------------------------------------
  uint64_t offset() const { return base_ + pos_; }
  bool at_end() const { return pos_ == end_ && eof_; }

  // Reads more input, keeping [mark_, end_) (moved to the front of the buffer).
  pfResult_t more() {
    if (eof_) return pfSuccess;
    if (mark_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + mark_, end_ - mark_);
      pos_ -= mark_;
      end_ -= mark_;
      base_ += mark_;
      mark_ = 0;
    }
    if (end_ == capacity_) {
      if (capacity_ >= read_.max_value_bytes) {
        return fail(pfErrorInvalidArgument,
                    "{}: a single value at byte {} is larger than {} MiB, the bound of "
                    "--max-value-mib; not a trace this tool reads unless that bound is raised",
                    name_, base_, read_.max_value_bytes >> 20);
      }
      capacity_ = std::min(capacity_ * 2, std::max(read_.max_value_bytes, capacity_ + 1));
      buffer_.resize(capacity_ + simdjson::SIMDJSON_PADDING);
    }
    size_t got = 0;
    PF_TRY(source_.read(buffer_.data() + end_, std::min(capacity_ - end_, read_.chunk_bytes), &got));
    if (got == 0) eof_ = true;
    end_ += got;
    return pfSuccess;
  }

  // At least `n` bytes after pos_ unless the input ends first.
  pfResult_t need(size_t n) {
    while (end_ - pos_ < n && !eof_) {
      mark_ = pos_;
      PF_TRY(more());
    }
    return pfSuccess;
  }

  pfResult_t skip_space() {
    while (true) {
      while (pos_ < end_ && is_space(buffer_[pos_])) ++pos_;
      if (pos_ < end_ || eof_) return pfSuccess;
      mark_ = pos_;
      PF_TRY(more());
    }
  }

  pfResult_t truncated(const char* inside) {
    return fail(pfErrorInvalidArgument, "{}: not valid JSON: the trace ends at byte {} inside {}",
                name_, offset(), inside);
  }

  static std::string printable(char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  static const char* looks_binary(char c) {
    return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f
               ? " (binary data: a compressed or corrupt file?)"
               : "";
  }

  // Scans one value starting at pos_ (not whitespace). keep: its bytes stay in the buffer from
  // mark_ (its start) to pos_ (just past it) on return; otherwise they are dropped as read.
  pfResult_t scan_value(bool keep) {
    mark_ = pos_;
    const char first = buffer_[pos_];
    if (first != '{' && first != '[' && first != '"') {
      // A scalar: up to the next delimiter.
      while (true) {
        while (pos_ < end_) {
          const char c = buffer_[pos_];
          if (c == ',' || c == '}' || c == ']' || c == ':' || is_space(c)) return pfSuccess;
          ++pos_;
        }
        if (eof_) return pfSuccess;
        if (!keep) mark_ = pos_;
        PF_TRY(more());
        if (pos_ == end_ && eof_) return pfSuccess;
      }
    }
    int64_t depth = 0;
    bool in_string = false;
    bool escape = false;
    while (true) {
      const char* data = buffer_.data();
      const char* p = data + pos_;
      const char* e = data + end_;
      while (p < e) {
        if (in_string) {
          if (escape) {
            escape = false;
            ++p;
            continue;
          }
          while (p < e && *p != '"' && *p != '\\') ++p;
          if (p == e) break;
          if (*p == '\\') {
            escape = true;
            ++p;
            continue;
          }
          in_string = false;
          ++p;
          if (depth == 0) {
            pos_ = static_cast<size_t>(p - data);
            return pfSuccess;
          }
          continue;
        }
        const char c = *p++;
        if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if (c == '}' || c == ']') {
          if (--depth == 0) {
            pos_ = static_cast<size_t>(p - data);
            return pfSuccess;
          }
        }
      }
      pos_ = end_;
      if (!keep) mark_ = pos_;
      if (eof_) return truncated(in_string ? "a string" : "an object or array");
      PF_TRY(more());
      if (pos_ == end_ && eof_) return truncated(in_string ? "a string" : "an object or array");
    }
  }

  pfResult_t expect(char wanted, const char* after) {
    PF_TRY(skip_space());
    if (at_end()) return truncated(after);
    if (buffer_[pos_] != wanted) {
      return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: expected '{}' {}, got '{}'",
                  name_, offset(), wanted, after, printable(buffer_[pos_]));
    }
    ++pos_;
    return pfSuccess;
  }

  // The key [mark_, pos_) (a JSON string) without its quotes and escapes.
  pfResult_t unescaped_key(std::string* key) {
    const std::string_view raw(buffer_.data() + mark_, pos_ - mark_);
    if (raw.find('\\') == std::string_view::npos) {
      key->assign(raw.substr(1, raw.size() - 2));
      return pfSuccess;
    }
    const simdjson::padded_string padded(raw);
    od::document doc;
    std::string_view text;
    if (const auto e = parser_.iterate(padded).get(doc)) return key_error(e);
    if (const auto e = doc.get_string().get(text)) return key_error(e);
    key->assign(text);
    return pfSuccess;
  }
  pfResult_t key_error(simdjson::error_code e) {
    return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: a key of the trace object: {}",
                name_, base_ + mark_, simdjson::error_message(e));
  }

  // ---- structure ----------------------------------------------------------------------------
  pfResult_t top_level_object() {
    bool found_events = false;
    PF_TRY(skip_space());
    if (!at_end() && buffer_[pos_] == '}') {
      ++pos_;
    } else {
      while (true) {
        PF_TRY(skip_space());
        if (at_end()) return truncated("the trace object");
        if (buffer_[pos_] != '"') {
          return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: expected a key, got '{}'",
                      name_, offset(), printable(buffer_[pos_]));
        }
        PF_TRY(scan_value(true));
        std::string key;
        PF_TRY(unescaped_key(&key));
        mark_ = pos_;
        PF_TRY(expect(':', "after a key"));
        PF_TRY(skip_space());
        if (at_end()) return truncated("the trace object");
        if (key == "traceEvents") {
          if (found_events) {
            return fail(pfErrorInvalidArgument, "{}: \"traceEvents\" appears twice (byte {})",
                        name_, offset());
          }
          if (buffer_[pos_] != '[') {
            return fail(pfErrorInvalidArgument,
                        "{}: \"traceEvents\" has JSON type {}, expected an array", name_,
                        type_of_first(buffer_[pos_]));
          }
          ++pos_;
          PF_TRY(stream_events());
          found_events = true;
        } else if (key == "deviceProperties" || key == "distributedInfo") {
          PF_TRY(scan_value(true));
          read_metadata(key);
          mark_ = pos_;
        } else {
          PF_TRY(scan_value(false));
          mark_ = pos_;
        }
        PF_TRY(skip_space());
        if (at_end()) return truncated("the trace object");
        const char c = buffer_[pos_++];
        if (c == '}') break;
        if (c != ',') {
          --pos_;
          return fail(pfErrorInvalidArgument,
                      "{}: not valid JSON at byte {}: expected ',' or '}}' in the trace object, "
                      "got '{}'",
                      name_, offset(), printable(c));
        }
      }
    }
    if (!found_events) {
      return fail(pfErrorInvalidArgument, "{}: no \"traceEvents\" array in the trace object", name_);
    }
    return pfSuccess;
  }

  pfResult_t stream_events() {
    size_t index = 0;
    PF_TRY(skip_space());
    if (!at_end() && buffer_[pos_] == ']') {
      ++pos_;
      return pfSuccess;
    }
    while (true) {
      PF_TRY(skip_space());
      if (at_end()) return truncated("traceEvents");
      const char first = buffer_[pos_];
      if (first != '{') {
        if (first == ']' || first == ',' || std::string_view(type_of_first(first)) == "invalid") {
          return fail(pfErrorInvalidArgument, "{}: not valid JSON at byte {}: unexpected '{}' in "
                      "traceEvents", name_, offset(), printable(first));
        }
        return converter_.not_an_object(field_type_of_first(first), index);
      }
      if (index >= read_.max_events) {
        return fail(pfErrorInvalidArgument,
                    "{}: more than {} entries in traceEvents, the bound of --max-events (each "
                    "costs memory and time); raise it to read this trace",
                    name_, read_.max_events);
      }
      PF_TRY(scan_value(true));
      PF_TRY(parse_event(index));
      mark_ = pos_;
      ++index;
      PF_TRY(skip_space());
      if (at_end()) return truncated("traceEvents");
      const char c = buffer_[pos_++];
      if (c == ']') return pfSuccess;
      if (c != ',') {
        --pos_;
        return fail(pfErrorInvalidArgument,
                    "{}: not valid JSON at byte {}: expected ',' or ']' after traceEvents[{}], "
                    "got '{}'",
                    name_, offset(), index - 1, printable(c));
      }
    }
  }

  pfResult_t json_error(size_t index, simdjson::error_code e) {
    return fail(pfErrorInvalidArgument, "{}: traceEvents[{}] (byte {}) is not valid JSON: {}",
                name_, index, base_ + mark_, simdjson::error_message(e));
  }

  // The element [mark_, pos_) of traceEvents. all_args: parse "args" even where the fields
  // seen before it say the event does not need them.
  pfResult_t parse_event(size_t index, bool all_args = false) {
    const size_t length = pos_ - mark_;
    const BlankPadding blank(buffer_.data() + pos_);
    od::document doc;
    if (const auto e = parser_.iterate(buffer_.data() + mark_, length, buffer_.size() - mark_).get(doc)) {
      return json_error(index, e);
    }
    od::object object;
    if (const auto e = doc.get_object().get(object)) return json_error(index, e);
    EventFields event;
    bool seen_ph = false, seen_cat = false, seen_name = false;
    bool args_skipped = false;  // the last "args" was left unparsed
    for (auto member : object) {
      od::field field;
      if (const auto e = std::move(member).get(field)) return json_error(index, e);
      std::string_view key;
      if (const auto e = field.unescaped_key().get(key)) return json_error(index, e);
      od::value value = field.value();
      JsonField* target = nullptr;
      if (key.size() <= 4) {
        if (key == "ph") {
          target = &event.ph;
          seen_ph = true;
        } else if (key == "cat") {
          target = &event.cat;
          seen_cat = true;
        } else if (key == "name") {
          target = &event.name;
          seen_name = true;
        } else if (key == "pid") {
          target = &event.pid;
        } else if (key == "tid") {
          target = &event.tid;
        } else if (key == "ts") {
          target = &event.ts;
        } else if (key == "dur") {
          target = &event.dur;
        } else if (key == "args") {
          // Kineto writes ph, cat and name first: most events' args (CPU ops) go unparsed.
          if (!all_args && seen_ph && seen_cat && seen_name &&
              args_needed(event.ph, event.cat, event.name, options_) == EventNeed::Nothing) {
            args_skipped = true;
            continue;
          }
          // A repeated key: the last one counts, as in the DOM importer.
          args_skipped = false;
          reset_args(&event);
          PF_TRY(parse_args(value, index, &event));
          continue;
        }
      }
      if (target == nullptr) continue;
      *target = JsonField{};
      if (const auto e = read_field(value, target)) return json_error(index, e);
    }
    // A repeated "ph", "cat" or "name" after the args changed what the event is (rare): again,
    // with its args.
    if (args_skipped && args_needed(event.ph, event.cat, event.name, options_) == EventNeed::Args) {
      return parse_event(index, true);
    }
    return converter_.convert(event, index);
  }

  static void reset_args(EventFields* e) {
    e->args_object = false;
    e->device = e->stream = e->correlation = e->bytes = JsonField{};
    e->device_type = e->device_id = e->memory_bytes = e->total_allocated = JsonField{};
    e->grid_blocks = 0;
  }

  pfResult_t parse_args(od::value value, size_t index, EventFields* event) {
    od::object args;
    const auto type_error = value.get_object().get(args);
    if (type_error == simdjson::INCORRECT_TYPE) return pfSuccess;  // not an object: no args
    if (type_error) return json_error(index, type_error);
    event->args_object = true;
    for (auto member : args) {
      od::field field;
      if (const auto e = std::move(member).get(field)) return json_error(index, e);
      std::string_view key;
      if (const auto e = field.unescaped_key().get(key)) return json_error(index, e);
      JsonField* target = nullptr;
      if (key == "device") {
        target = &event->device;
      } else if (key == "stream") {
        target = &event->stream;
      } else if (key == "correlation") {
        target = &event->correlation;
      } else if (key == "bytes") {
        target = &event->bytes;
      } else if (key == "Device Type") {
        target = &event->device_type;
      } else if (key == "Device Id") {
        target = &event->device_id;
      } else if (key == "Bytes") {
        target = &event->memory_bytes;
      } else if (key == "Total Allocated") {
        target = &event->total_allocated;
      } else if (key == "grid") {
        od::value grid_value = field.value();
        od::array grid;
        const auto e = grid_value.get_array().get(grid);
        event->grid_blocks = 0;
        if (e == simdjson::INCORRECT_TYPE) continue;
        if (e) return json_error(index, e);
        GridProduct product;
        for (auto element : grid) {
          od::value dimension;
          if (const auto de = std::move(element).get(dimension)) return json_error(index, de);
          JsonField f;
          if (const auto fe = read_field(dimension, &f)) return json_error(index, fe);
          product.add(f);
        }
        event->grid_blocks = product.blocks();
        continue;
      }
      if (target == nullptr) continue;
      *target = JsonField{};
      if (const auto e = read_field(field.value(), target)) return json_error(index, e);
    }
    return pfSuccess;
  }

  // Informative metadata: anything malformed in it is ignored (the DOM importer does the same).
  void read_metadata(const std::string& key) {
    const BlankPadding blank(buffer_.data() + pos_);
    od::document doc;
    if (parser_.iterate(buffer_.data() + mark_, pos_ - mark_, buffer_.size() - mark_).get(doc)) {
      return;
    }
    // A repeated key: the last value counts, as in the DOM importer.
    if (key == "distributedInfo") {
      out_->rank = -1;
      od::object info;
      if (doc.get_object().get(info)) return;
      JsonField rank;
      for (auto member : info) {
        od::field field;
        std::string_view k;
        if (std::move(member).get(field) || field.unescaped_key().get(k)) return;
        if (k != "rank") continue;
        rank = JsonField{};
        if (read_field(field.value(), &rank)) return;
      }
      read_distributed_rank(rank, out_);
      return;
    }
    out_->device_memory_bytes.clear();
    od::array devices;
    if (doc.get_array().get(devices)) return;
    for (auto element : devices) {
      od::object device;
      if (element.get_object().get(device)) {
        if (element.error() && element.error() != simdjson::INCORRECT_TYPE) return;
        continue;
      }
      JsonField id, memory;
      for (auto member : device) {
        od::field field;
        std::string_view k;
        if (std::move(member).get(field) || field.unescaped_key().get(k)) return;
        JsonField* target = k == "id" ? &id : k == "totalGlobalMem" ? &memory : nullptr;
        if (target == nullptr) continue;
        *target = JsonField{};
        if (read_field(field.value(), target)) return;
      }
      read_device_property(id, memory, out_);
    }
  }

  ByteSource& source_;
  const std::string& name_;
  const ImportOptions& options_;
  CompactTrace* out_;
  ReadOptions read_;
  EventConverter converter_;
  od::parser parser_;
  std::vector<char> buffer_;  // capacity_ bytes of data plus simdjson's padding
  size_t capacity_ = 0;
  size_t mark_ = 0;  // bytes before mark_ may be dropped when reading more
  size_t pos_ = 0;
  size_t end_ = 0;
  uint64_t base_ = 0;  // stream offset of buffer_[0]
  bool eof_ = false;
};

}  // namespace

pfResult_t read_trace(ByteSource& source, const std::string& name, const ImportOptions& options,
                      CompactTrace* out, const ReadOptions& read) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "read_trace: out is null");
  *out = CompactTrace{};
  out->source = name;
  try {
    PF_TRY(Reader(source, name, options, out, read).run());
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "{}: out of memory while reading the trace", name);
  } catch (const std::exception& e) {
    return fail(pfErrorInternal, "{}: unexpected error while reading the trace: {}", name, e.what());
  }
  log::debug("{}: imported {} records from {} events ({} skipped)", name, out->records.size(),
             out->events_total, out->events_skipped);
  return pfSuccess;
}

pfResult_t read_trace_file(const std::string& path, const ImportOptions& options,
                           CompactTrace* out, const ReadOptions& read) {
  std::unique_ptr<ByteSource> source;
  PF_TRY(open_trace_source(path, &source));
  return read_trace(*source, path, options, out, read);
}

pfResult_t read_trace_bytes(std::string_view bytes, const std::string& name,
                            const ImportOptions& options, CompactTrace* out,
                            const ReadOptions& read) {
  std::unique_ptr<ByteSource> source;
  PF_TRY(detect_compression(memory_source(bytes, name), name, &source));
  return read_trace(*source, name, options, out, read);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return path != "-" && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

pfResult_t list_trace_folder(const std::string& folder, std::vector<std::string>* files) {
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) {
    return fail(pfErrorIo, "cannot read folder '{}': {}", folder, std::strerror(errno));
  }
  std::vector<std::string> found;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    auto ends_with = [&](std::string_view suffix) {
      return name.size() > suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (!ends_with(".json") && !ends_with(".json.gz")) continue;
    const std::string path = folder + (folder.empty() || folder.back() == '/' ? "" : "/") + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) found.push_back(path);
  }
  ::closedir(dir);
  if (found.empty()) {
    return fail(pfErrorInvalidArgument, "folder '{}' holds no *.json or *.json.gz trace", folder);
  }
  std::sort(found.begin(), found.end());
  *files = std::move(found);
  return pfSuccess;
}

}  // namespace pipefill::analysis::io
