#include "core/trace_writer.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>
#include <algorithm>

#include <fmt/format.h>

#include "common/error.hpp"

namespace pipefill::core {
namespace {

const char* kind_name(int kind) {
  switch (kind) {
    case pfBubbleWarmup: return "warmup";
    case pfBubbleCooldown: return "cooldown";
    case pfBubbleDrain: return "drain";
    case pfBubbleOptimizer: return "optimizer";
    default: return "other";
  }
}

std::string json_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 2);
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

void render_calibration(const ActivityRecord& r, int pid, std::string* out) {
  const uint64_t tid = TraceRecords::kCalibrationTidBase + r.stream;
  switch (r.kind) {
    case ActivityKind::Kernel:
    case ActivityKind::Comm:
    case ActivityKind::Fill:
    case ActivityKind::Memcpy:
    case ActivityKind::Memset: {
      // The categories PyTorch's profiler uses, so pipefill-analyze and Perfetto read them like
      // any GPU trace; one track per device stream.
      const char* cat = r.kind == ActivityKind::Memcpy   ? "gpu_memcpy"
                        : r.kind == ActivityKind::Memset ? "gpu_memset"
                        : r.kind == ActivityKind::Fill   ? "fill"
                                                         : "kernel";
      *out += fmt::format(
          ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},"
          "\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{\"device\":{},\"stream\":{},"
          "\"gpu\":{},\"bytes\":{},\"correlation\":{},\"blocks\":{}}}}}",
          json_escape(r.name), cat, pid, tid, r.start_us, r.end_us - r.start_us, pid, tid,
          r.device, r.bytes, r.correlation, r.grid_blocks);
      break;
    }
    case ActivityKind::MemoryAlloc:
    case ActivityKind::MemoryFree:
      *out += fmt::format(
          ",\n{{\"name\":\"[memory]\",\"ph\":\"i\",\"s\":\"t\",\"pid\":{},\"tid\":{},"
          "\"ts\":{:.3f},\"args\":{{\"Device Type\":1,\"Device Id\":{},\"Bytes\":{}{}}}}}",
          pid, tid, r.start_us, pid, r.kind == ActivityKind::MemoryFree ? "-" : "", r.bytes);
      break;
    case ActivityKind::Marker:
      break;
  }
}

// One GPU-side "ProfilerStep#N" span per iteration that has recorded bubbles, so that
// pipefill-analyze (whose default iteration marker that is) and other PyTorch-trace tools read
// the run's iterations back. The runtime knows no device time for pfIterationEnd, so iteration N
// starts where iteration N-1's last bubble ended (the first at the trace's first record) and the
// last runs to the trace's last record: every bubble falls in its own iteration. An iteration
// without a recorded bubble merges into the one after it.
void render_iterations(const TraceRecords& records, int pid, std::string* out) {
  if (records.bubbles.empty()) return;
  double first = records.bubbles.front().begin_us, last = records.bubbles.front().end_us;
  auto cover = [&](double start, double end) {
    first = std::min(first, start);
    last = std::max(last, end);
  };
  for (const TraceBubble& b : records.bubbles) cover(b.begin_us, b.end_us);
  for (const TraceSlice& s : records.slices) cover(s.start_us, s.end_us);
  for (const ActivityRecord& r : records.calibration) cover(r.start_us, r.end_us);
  // The device the calibration records name (the bubbles' pid otherwise), so the steps apply to
  // the same device as the kernels.
  const int device = records.calibration.empty() ? pid : records.calibration.front().device;
  // Bubbles are recorded in id order, so iterations are non-decreasing.
  std::vector<std::pair<uint64_t, double>> starts;  // (iteration, start)
  double previous_end = first;
  for (size_t i = 0; i < records.bubbles.size(); ++i) {
    const TraceBubble& b = records.bubbles[i];
    if (starts.empty() || b.iteration > starts.back().first) {
      starts.emplace_back(b.iteration, starts.empty() ? first : previous_end);
    }
    previous_end = std::max(previous_end, b.end_us);
  }
  for (size_t k = 0; k < starts.size(); ++k) {
    const double start = starts[k].second;
    const double end = k + 1 < starts.size() ? starts[k + 1].second : last;
    *out += fmt::format(
        ",\n{{\"name\":\"ProfilerStep#{}\",\"cat\":\"gpu_user_annotation\",\"ph\":\"X\","
        "\"pid\":{},\"tid\":3,\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{\"device\":{},"
        "\"pipefill_iteration\":{}}}}}",
        starts[k].first, pid, start, std::max(0.0, end - start), device, starts[k].first);
  }
}

}  // namespace

