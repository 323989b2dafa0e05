#include "analysis/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <set>

#include <fmt/ranges.h>

#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

using json = nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB); }
// Bytes with a unit that keeps a few significant digits (MiB below 1 GiB).
std::string bytes_text(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= kGiB) return fmt::format("{:.2f} GiB", b / kGiB);
  return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
}
std::string ms(double us) { return fmt::format("{:.3f}", us / 1000.0); }
std::string pct(double share) { return fmt::format("{:.1f}%", share * 100.0); }

json summary_json(const Summary& s) {
  return {{"count", s.count}, {"sum", s.sum}, {"mean", s.mean}, {"min", s.min},
          {"p10", s.p10},     {"p50", s.p50}, {"p90", s.p90},   {"max", s.max}};
}

json memory_json(const MemoryRange& m) {
  if (!m.known) return nullptr;
  return {{"min_bytes", m.min_bytes}, {"max_bytes", m.max_bytes}};
}

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string class_kind(const BubbleClass& c) {
  // The largest summed share, marked when the occurrences' labels disagree.
  const size_t kinds = (c.idle > 0) + (c.comm_only > 0) + (c.copy > 0);
  const char* dominant = bubble_kind_name(c.kind());
  return kinds > 1 ? fmt::format("{}*", dominant) : dominant;
}

std::string percent_of(double part, double whole) {
  return whole > 0.0 ? pct(part / whole) : std::string("-");
}

void format_bubbles(std::string& s, const DeviceAnalysis& d, size_t max_rows) {
  s += fmt::format("  {:<20} {:>6} {:>12} {:>10} {:>10} {:<10} {:>6} {:>6} {:>6} {:>9} {:>9}\n",
                   "iteration", "class", "start_ms", "offset_ms", "dur_us", "kind", "idle", "comm",
                   "copy", "fill_us", "delay_us");
  for (size_t i = 0; i < d.bubbles.size() && i < max_rows; ++i) {
    const Bubble& b = d.bubbles[i];
    const std::string iteration =
        b.iteration >= 0 ? d.iterations[static_cast<size_t>(b.iteration)].label : "-";
    const std::string label =
        b.class_index >= 0 && static_cast<size_t>(b.class_index) < d.classes.size()
            ? d.classes[static_cast<size_t>(b.class_index)].label
            : "-";
    s += fmt::format(
        "  {:<20} {:>6} {:>12} {:>10} {:>10.1f} {:<10} {:>6.0f}% {:>5.0f}% {:>5.0f}% {:>9.1f} {:>9}\n",
        iteration, label, ms(b.start_us - d.span_start_us),
        b.iteration >= 0 ? ms(b.offset_us) : "-", b.duration_us(), bubble_kind_name(b.kind),
        b.share(BubbleKind::Idle) * 100.0, b.share(BubbleKind::CommOnly) * 100.0,
        b.share(BubbleKind::Copy) * 100.0, b.fill_us,
        std::isfinite(b.start_delay_us) ? fmt::format("{:.1f}", b.start_delay_us) : "-");
  }
  if (d.bubbles.size() > max_rows) {
    s += fmt::format("  ... {} more bubbles (see --json)\n", d.bubbles.size() - max_rows);
  }
}

