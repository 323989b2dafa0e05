// pipefill-analyze: "how much bubble do we have, and what would filling it give us?" from a
// PyTorch profiler / Kineto Chrome trace (or PipeFill's own trace), before any filling is done;
// with --baseline, how much a filled run slowed the main job down; with a folder of rank traces
// (or several traces), one row per rank and a cross-rank summary.
//
//   pipefill-analyze TRACE... [--baseline base.json] [--device N] [--min-gap-us X]
//       [--iteration-marker ProfilerStep | --iteration-period-us P] [--device-memory-gb G]
//       [--item-cost-us C] [--comm-name SUBSTR]... [--device-map B:T]... [--json out.json]
//       [--max-iterations N] [--max-events N] [--max-value-mib M]
//
// Every amount of work the input sets is bounded (like pipefill-sim's --max-* flags): a trace
// or option beyond a bound is refused with a message naming the bound's flag.
// TRACE: a .json or .json.gz file (gzip is detected from the content), '-' for stdin, or a
// folder of rank traces. Exit status: 0 done, 1 a trace could not be read or analysed (message
// on stderr), 2 usage.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/io/trace_reader.hpp"
#include "analysis/report.hpp"
#include "common/error.hpp"

namespace {

using namespace pipefill;
using namespace pipefill::analysis;

int report_error(pfResult_t code) {
  std::fprintf(stderr, "pipefill-analyze: %s: %s\n", result_name(code),
               last_error_message().c_str());
  return 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "pipefill-analyze: %s\n", message.c_str());
  return 2;
}