void TraceRecords::add(TraceBubble bubble) {
  if (bubbles.size() < kMaxRecords) {
    bubbles.push_back(std::move(bubble));
  } else {
    truncated = true;
  }
}

void TraceRecords::add(TraceSlice slice) {
  if (slices.size() < kMaxRecords) {
    slices.push_back(std::move(slice));
  } else {
    truncated = true;
  }
}

void TraceRecords::add(ActivityRecord record) {
  if (calibration.size() < kMaxRecords) {
    calibration.push_back(std::move(record));
  } else {
    truncated = true;
  }
}

std::string render_chrome_trace(const TraceRecords& records, int pid) {
  std::string out;
  out.reserve(256 + 200 * (records.bubbles.size() + records.slices.size()));
  out += "{\"traceEvents\":[\n";
  out += fmt::format(
      "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":"
      "\"PipeFill stage {0}\"}}}},\n",
      pid);
  out += fmt::format(
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":1,\"args\":{{\"name\":"
      "\"bubbles (main stream)\"}}}},\n",
      pid);
  out += fmt::format(
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":2,\"args\":{{\"name\":"
      "\"fill slices\"}}}},\n",
      pid);
  out += fmt::format(
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":3,\"args\":{{\"name\":"
      "\"iterations\"}}}}",
      pid);
  for (const TraceBubble& b : records.bubbles) {
    out += fmt::format(
        ",\n{{\"name\":\"bubble {}\",\"cat\":\"bubble\",\"ph\":\"X\",\"pid\":{},\"tid\":1,"
        "\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{\"id\":{},\"iteration\":{},\"kind\":\"{}\","
        "\"predicted_us\":{:.3f},\"slices\":{}}}}}",
        json_escape(b.class_key), pid, b.begin_us, b.end_us - b.begin_us, b.id, b.iteration,
        kind_name(b.kind), b.predicted_us, b.slices);
    if (b.predicted_us > 0) {
      out += fmt::format(
          ",\n{{\"name\":\"predicted bubble us\",\"ph\":\"C\",\"pid\":{},\"tid\":1,"
          "\"ts\":{:.3f},\"args\":{{\"{}\":{:.3f}}}}}",
          pid, b.begin_us, json_escape(b.class_key), b.predicted_us);
    }
  }
  for (const TraceSlice& s : records.slices) {
    out += fmt::format(
        ",\n{{\"name\":\"{}\",\"cat\":\"fill\",\"ph\":\"X\",\"pid\":{},\"tid\":2,"
        "\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{\"bubble\":{},\"items\":{},\"config\":{}{}}}}}",
        json_escape(s.job_name), pid, s.start_us, s.end_us - s.start_us, s.bubble_id, s.items,
        s.config_index, s.late ? ",\"late\":true" : "");
  }
  for (const ActivityRecord& r : records.calibration) render_calibration(r, pid, &out);
  render_iterations(records, pid, &out);
  out += fmt::format("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"truncated\":{}}}}}\n",
                     records.truncated ? "true" : "false");
  return out;
}

pfResult_t write_text_file(const char* path, const std::string& text) {
  std::FILE* file = std::fopen(path, "wb");
  if (file == nullptr) {
    return fail(pfErrorIo, "cannot open trace file '{}' for writing: {}", path,
                std::strerror(errno));
  }
  const size_t written = std::fwrite(text.data(), 1, text.size(), file);
  const bool closed = std::fclose(file) == 0;
  if (written != text.size() || !closed) {
    return fail(pfErrorIo, "writing trace file '{}' failed: {}", path, std::strerror(errno));
  }
  return pfSuccess;
}

}  // namespace pipefill::core