void format_device(std::string& s, const DeviceAnalysis& d, uint64_t device_memory,
                   const AnalysisOptions& o, size_t max_class_rows, size_t max_bubble_rows) {
  s += fmt::format("\nDevice {}: {} compute, {} comm, {} fill kernels over {} ms\n", d.device,
                   d.compute_kernels, d.comm_kernels, d.fill_kernels, ms(d.span_us()));
  s += fmt::format("  bubbles >= {} us: {}, {} ms = {} of the span (idle {} ms, comm-only {} ms, "
                   "copy {} ms)\n",
                   o.min_gap_us, d.bubbles.size(), ms(d.bubble_us), pct(d.bubble_share),
                   ms(d.idle_bubble_us), ms(d.comm_only_bubble_us), ms(d.copy_bubble_us));
  if (!d.bubbles.empty()) {
    s += fmt::format("  bubble time: {} idle, {} comm-only, {} copy; labelled by the largest "
                     "share: {} idle, {} comm-only, {} copy\n",
                     percent_of(d.idle_bubble_us, d.bubble_us),
                     percent_of(d.comm_only_bubble_us, d.bubble_us),
                     percent_of(d.copy_bubble_us, d.bubble_us), d.idle_bubbles,
                     d.comm_only_bubbles, d.copy_bubbles);
  }
  if (d.fill_kernels > 0) {
    s += fmt::format("  fill kernels cover {} ms = {} of the bubbles; {} ms of fill ran outside "
                     "bubbles (overrun or alongside main-job compute)\n",
                     ms(d.fill_in_bubbles_us),
                     pct(d.bubble_us > 0 ? d.fill_in_bubbles_us / d.bubble_us : 0.0),
                     ms(d.fill_outside_bubbles_us));
  }
  s += fmt::format("  iterations: {} ({}{}), mean {} ms, bubbles {} ms per iteration = {}\n",
                   d.iterations.size(), iteration_source_name(d.iteration_source),
                   d.iteration_source == IterationSource::Markers
                       ? (d.host_markers ? ", host-side" : ", GPU-side")
                       : "",
                   ms(d.mean_iteration_us), ms(d.bubble_us_per_iteration),
                   pct(d.iteration_bubble_share));
  if (d.start_delay.count > 0) {
    s += fmt::format("  start delay after the awaited comm/copy ends (comm-only and copy bubbles): "
                     "n={} p50 {:.1f} us, p90 {:.1f} us, max {:.1f} us\n",
                     d.start_delay.count, d.start_delay.p50, d.start_delay.p90, d.start_delay.max);
  }
  if (d.memory_known) {
    s += fmt::format("  memory in use: peak {} ({}); device memory {}\n",
                     bytes_text(d.memory_peak_bytes),
                     d.memory_absolute ? "absolute" : "lower bound: allocations during the trace",
                     device_memory > 0 ? bytes_text(static_cast<int64_t>(device_memory))
                                       : std::string("unknown (--device-memory-gb)"));
  }
  const FillEstimate& f = d.fill;
  s += fmt::format("  fill estimate (p{:g} prediction, margin {} us + {}): {} ms fillable per "
                   "iteration = {} of the iteration, {} of its bubble time\n",
                   o.quantile * 100.0, o.safety_margin_us, pct(o.safety_margin_fraction),
                   ms(f.fillable_us_per_iteration), pct(f.fillable_share), pct(f.fill_efficiency));
  if (f.items_estimated) {
    s += fmt::format("  items of {} us x {} at once: {:.1f} per iteration, {:.1f} items/s = {} of "
                     "a dedicated GPU\n",
                     o.item_cost_us, o.item_parallelism, f.items_per_iteration, f.items_per_second,
                     pct(f.dedicated_gpu_share));
  }
  if (!d.classes.empty()) {
    s += fmt::format("  {:>8} {:>6} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} "
                     "{:>8} {:>7}\n",
                     "class", "count", "kind", "offset_ms", "mean_us", "p10_us", "p50_us", "p90_us",
                     "usable_us", "mem_gib", "free_gib", "items", "filled");
    for (size_t i = 0; i < d.classes.size() && i < max_class_rows; ++i) {
      const BubbleClass& c = d.classes[i];
      s += fmt::format(
          "  {:>8} {:>6} {:<10} {:>10} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>9} "
          "{:>9} {:>8} {:>7}\n",
          c.label, c.duration.count, class_kind(c), ms(c.offset.mean), c.duration.mean,
          c.duration.p10, c.duration.p50, c.duration.p90, c.usable_us,
          c.memory.known ? gib(c.memory.max_bytes) : "-",
          c.free_bytes >= 0 ? gib(c.free_bytes) : "-",
          f.items_estimated ? fmt::format("{:.0f}", c.items_per_occurrence) : "-",
          c.duration.sum > 0.0 && d.fill_kernels > 0 ? pct(c.fill_us / c.duration.sum) : "-");
    }
    if (d.classes.size() > max_class_rows) {
      s += fmt::format("  ... {} more classes (see --json)\n", d.classes.size() - max_class_rows);
    }
  }
  if (max_bubble_rows > 0 && !d.bubbles.empty()) format_bubbles(s, d, max_bubble_rows);
}

