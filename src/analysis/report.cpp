#include "analysis/report.hpp"

#include <fmt/format.h>

#include <cmath>

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
  // The dominant kind, marked when the occurrences disagree.
  const size_t kinds = (c.idle > 0) + (c.comm_only > 0) + (c.copy > 0);
  const char* dominant = c.comm_only >= c.idle && c.comm_only >= c.copy ? "comm-only"
                         : c.idle >= c.copy                              ? "idle"
                                                                         : "copy";
  return kinds > 1 ? fmt::format("{}*", dominant) : dominant;
}

void format_bubbles(std::string& s, const DeviceAnalysis& d, size_t max_rows) {
  s += fmt::format("  {:<20} {:>6} {:>12} {:>10} {:>10} {:<10} {:>9} {:>9} {:>9}\n", "iteration",
                   "class", "start_ms", "offset_ms", "dur_us", "kind", "comm_us", "fill_us",
                   "delay_us");
  for (size_t i = 0; i < d.bubbles.size() && i < max_rows; ++i) {
    const Bubble& b = d.bubbles[i];
    const std::string iteration =
        b.iteration >= 0 ? d.iterations[static_cast<size_t>(b.iteration)].label : "-";
    const std::string label =
        b.class_index >= 0 && static_cast<size_t>(b.class_index) < d.classes.size()
            ? d.classes[static_cast<size_t>(b.class_index)].label
            : "-";
    s += fmt::format("  {:<20} {:>6} {:>12} {:>10} {:>10.1f} {:<10} {:>9.1f} {:>9.1f} {:>9}\n",
                     iteration, label, ms(b.start_us - d.span_start_us),
                     b.iteration >= 0 ? ms(b.offset_us) : "-", b.duration_us(),
                     bubble_kind_name(b.kind), b.comm_us, b.fill_us,
                     std::isfinite(b.wake_us) ? fmt::format("{:.1f}", b.end_us - b.wake_us) : "-");
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
  if (d.fill_kernels > 0) {
    s += fmt::format("  fill kernels cover {} ms = {} of the bubbles; {} ms of fill ran outside "
                     "bubbles (overrun or alongside main-job compute)\n",
                     ms(d.fill_in_bubbles_us),
                     pct(d.bubble_us > 0 ? d.fill_in_bubbles_us / d.bubble_us : 0.0),
                     ms(d.fill_outside_bubbles_us));
  }
  s += fmt::format("  iterations: {} ({}), mean {} ms, bubbles {} ms per iteration = {}\n",
                   d.iterations.size(), iteration_source_name(d.iteration_source),
                   ms(d.mean_iteration_us), ms(d.bubble_us_per_iteration),
                   pct(d.iteration_bubble_share));
  if (d.start_delay.count > 0) {
    s += fmt::format("  start delay after comm/copy ends: n={} p50 {:.1f} us, p90 {:.1f} us, max "
                     "{:.1f} us\n",
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
  TraceReport report;
  report.source = source;
  report.record_count = records.size();
  report.baseline_source = baseline != nullptr ? baseline_source : std::string();
  report.options = options;
  for (const int device : devices) {
    AnalysisOptions device_options = options;
    if (device_options.device_memory_bytes == 0) {
      const auto it = device_memory.find(device);
      if (it != device_memory.end()) device_options.device_memory_bytes = it->second;
    }
    DeviceAnalysis d;
    PF_TRY(analyze_device(records, device, device_options, &d));
    report.devices.push_back(std::move(d));
    report.device_memory_bytes.push_back(device_options.device_memory_bytes);
    if (baseline != nullptr) {
      InterferenceAnalysis i;
      PF_TRY(compare_traces(*baseline, records, device, device_options, &i));
      report.interference.push_back(std::move(i));
    }
  }
  *out = std::move(report);
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
                         {"idle", c.idle},
                         {"comm_only", c.comm_only},
                         {"copy", c.copy},
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
                         {"comm_us", b.comm_us},
                         {"copy_us", b.copy_us},
                         {"fill_us", b.fill_us},
                         {"wake_us", number_or_null(b.wake_us)},
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