// "3:0" -> (3, 0).
bool parse_device_pair(const std::string& text, std::pair<int, int>* out) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  try {
    size_t used_a = 0, used_b = 0;
    const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
    const int from = std::stoi(a, &used_a);
    const int to = std::stoi(b, &used_b);
    if (used_a != a.size() || used_b != b.size() || from < 0 || to < 0) return false;
    *out = {from, to};
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Invalid UTF-8 (a file name, a marker prefix from the command line) is replaced, not thrown.
std::string to_text(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// A memory size given in `unit_bytes` units, checked against 2^53 bytes before converting.
bool memory_bytes(double amount, double unit_bytes, uint64_t* out) {
  const double bytes = amount * unit_bytes;
  if (!(bytes >= 0.0) || bytes > 9007199254740992.0) return false;
  *out = static_cast<uint64_t>(std::llround(bytes));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Finds the pipeline bubbles of a training job in a Chrome trace (PyTorch profiler, Kineto,\n"
      "PipeFill) and estimates what filling them would give; with --baseline, compares a filled\n"
      "run with an unfilled one (main-job kernel slowdown, start delay after bubbles); with a\n"
      "folder of rank traces, one row per rank and a cross-rank summary.",
      "pipefill-analyze"};

  std::vector<std::string> trace_paths;
  std::string baseline_path;
  std::optional<int> device;
  std::string json_path;
  AnalysisOptions options;
  ImportOptions import_options;
  io::ReadOptions read_options;
  size_t max_value_mib = read_options.max_value_bytes >> 20;
  double device_memory_gb = 0.0;
  double item_memory_mb = 0.0;
  size_t max_classes = 32;
  size_t max_kernels = 10;
  size_t max_bubbles = 0;
  std::vector<std::string> comm_names;
  std::vector<std::string> device_map_texts;
  bool per_rank = false;

  app.add_option("trace", trace_paths,
                 "Chrome-trace JSON (.json or .json.gz, '-' for stdin) to analyse (the filled run "
                 "with --baseline), or a folder of rank traces, or several traces")
      ->required();
  app.add_option("--baseline", baseline_path,
                 "Trace of the same job without filling: report interference");
  app.add_option("--device", device, "Analyse only this device (default: every device with kernels)");
  app.add_option("--min-gap-us", options.min_gap_us,
                 "Shortest gap in compute counted as a bubble, us")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  auto* marker = app.add_option("--iteration-marker", options.iteration_marker,
                                "Name prefix of the per-iteration markers (ProfilerStep#N)")
                     ->capture_default_str();
  app.add_option("--iteration-period-us", options.iteration_period_us,
                 "Fixed iteration period, us (instead of markers)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-iterations", options.max_iterations,
                 "Bound on the iterations --iteration-period-us may make of a trace (span / "
                 "period)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{INT32_MAX}));
  app.add_option("--max-events", read_options.max_events,
                 "Bound on the traceEvents entries read from one trace")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-value-mib", max_value_mib,
                 "Bound on the size of one event or metadata value, MiB")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--iteration-origin-us", options.iteration_origin_us,
                 "Start of the first period-based iteration, trace time in us (default: first kernel)");
  app.add_option("--device-memory-gb", device_memory_gb,
                 "Device memory in GiB, for free memory per bubble class (default: the trace's "
                 "deviceProperties)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--quantile", options.quantile,
                 "Bubble-duration quantile the runtime would plan with (0,1]")
      ->capture_default_str();
  app.add_option("--safety-margin-us", options.safety_margin_us,
                 "Subtracted from every predicted bubble, us")
      ->capture_default_str();
  app.add_option("--safety-margin-fraction", options.safety_margin_fraction,
                 "Fraction of every predicted bubble kept free")
      ->capture_default_str();
  app.add_option("--item-cost-us", options.item_cost_us,
                 "Fill-job item duration, us: estimate items per iteration")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--item-parallelism", options.item_parallelism, "Fill-job items running at once")
      ->capture_default_str();
  app.add_option("--item-memory-mb", item_memory_mb, "Bubble memory each running item needs, MiB")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--fill-stream", import_options.fill_streams,
                 "Stream id whose kernels are fill work (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--fill-name", import_options.fill_name_substrings,
                 "Kernel-name substring marking fill work (repeatable; default: pipefill)")
      ->allow_extra_args(false);
  app.add_option("--comm-name", comm_names,
                 "Kernel-name substring (any case) marking communication kernels (repeatable; "
                 "replaces the defaults nccl, rccl, msccl, nvshmem, userbuffers)")
      ->allow_extra_args(false);
  app.add_option("--device-map", device_map_texts,
                 "BASELINE:TRACE - compare device BASELINE of the baseline with device TRACE of "
                 "the trace (a baseline traced on another device id; repeatable)")
      ->allow_extra_args(false);
  app.add_option("--json", json_path,
                 "Also write the full report (every bubble) as JSON ('-': stdout, instead of the "
                 "tables)");
  app.add_option("--max-classes", max_classes, "Bubble classes shown per device")
      ->capture_default_str();
  app.add_option("--max-kernels", max_kernels, "Kernels shown in the interference table")
      ->capture_default_str();
  app.add_option("--bubbles", max_bubbles,
                 "Also list the first N bubbles of each device, iteration by iteration");
  app.add_flag("--per-rank", per_rank,
               "With several ranks: also print each rank's full report after the summary");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help or the usage error
    return code == 0 ? 0 : 2;
  }

  try {
    // An explicitly requested marker must be there; the default one is used when present.
    options.iteration_marker_required = marker->count() > 0;
    read_options.max_value_bytes = max_value_mib << 20;
    if (!options.iteration_marker.empty()) {
      import_options.marker_prefixes.push_back(options.iteration_marker);
    }
    if (!comm_names.empty()) import_options.comm_name_patterns = comm_names;
    if (!memory_bytes(device_memory_gb, 1073741824.0, &options.device_memory_bytes)) {
      return usage_error(fmt::format("--device-memory-gb {} is beyond 8388608 GiB (2^53 bytes)",
                                     device_memory_gb));
    }
    if (!memory_bytes(item_memory_mb, 1048576.0, &options.item_memory_bytes)) {
      return usage_error(fmt::format("--item-memory-mb {} is beyond 2^33 MiB (2^53 bytes)",
                                     item_memory_mb));
    }
    std::vector<std::pair<int, int>> device_map;
    for (const std::string& text : device_map_texts) {
      std::pair<int, int> pair;
      if (!parse_device_pair(text, &pair)) {
        return usage_error(fmt::format("--device-map '{}': expected BASELINE:TRACE, two device "
                                       "ids >= 0 (e.g. 3:0)", text));
      }
      device_map.push_back(pair);
    }
    if (!device_map.empty() && baseline_path.empty()) {
      return usage_error("--device-map renumbers the baseline's devices: it needs --baseline");
    }
    if (const pfResult_t r = validate_options(options); r != pfSuccess) return report_error(r);

    // The traces: files, stdin, or the files of folders.
    std::vector<std::string> files;
    bool several = trace_paths.size() > 1;
    for (const std::string& path : trace_paths) {
      if (io::is_directory(path)) {
        std::vector<std::string> in_folder;
        if (const pfResult_t r = io::list_trace_folder(path, &in_folder); r != pfSuccess) {
          return report_error(r);
        }
        files.insert(files.end(), in_folder.begin(), in_folder.end());
        several = true;
      } else {
        files.push_back(path);
      }
    }
    if (several && !baseline_path.empty()) {
      return usage_error("--baseline compares one trace with its baseline; give a single trace");
    }
    const std::vector<int> devices = device ? std::vector<int>{*device} : std::vector<int>{};

    if (!several) {
      CompactTrace trace;
      if (const pfResult_t r = io::read_trace_file(files.front(), import_options, &trace, read_options);
          r != pfSuccess) {
        return report_error(r);
      }
      CompactTrace baseline;
      if (!baseline_path.empty()) {
        if (const pfResult_t r = io::read_trace_file(baseline_path, import_options, &baseline, read_options);
            r != pfSuccess) {
          return report_error(r);
        }
        if (const pfResult_t r = remap_devices(device_map, &baseline); r != pfSuccess) {
          return report_error(r);
        }
      }
      TraceReport report;
      const pfResult_t r = build_report(trace, baseline_path.empty() ? nullptr : &baseline,
                                        devices, options, &report);
      if (r != pfSuccess) return report_error(r);
      if (json_path != "-") {
        std::fputs(format_report(report, max_classes, max_kernels, max_bubbles).c_str(), stdout);
      }
      if (!json_path.empty()) {
        const std::string text = to_text(report_to_json(report));
        if (json_path == "-") {
          std::fputs(text.c_str(), stdout);
        } else {
          std::ofstream out(json_path, std::ios::binary);
          out << text;
          if (!out.good()) {
            std::fprintf(stderr, "pipefill-analyze: cannot write '%s'\n", json_path.c_str());
            return 1;
          }
        }
      }
      return 0;
    }

    // Several ranks: read, analyse and drop each trace's records in turn.
    std::vector<TraceReport> reports;
    for (size_t i = 0; i < files.size(); ++i) {
      CompactTrace trace;
      if (const pfResult_t r = io::read_trace_file(files[i], import_options, &trace, read_options);
          r != pfSuccess) {
        return report_error(r);
      }
      if (trace.rank < 0) trace.rank = rank_from_file_name(files[i]);
      if (trace.rank < 0) trace.rank = static_cast<int>(i);
      TraceReport report;
      if (const pfResult_t r = build_report(trace, nullptr, devices, options, &report);
          r != pfSuccess) {
        return report_error(r);
      }
      reports.push_back(std::move(report));
    }
    std::stable_sort(reports.begin(), reports.end(),
                     [](const TraceReport& a, const TraceReport& b) { return a.rank < b.rank; });
    const CrossRankSummary summary = summarize_ranks(reports);
    if (json_path != "-") {
      std::string text = format_ranks(reports, summary);
      if (per_rank) {
        for (const TraceReport& report : reports) {
          text += "\n" + format_report(report, max_classes, max_kernels, max_bubbles);
        }
      }
      std::fputs(text.c_str(), stdout);
    }
    if (!json_path.empty()) {
      const std::string text = to_text(ranks_to_json(reports, summary));
      if (json_path == "-") {
        std::fputs(text.c_str(), stdout);
      } else {
        std::ofstream out(json_path, std::ios::binary);
        out << text;
        if (!out.good()) {
          std::fprintf(stderr, "pipefill-analyze: cannot write '%s'\n", json_path.c_str());
          return 1;
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipefill-analyze: internal error: %s\n", e.what());
    return 1;
  }
}