void format_interference(std::string& s, const InterferenceAnalysis& a, size_t max_kernel_rows) {
  s += fmt::format("\nInterference on device {} (filled vs baseline)\n", a.device);
  s += fmt::format("  main-job kernels: {} baseline, {} filled, {} matched by name and order\n",
                   a.baseline_kernels, a.filled_kernels, a.matched_kernels);
  s += fmt::format("  compute: {} ms -> {} ms, slowdown {:+.2f}%\n", ms(a.compute_baseline_us),
                   ms(a.compute_filled_us), (a.compute_slowdown - 1.0) * 100.0);
  s += fmt::format("  comm (includes waiting): {} ms -> {} ms, {:+.2f}%\n", ms(a.comm_baseline_us),
                   ms(a.comm_filled_us), (a.comm_slowdown - 1.0) * 100.0);
  s += fmt::format("  iteration: {} ms -> {} ms, {:+.2f}%\n", ms(a.baseline_iteration_us),
                   ms(a.filled_iteration_us), (a.iteration_slowdown - 1.0) * 100.0);
  s += fmt::format("  start delay after bubble: p50 {:.1f} -> {:.1f} us, p90 {:.1f} -> {:.1f} us, "
                   "max {:.1f} -> {:.1f} us\n",
                   a.baseline_start_delay.p50, a.filled_start_delay.p50, a.baseline_start_delay.p90,
                   a.filled_start_delay.p90, a.baseline_start_delay.max, a.filled_start_delay.max);
  if (a.filled_bubble_us > 0.0) {
    s += fmt::format("  fill kernels cover {} of the filled trace's bubbles\n",
                     pct(a.fill_in_bubbles_us / a.filled_bubble_us));
  }
  if (!a.kernels.empty()) {
    s += fmt::format("  {:>8} {:>12} {:>12} {:>9}  {}\n", "matched", "base_us", "filled_us",
                     "slowdown", "kernel");
    for (size_t i = 0; i < a.kernels.size() && i < max_kernel_rows; ++i) {
      const KernelSlowdown& k = a.kernels[i];
      s += fmt::format("  {:>8} {:>12.1f} {:>12.1f} {:>+8.2f}%  {}\n", k.matched, k.baseline_us,
                       k.filled_us, (k.slowdown() - 1.0) * 100.0, k.name);
    }
  }
}

}  // namespace

