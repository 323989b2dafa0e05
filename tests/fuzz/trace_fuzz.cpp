#include "trace_fuzz.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/bubbles.hpp"
#include "analysis/chrome_trace.hpp"
#include "analysis/interference.hpp"
#include "analysis/io/trace_reader.hpp"
#include "analysis/report.hpp"
#include "common/error.hpp"

namespace pipefill::analysis::fuzz {
namespace {

// Few enough that a trace of a thousand tiny devices stays a fast input.
constexpr size_t kMaxDevices = 8;

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "trace fuzz invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, detail)              \
  do {                                        \
    if (!(cond)) broken(#cond, (detail));     \
  } while (0)

bool near(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max({1.0, std::fabs(a), std::fabs(b)});
}

void expect_same_records(const CompactTrace& a, const CompactTrace& b, const char* what) {
  FUZZ_CHECK(a.records.size() == b.records.size(), what);
  FUZZ_CHECK(a.events_total == b.events_total, what);
  FUZZ_CHECK(a.events_skipped == b.events_skipped, what);
  FUZZ_CHECK(a.device_memory_bytes == b.device_memory_bytes, what);
  FUZZ_CHECK(a.rank == b.rank, what);
  for (size_t i = 0; i < a.records.size(); ++i) {
    const TraceRecord& x = a.records[i];
    const TraceRecord& y = b.records[i];
    const std::string at = std::string(what) + ", record " + std::to_string(i);
    FUZZ_CHECK(a.name_of(x) == b.name_of(y), at);
    FUZZ_CHECK(x.kind == y.kind && x.device == y.device && x.stream == y.stream, at);
    FUZZ_CHECK(x.start_us == y.start_us && x.end_us == y.end_us, at);
    FUZZ_CHECK(x.bytes == y.bytes && x.in_use_bytes == y.in_use_bytes, at);
    FUZZ_CHECK(x.correlation == y.correlation && x.process == y.process, at);
    FUZZ_CHECK(x.event_index == y.event_index && x.grid_blocks == y.grid_blocks, at);
  }
}

void check_device(const DeviceAnalysis& d) {
  double sum = 0.0, idle = 0.0, comm = 0.0, copy = 0.0;
  for (const Bubble& b : d.bubbles) {
    FUZZ_CHECK(b.duration_us() >= 0.0, "negative bubble");
    FUZZ_CHECK(b.idle_us >= 0.0 && b.comm_only_us >= 0.0 && b.copy_us >= 0.0, "negative share");
    FUZZ_CHECK(near(b.idle_us + b.comm_only_us + b.copy_us, b.duration_us()),
               "shares do not partition the bubble");
    if (std::isfinite(b.start_delay_us)) {
      FUZZ_CHECK(b.kind != BubbleKind::Idle, "start delay of an idle bubble");
      FUZZ_CHECK(b.start_delay_us >= 0.0 && b.start_delay_us <= b.duration_us() * (1 + 1e-12),
                 "start delay outside its bubble");
    }
    sum += b.duration_us();
    idle += b.idle_us;
    comm += b.comm_only_us;
    copy += b.copy_us;
  }
  FUZZ_CHECK(near(sum, d.bubble_us), "bubble sum");
  FUZZ_CHECK(near(idle + comm + copy, d.bubble_us), "kind split does not add up");
  FUZZ_CHECK(d.idle_bubbles + d.comm_only_bubbles + d.copy_bubbles == d.bubbles.size(), "labels");
  if (!d.explicit_bubbles) {
    FUZZ_CHECK(d.bubble_us <= d.span_us() * (1 + 1e-9) + 1e-9, "bubbles longer than the span");
  }
  FUZZ_CHECK(!d.iterations.empty(), "no iteration");
}

void analyse(const CompactTrace& trace) {
  TraceAnalyzer analyzer(trace);
  std::vector<int> devices = analyzer.analysable_devices();
  if (devices.size() > kMaxDevices) devices.resize(kMaxDevices);
  for (const int device : devices) {
    DeviceAnalysis d;
    const pfResult_t r = analyzer.analyze(device, AnalysisOptions{}, &d);
    FUZZ_CHECK(r == pfSuccess || r == pfErrorInvalidArgument, last_error_message());
    if (r != pfSuccess) {
      FUZZ_CHECK(!last_error_message().empty(), "an error without a message");
      continue;
    }
    check_device(d);
    // Fixed-period iterations over the same span.
    AnalysisOptions period;
    period.iteration_period_us = std::max(1.0, d.span_us() / 4.0);
    period.item_cost_us = 10.0;
    period.item_memory_bytes = 1 << 20;
    period.device_memory_bytes = uint64_t{1} << 34;
    DeviceAnalysis p;
    const pfResult_t pr = analyzer.analyze(device, period, &p);
    FUZZ_CHECK(pr == pfSuccess || pr == pfErrorInvalidArgument, last_error_message());
    if (pr == pfSuccess) check_device(p);
    // The trace against itself: nothing slowed down.
    InterferenceAnalysis self;
    if (compare_traces(analyzer, analyzer, device, AnalysisOptions{}, &self) == pfSuccess) {
      FUZZ_CHECK(self.matched_kernels == self.baseline_kernels, "self-comparison matches all");
      FUZZ_CHECK(self.compute_baseline_us == self.compute_filled_us, "self-comparison slowdown");
    }
  }
  TraceReport report;
  if (build_report(trace, nullptr, devices, AnalysisOptions{}, &report) == pfSuccess) {
    const std::string text = format_report(report, 4, 4, 4);
    FUZZ_CHECK(!text.empty(), "empty report");
    const std::string json = report_to_json(report).dump(-1, ' ', false,
                                                         nlohmann::json::error_handler_t::replace);
    FUZZ_CHECK(!json.empty(), "empty JSON report");
    std::vector<TraceReport> ranks;
    ranks.push_back(std::move(report));
    const CrossRankSummary summary = summarize_ranks(ranks);
    FUZZ_CHECK(summary.ranks == 1, "rank summary");
    (void)format_ranks(ranks, summary);
  }
}

}  // namespace

void run_one(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const ImportOptions options;

  // 4 KiB chunks: larger than most inputs (one read) without a megabyte buffer per input.
  io::ReadOptions one_read;
  one_read.chunk_bytes = 4096;
  CompactTrace streamed;
  const pfResult_t r = io::read_trace_bytes(bytes, "fuzz.json", options, &streamed, one_read);
  const std::string message = r == pfSuccess ? std::string() : last_error_message();
  FUZZ_CHECK(r == pfSuccess || r == pfErrorInvalidArgument, message);
  if (r != pfSuccess) {
    FUZZ_CHECK(message.rfind("fuzz.json: ", 0) == 0, "an error not naming the file: " + message);
  }

  // Chunk boundaries anywhere: the same outcome, to the message (for gzip, which error comes
  // first may differ: a bad CRC at the end against the JSON error the corruption caused).
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  io::ReadOptions small;
  small.chunk_bytes = 1 + size % 61;
  CompactTrace chunked;
  const pfResult_t rc = io::read_trace_bytes(bytes, "fuzz.json", options, &chunked, small);
  FUZZ_CHECK(rc == r, "chunk size changed the result: " + message);
  if (r != pfSuccess && !gzip) {
    FUZZ_CHECK(last_error_message() == message, "chunk size changed the message: " + message +
                                                    " vs " + last_error_message());
  } else if (r == pfSuccess) {
    expect_same_records(streamed, chunked, "chunked");
  }

  // The DOM importer applies the same rules: whenever both accept a plain-JSON input, the
  // records agree (the streaming one is stricter about some structure, e.g. a repeated
  // "traceEvents", and lenient about values it never reads).
  if (!gzip && r == pfSuccess) {
    CompactTrace parsed;
    if (import_chrome_trace(bytes, "fuzz.json", options, &parsed) == pfSuccess) {
      expect_same_records(streamed, parsed, "DOM importer");
    }
  }
  if (r == pfSuccess) analyse(streamed);
}

}  // namespace pipefill::analysis::fuzz
