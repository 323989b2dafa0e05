// pipefill-analyze: "how much bubble do we have, and what would filling it give us?" from a
// PyTorch profiler / Kineto Chrome trace (or PipeFill's own trace), before any filling is done;
// with --baseline, how much a filled run slowed the main job down.
//
//   pipefill-analyze trace.json [--baseline base.json] [--device N] [--min-gap-us X]
//       [--iteration-marker ProfilerStep | --iteration-period-us P] [--device-memory-gb G]
//       [--item-cost-us C] [--json out.json]
//
// Exit status: 0 done, 1 the trace could not be read or analysed (message on stderr), 2 usage.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "analysis/chrome_trace.hpp"
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Finds the pipeline bubbles of a training job in a Chrome trace (PyTorch profiler, Kineto,\n"
      "PipeFill) and estimates what filling them would give; with --baseline, compares a filled\n"
      "run with an unfilled one (main-job kernel slowdown, start delay after bubbles).",
      "pipefill-analyze"};

  std::string trace_path;
  std::string baseline_path;
  std::optional<int> device;
  std::string json_path;
  AnalysisOptions options;
  ImportOptions import_options;
  double device_memory_gb = 0.0;
  double item_memory_mb = 0.0;
  size_t max_classes = 32;
  size_t max_kernels = 10;
  size_t max_bubbles = 0;

  app.add_option("trace", trace_path, "Chrome-trace JSON to analyse (the filled run with --baseline)")
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
  app.add_option("--json", json_path,
                 "Also write the full report (every bubble) as JSON ('-': stdout, instead of the "
                 "tables)");
  app.add_option("--max-classes", max_classes, "Bubble classes shown per device")
      ->capture_default_str();
  app.add_option("--max-kernels", max_kernels, "Kernels shown in the interference table")
      ->capture_default_str();
  app.add_option("--bubbles", max_bubbles,
                 "Also list the first N bubbles of each device, iteration by iteration");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help or the usage error
    return code == 0 ? 0 : 2;
  }

  try {
    // An explicitly requested marker must be there; the default one is used when present.
    options.iteration_marker_required = marker->count() > 0;
    if (!options.iteration_marker.empty()) {
      import_options.marker_prefixes.push_back(options.iteration_marker);
    }
    options.device_memory_bytes = static_cast<uint64_t>(std::llround(device_memory_gb * 1073741824.0));
    options.item_memory_bytes = static_cast<uint64_t>(std::llround(item_memory_mb * 1048576.0));
    if (const pfResult_t r = validate_options(options); r != pfSuccess) return report_error(r);

    ImportedTrace trace;
    if (const pfResult_t r = import_chrome_trace_file(trace_path, import_options, &trace);
        r != pfSuccess) {
      return report_error(r);
    }
    ImportedTrace baseline;
    if (!baseline_path.empty()) {
      if (const pfResult_t r = import_chrome_trace_file(baseline_path, import_options, &baseline);
          r != pfSuccess) {
        return report_error(r);
      }
    }
    const std::vector<int> devices =
        device ? std::vector<int>{*device} : analysable_devices(trace.records);
    TraceReport report;
    const pfResult_t r = build_report(trace_path, trace.records, baseline_path,
                                      baseline_path.empty() ? nullptr : &baseline.records,
                                      devices, options, &report, trace.device_memory_bytes);
    if (r != pfSuccess) return report_error(r);

    if (json_path != "-") {
      std::fputs(format_report(report, max_classes, max_kernels, max_bubbles).c_str(), stdout);
    }
    if (!json_path.empty()) {
      const std::string text = report_to_json(report).dump(2) + "\n";
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