pfResult_t build_report(const CompactTrace& trace, const CompactTrace* baseline,
                        const std::vector<int>& devices, const AnalysisOptions& options,
                        TraceReport* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "build_report: out is null");
  TraceAnalyzer analyzer(trace);
  std::unique_ptr<TraceAnalyzer> base_analyzer;
  if (baseline != nullptr) base_analyzer = std::make_unique<TraceAnalyzer>(*baseline);
  const std::vector<int>& chosen = devices.empty() ? analyzer.analysable_devices() : devices;
  if (chosen.empty()) {
    return fail(pfErrorInvalidArgument,
                "{}: no device with compute kernels or PipeFill bubble markers to analyse",
                trace.source);
  }
  TraceReport report;
  report.source = trace.source;
  report.rank = trace.rank;
  report.record_count = trace.records.size();
  report.baseline_source = baseline != nullptr ? baseline->source : std::string();
  report.options = options;
  for (const int device : chosen) {
    AnalysisOptions device_options = options;
    if (device_options.device_memory_bytes == 0) {
      const auto it = trace.device_memory_bytes.find(device);
      if (it != trace.device_memory_bytes.end()) device_options.device_memory_bytes = it->second;
    }
    DeviceAnalysis d;
    PF_TRY(analyzer.analyze(device, device_options, &d));
    report.devices.push_back(std::move(d));
    report.device_memory_bytes.push_back(device_options.device_memory_bytes);
    if (base_analyzer != nullptr) {
      InterferenceAnalysis i;
      PF_TRY(compare_traces(*base_analyzer, analyzer, device, device_options, &i));
      report.interference.push_back(std::move(i));
    }
  }
  *out = std::move(report);
  return pfSuccess;
}

pfResult_t build_report(const std::string& source, const std::vector<ActivityRecord>& records,
                        const std::string& baseline_source,
                        const std::vector<ActivityRecord>* baseline, const std::vector<int>& devices,
                        const AnalysisOptions& options, TraceReport* out,
                        const std::map<int, uint64_t>& device_memory) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "build_report: out is null");
  if (devices.empty()) {
    return fail(pfErrorInvalidArgument,
                "{}: no device with compute kernels or PipeFill bubble markers to analyse", source);
  }
  CompactTrace trace = compact_from_activity(records, source);
  trace.device_memory_bytes = device_memory;
  CompactTrace base;
  if (baseline != nullptr) base = compact_from_activity(*baseline, baseline_source);
  return build_report(trace, baseline != nullptr ? &base : nullptr, devices, options, out);
}

pfResult_t remap_devices(const std::vector<std::pair<int, int>>& mapping, CompactTrace* trace) {
  if (trace == nullptr) return fail(pfErrorInvalidArgument, "remap_devices: trace is null");
  std::map<int, int> to_of;
  for (const auto& [from, to] : mapping) {
    if (from < 0 || to < 0) {
      return fail(pfErrorInvalidArgument, "--device-map {}:{}: device ids must be >= 0", from, to);
    }
    if (!to_of.emplace(from, to).second) {
      return fail(pfErrorInvalidArgument, "--device-map: device {} is mapped twice", from);
    }
  }
  std::set<int> present;
  for (const TraceRecord& r : trace->records) {
    if (r.device != kHostDevice) present.insert(r.device);
  }
  for (const auto& [from, to] : to_of) {
    if (present.count(from) == 0) {
      return fail(pfErrorInvalidArgument, "--device-map {}:{}: {} has no records of device {} "
                  "(devices: [{}])", from, to, trace->source, from, fmt::join(present, ", "));
    }
    // A target that keeps its own records would mix two devices' timelines.
    if (present.count(to) != 0 && to_of.count(to) == 0 && from != to) {
      return fail(pfErrorInvalidArgument,
                  "--device-map {}:{}: {} already has records of device {}; map that one away "
                  "too (e.g. --device-map {}:{})",
                  from, to, trace->source, to, to, from);
    }
  }
  for (TraceRecord& r : trace->records) {
    const auto it = to_of.find(r.device);
    if (it != to_of.end()) r.device = it->second;
  }
  // Built anew: renumbering in place would let a swap (0:1 with 1:0) overwrite an entry.
  std::map<int, uint64_t> memory;
  for (const auto& [device, bytes] : trace->device_memory_bytes) {
    const auto it = to_of.find(device);
    if (it == to_of.end()) {
      memory.emplace(device, bytes);  // a target's own entry yields to the remapped one below
    }
  }
  for (const auto& [device, bytes] : trace->device_memory_bytes) {
    const auto it = to_of.find(device);
    if (it != to_of.end()) memory[it->second] = bytes;
  }
  trace->device_memory_bytes = std::move(memory);
  return pfSuccess;
}

std::string format_report(const TraceReport& report, size_t max_class_rows,
                          size_t max_kernel_rows, size_t max_bubble_rows) {
  const AnalysisOptions& o = report.options;
  std::string s = fmt::format("Trace {} ({} records)\n", report.source, report.record_count);
  s += fmt::format("\n{:>6} {:>10} {:>8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>6} {:>9} {:>10} "
                   "{:>12}\n",
                   "device", "span_ms", "bubbles", "bubble_ms", "share", "idle_ms", "comm_ms",
                   "copy_ms", "iters", "iter_ms", "bubble/it", "fillable/it");
  for (const DeviceAnalysis& d : report.devices) {
    s += fmt::format("{:>6} {:>10} {:>8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>6} {:>9} {:>10} {:>12}\n",
                     d.device, ms(d.span_us()), d.bubbles.size(), ms(d.bubble_us),
                     pct(d.bubble_share), ms(d.idle_bubble_us), ms(d.comm_only_bubble_us),
                     ms(d.copy_bubble_us), d.iterations.size(), ms(d.mean_iteration_us),
                     ms(d.bubble_us_per_iteration), ms(d.fill.fillable_us_per_iteration));
  }
  for (size_t i = 0; i < report.devices.size(); ++i) {
    format_device(s, report.devices[i],
                  i < report.device_memory_bytes.size() ? report.device_memory_bytes[i] : 0, o,
                  max_class_rows, max_bubble_rows);
  }
  for (const InterferenceAnalysis& a : report.interference) {
    format_interference(s, a, max_kernel_rows);
  }
  bool first_note = true;
  auto add_notes = [&](const std::vector<std::string>& notes) {
    for (const std::string& n : notes) {
      if (first_note) s += "\nNotes:\n";
      first_note = false;
      s += fmt::format("  - {}\n", n);
    }
  };
  for (const DeviceAnalysis& d : report.devices) add_notes(d.notes);
  for (const InterferenceAnalysis& a : report.interference) add_notes(a.notes);
  return s;
}

json report_to_json(const TraceReport& report) {
  const AnalysisOptions& o = report.options;
  json root;
  root["source"] = report.source;
  root["rank"] = report.rank;
  root["record_count"] = report.record_count;
  root["options"] = {{"min_gap_us", o.min_gap_us},
                     {"iteration_period_us", o.iteration_period_us},
                     {"iteration_origin_us", number_or_null(o.iteration_origin_us)},
                     {"iteration_marker", o.iteration_marker},
                     {"device_memory_bytes", o.device_memory_bytes},
                     {"quantile", o.quantile},
                     {"safety_margin_us", o.safety_margin_us},
                     {"safety_margin_fraction", o.safety_margin_fraction},
                     {"item_cost_us", o.item_cost_us},
                     {"item_parallelism", o.item_parallelism},
                     {"item_memory_bytes", o.item_memory_bytes}};
  json devices = json::array();
  for (size_t index = 0; index < report.devices.size(); ++index) {
    const DeviceAnalysis& d = report.devices[index];
    json j;
    j["device"] = d.device;
    j["device_memory_bytes"] =
        index < report.device_memory_bytes.size() ? report.device_memory_bytes[index] : 0;
    j["explicit_bubbles"] = d.explicit_bubbles;
    j["span_start_us"] = d.span_start_us;
    j["span_end_us"] = d.span_end_us;
    j["compute_kernels"] = d.compute_kernels;
    j["comm_kernels"] = d.comm_kernels;
    j["fill_kernels"] = d.fill_kernels;
    j["compute_busy_us"] = d.compute_busy_us;
    j["bubble_us"] = d.bubble_us;
    j["idle_bubble_us"] = d.idle_bubble_us;
    j["comm_only_bubble_us"] = d.comm_only_bubble_us;
    j["copy_bubble_us"] = d.copy_bubble_us;
    j["bubbles_by_label"] = {{"idle", d.idle_bubbles},
                             {"comm_only", d.comm_only_bubbles},
                             {"copy", d.copy_bubbles}};
    j["process"] = d.process;
    j["host_markers"] = d.host_markers;
    j["fill_in_bubbles_us"] = d.fill_in_bubbles_us;
    j["fill_busy_us"] = d.fill_busy_us;
    j["fill_outside_bubbles_us"] = d.fill_outside_bubbles_us;
    j["bubble_share"] = d.bubble_share;
    j["start_delay_us"] = summary_json(d.start_delay);
    j["iteration_source"] = iteration_source_name(d.iteration_source);
    j["mean_iteration_us"] = d.mean_iteration_us;
    j["bubble_us_per_iteration"] = d.bubble_us_per_iteration;
    j["iteration_bubble_share"] = d.iteration_bubble_share;
    json iterations = json::array();
    for (const Iteration& it : d.iterations) {
      iterations.push_back({{"label", it.label}, {"start_us", it.start_us}, {"end_us", it.end_us},
                            {"bubble_count", it.bubble_count}, {"bubble_us", it.bubble_us}});
    }
    j["iterations"] = std::move(iterations);
    json classes = json::array();
    for (const BubbleClass& c : d.classes) {
      classes.push_back({{"index", c.index},
                         {"label", c.label},
                         {"fill_us", c.fill_us},
                         {"duration_us", summary_json(c.duration)},
                         {"offset_us", summary_json(c.offset)},
                         {"kind", bubble_kind_name(c.kind())},
                         {"idle", c.idle},
                         {"comm_only", c.comm_only},
                         {"copy", c.copy},
                         {"idle_us", c.idle_us},
                         {"comm_only_us", c.comm_only_us},
                         {"copy_us", c.copy_us},
                         {"memory_in_use", memory_json(c.memory)},
                         {"free_bytes", c.free_bytes >= 0 ? json(c.free_bytes) : json(nullptr)},
                         {"occurrence", c.occurrence},
                         {"predicted_us", c.predicted_us},
                         {"usable_us", c.usable_us},
                         {"item_slots", c.item_slots},
                         {"items_per_occurrence", c.items_per_occurrence}});
    }
    j["classes"] = std::move(classes);
    json bubbles = json::array();
    for (const Bubble& b : d.bubbles) {
      bubbles.push_back({{"start_us", b.start_us},
                         {"end_us", b.end_us},
                         {"kind", bubble_kind_name(b.kind)},
                         {"idle_us", b.idle_us},
                         {"comm_only_us", b.comm_only_us},
                         {"copy_us", b.copy_us},
                         {"comm_us", b.comm_us},
                         {"fill_us", b.fill_us},
                         {"wake_us", number_or_null(b.wake_us)},
                         {"start_delay_us", number_or_null(b.start_delay_us)},
                         {"iteration", b.iteration},
                         {"class", b.class_index},
                         {"memory_in_use", memory_json(b.memory)}});
    }
    j["bubbles"] = std::move(bubbles);
    j["memory"] = {{"known", d.memory_known},
                   {"absolute", d.memory_absolute},
                   {"peak_bytes", d.memory_peak_bytes}};
    j["fill_estimate"] = {{"fillable_us_per_iteration", d.fill.fillable_us_per_iteration},
                          {"fillable_share", d.fill.fillable_share},
                          {"fill_efficiency", d.fill.fill_efficiency},
                          {"items_estimated", d.fill.items_estimated},
                          {"items_per_iteration", d.fill.items_per_iteration},
                          {"items_per_second", d.fill.items_per_second},
                          {"dedicated_gpu_share", d.fill.dedicated_gpu_share}};
    j["notes"] = d.notes;
    devices.push_back(std::move(j));
  }
  root["devices"] = std::move(devices);
  if (!report.baseline_source.empty()) {
    json interference = json::array();
    for (const InterferenceAnalysis& a : report.interference) {
      json kernels = json::array();
      for (const KernelSlowdown& k : a.kernels) {
        kernels.push_back({{"name", k.name},
                           {"kind", activity_kind_name(k.kind)},
                           {"matched", k.matched},
                           {"baseline_us", k.baseline_us},
                           {"filled_us", k.filled_us},
                           {"slowdown", k.slowdown()}});
      }
      interference.push_back({{"device", a.device},
                              {"baseline_kernels", a.baseline_kernels},
                              {"filled_kernels", a.filled_kernels},
                              {"matched_kernels", a.matched_kernels},
                              {"compute_baseline_us", a.compute_baseline_us},
                              {"compute_filled_us", a.compute_filled_us},
                              {"compute_slowdown", a.compute_slowdown},
                              {"comm_baseline_us", a.comm_baseline_us},
                              {"comm_filled_us", a.comm_filled_us},
                              {"comm_slowdown", a.comm_slowdown},
                              {"baseline_start_delay_us", summary_json(a.baseline_start_delay)},
                              {"filled_start_delay_us", summary_json(a.filled_start_delay)},
                              {"baseline_iteration_us", a.baseline_iteration_us},
                              {"filled_iteration_us", a.filled_iteration_us},
                              {"iteration_slowdown", a.iteration_slowdown},
                              {"fill_in_bubbles_us", a.fill_in_bubbles_us},
                              {"filled_bubble_us", a.filled_bubble_us},
                              {"kernels", std::move(kernels)},
                              {"notes", a.notes}});
    }
    root["baseline_source"] = report.baseline_source;
    root["interference"] = std::move(interference);
  }
  return root;
}

}  // namespace pipefill::analysis

namespace pipefill::analysis {

CrossRankSummary summarize_ranks(const std::vector<TraceReport>& reports) {
  CrossRankSummary s;
  s.ranks = reports.size();
  std::vector<double> shares;
  for (const TraceReport& r : reports) {
    for (const DeviceAnalysis& d : r.devices) {
      ++s.devices;
      shares.push_back(d.bubble_share);
      if (shares.size() == 1 || d.bubble_share < s.share_min) {
        s.share_min = d.bubble_share;
        s.rank_min = r.rank;
      }
      if (shares.size() == 1 || d.bubble_share > s.share_max) {
        s.share_max = d.bubble_share;
        s.rank_max = r.rank;
      }
      s.bubble_us += d.bubble_us;
      s.span_us += d.span_us();
      s.idle_us += d.idle_bubble_us;
      s.comm_only_us += d.comm_only_bubble_us;
      s.copy_us += d.copy_bubble_us;
      s.iteration_min_us = shares.size() == 1 ? d.mean_iteration_us
                                              : std::min(s.iteration_min_us, d.mean_iteration_us);
      s.iteration_max_us = std::max(s.iteration_max_us, d.mean_iteration_us);
    }
  }
  if (!shares.empty()) {
    const Summary summary = summarize(shares);
    s.share_mean = summary.mean;
    s.share_median = summary.p50;
  }
  s.overall_share = s.span_us > 0.0 ? s.bubble_us / s.span_us : 0.0;
  return s;
}

std::string format_ranks(const std::vector<TraceReport>& reports, const CrossRankSummary& summary) {
  std::string s = fmt::format("{} rank traces\n\n", reports.size());
  s += fmt::format("{:>5} {:>6} {:>10} {:>8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>6} {:>9} {:>12}  {}\n",
                   "rank", "device", "span_ms", "bubbles", "bubble_ms", "share", "idle_ms",
                   "comm_ms", "copy_ms", "iters", "iter_ms", "fillable/it", "trace");
  for (const TraceReport& r : reports) {
    for (const DeviceAnalysis& d : r.devices) {
      s += fmt::format(
          "{:>5} {:>6} {:>10} {:>8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>6} {:>9} {:>12}  {}\n",
          r.rank, d.device, ms(d.span_us()), d.bubbles.size(), ms(d.bubble_us),
          pct(d.bubble_share), ms(d.idle_bubble_us), ms(d.comm_only_bubble_us),
          ms(d.copy_bubble_us), d.iterations.size(), ms(d.mean_iteration_us),
          ms(d.fill.fillable_us_per_iteration), r.source);
    }
  }
  s += fmt::format(
      "\nAcross {} ranks ({} devices): bubble share min {} (rank {}), median {}, mean {}, max {} "
      "(rank {}); all ranks together {} ms of {} ms = {} (idle {} ms, comm-only {} ms, copy {} "
      "ms); mean iteration {} to {} ms\n",
      summary.ranks, summary.devices, pct(summary.share_min), summary.rank_min,
      pct(summary.share_median), pct(summary.share_mean), pct(summary.share_max), summary.rank_max,
      ms(summary.bubble_us), ms(summary.span_us), pct(summary.overall_share), ms(summary.idle_us),
      ms(summary.comm_only_us), ms(summary.copy_us), ms(summary.iteration_min_us),
      ms(summary.iteration_max_us));
  bool first_note = true;
  for (const TraceReport& r : reports) {
    for (const DeviceAnalysis& d : r.devices) {
      for (const std::string& n : d.notes) {
        if (first_note) s += "\nNotes:\n";
        first_note = false;
        s += fmt::format("  - rank {}: {}\n", r.rank, n);
      }
    }
  }
  return s;
}

nlohmann::json ranks_to_json(const std::vector<TraceReport>& reports,
                             const CrossRankSummary& summary) {
  json ranks = json::array();
  for (const TraceReport& r : reports) ranks.push_back(report_to_json(r));
  return {{"ranks", std::move(ranks)},
          {"summary",
           {{"ranks", summary.ranks},
            {"devices", summary.devices},
            {"bubble_share_min", summary.share_min},
            {"bubble_share_median", summary.share_median},
            {"bubble_share_mean", summary.share_mean},
            {"bubble_share_max", summary.share_max},
            {"rank_min", summary.rank_min},
            {"rank_max", summary.rank_max},
            {"bubble_us", summary.bubble_us},
            {"span_us", summary.span_us},
            {"bubble_share", summary.overall_share},
            {"idle_bubble_us", summary.idle_us},
            {"comm_only_bubble_us", summary.comm_only_us},
            {"copy_bubble_us", summary.copy_us},
            {"mean_iteration_min_us", summary.iteration_min_us},
            {"mean_iteration_max_us", summary.iteration_max_us}}}};
}

int rank_from_file_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  auto number_at = [&](size_t begin) {
    size_t end = begin;
    while (end < base.size() && is_digit(base[end])) ++end;
    if (end == begin || end - begin > 9) return -1;  // none, or not a rank
    return std::stoi(base.substr(begin, end - begin));
  };
  // "rank" followed by digits (any case, a separator allowed): "trace_rank_12_step_3.json".
  std::string lower = base;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (size_t at = lower.find("rank"); at != std::string::npos; at = lower.find("rank", at + 1)) {
    size_t digits = at + 4;
    if (digits < base.size() && (base[digits] == '-' || base[digits] == '_' || base[digits] == '.')) {
      ++digits;
    }
    if (digits < base.size() && is_digit(base[digits])) return number_at(digits);
  }
  // Otherwise the last run of digits in the base name.
  size_t end = base.size();
  while (end > 0 && !is_digit(base[end - 1])) --end;
  if (end == 0) return -1;
  size_t begin = end;
  while (begin > 0 && is_digit(base[begin - 1])) --begin;
  return end - begin > 9 ? -1 : number_at(begin);
}

}  // namespace pipefill::analysis
