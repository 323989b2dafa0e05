#include "analysis/bubbles.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"

namespace pipefill::analysis {

const char* bubble_kind_name(BubbleKind kind) {
  switch (kind) {
    case BubbleKind::Idle: return "idle";
    case BubbleKind::CommOnly: return "comm-only";
    case BubbleKind::Copy: return "copy";
  }
  return "unknown";
}

const char* iteration_source_name(IterationSource source) {
  switch (source) {
    case IterationSource::WholeTrace: return "whole-trace";
    case IterationSource::Period: return "period";
    case IterationSource::Markers: return "markers";
  }
  return "unknown";
}

namespace {

// Largest device / item memory accepted: 2^53 bytes (8 PiB), exact in a double and far from
// int64 overflow in the free-memory arithmetic.
constexpr uint64_t kMaxMemoryBytes = uint64_t{1} << 53;

// The largest share labels the bubble; ties go to idle, then comm-only.
BubbleKind largest(double idle_us, double comm_only_us, double copy_us) {
  if (idle_us >= comm_only_us && idle_us >= copy_us) return BubbleKind::Idle;
  if (comm_only_us >= copy_us) return BubbleKind::CommOnly;
  return BubbleKind::Copy;
}

}  // namespace

double Bubble::share(BubbleKind k) const {
  const double d = duration_us();
  if (!(d > 0.0)) return 0.0;
  switch (k) {
    case BubbleKind::Idle: return idle_us / d;
    case BubbleKind::CommOnly: return comm_only_us / d;
    case BubbleKind::Copy: return copy_us / d;
  }
  return 0.0;
}

BubbleKind BubbleClass::kind() const { return largest(idle_us, comm_only_us, copy_us); }

pfResult_t validate_options(const AnalysisOptions& o) {
  if (!std::isfinite(o.min_gap_us) || o.min_gap_us < 0.0) {
    return fail(pfErrorInvalidArgument, "min_gap_us must be a finite value >= 0, got {}",
                o.min_gap_us);
  }
  if (o.max_iterations < 1 || o.max_iterations > uint64_t{INT32_MAX}) {
    return fail(pfErrorInvalidArgument, "max_iterations must be in [1, {}], got {}", INT32_MAX,
                o.max_iterations);
  }
  if (!std::isfinite(o.iteration_period_us) || o.iteration_period_us < 0.0) {
    return fail(pfErrorInvalidArgument,
                "iteration_period_us must be >= 0 (0: no fixed period), got {}",
                o.iteration_period_us);
  }
  if (std::isinf(o.iteration_origin_us)) {
    return fail(pfErrorInvalidArgument, "iteration_origin_us must be finite or NaN, got {}",
                o.iteration_origin_us);
  }
  if (!(o.quantile > 0.0 && o.quantile <= 1.0)) {
    return fail(pfErrorInvalidArgument, "quantile must be in (0, 1], got {}", o.quantile);
  }
  if (!std::isfinite(o.safety_margin_us) || o.safety_margin_us < 0.0) {
    return fail(pfErrorInvalidArgument, "safety_margin_us must be >= 0, got {}",
                o.safety_margin_us);
  }
  if (!(o.safety_margin_fraction >= 0.0 && o.safety_margin_fraction < 1.0)) {
    return fail(pfErrorInvalidArgument, "safety_margin_fraction must be in [0, 1), got {}",
                o.safety_margin_fraction);
  }
  if (!std::isfinite(o.item_cost_us) || o.item_cost_us < 0.0) {
    return fail(pfErrorInvalidArgument, "item_cost_us must be >= 0 (0: no item estimate), got {}",
                o.item_cost_us);
  }
  if (o.item_parallelism < 1) {
    return fail(pfErrorInvalidArgument, "item_parallelism must be >= 1, got {}",
                o.item_parallelism);
  }
  if (o.device_memory_bytes > kMaxMemoryBytes) {
    return fail(pfErrorInvalidArgument, "device_memory_bytes must be <= 2^53 (8 PiB), got {}",
                o.device_memory_bytes);
  }
  if (o.item_memory_bytes > kMaxMemoryBytes) {
    return fail(pfErrorInvalidArgument, "item_memory_bytes must be <= 2^53 (8 PiB), got {}",
                o.item_memory_bytes);
  }
  return pfSuccess;
}

std::vector<int> devices_with_compute(const std::vector<ActivityRecord>& records) {
  std::set<int> devices;
  for (const ActivityRecord& r : records) {
    if (r.kind == ActivityKind::Kernel && r.device != kHostDevice) devices.insert(r.device);
  }
  return {devices.begin(), devices.end()};
}

std::vector<int> analysable_devices(const std::vector<ActivityRecord>& records) {
  std::set<int> devices;
  for (const ActivityRecord& r : records) {
    if (r.device == kHostDevice) continue;
    if (r.kind == ActivityKind::Kernel || is_bubble_marker(r)) devices.insert(r.device);
  }
  return {devices.begin(), devices.end()};
}

std::vector<int> analysable_devices(const CompactTrace& trace) {
  return TraceAnalyzer(trace).analysable_devices();
}

namespace {

bool is_bubble_marker(const CompactTrace& trace, const TraceRecord& r) {
  return r.kind == ActivityKind::Marker &&
         trace.name_of(r).substr(0, std::string_view(kBubbleMarkerPrefix).size()) ==
             kBubbleMarkerPrefix;
}

bool has_prefix(std::string_view name, const std::string& prefix) {
  return !prefix.empty() && name.substr(0, prefix.size()) == prefix;
}

struct BubbleMarker {
  Interval interval;
  std::string class_key;
};

// A step from markers: `name` (NameTable id) from start to the end of its marker.
struct StepSpan {
  uint32_t name;
  double start_us;
  double end_us;
};

// Steps from marker spans: spans with the same name that overlap are one step (PyTorch
// annotates each stream with the step's own span); the same name again later (a marker without a
// step number, e.g. "train_step") is the next step. Sorted by start (ties by name).
std::vector<StepSpan> steps_from_spans(const CompactTrace& trace, std::vector<StepSpan> spans) {
  std::sort(spans.begin(), spans.end(), [](const StepSpan& a, const StepSpan& b) {
    return a.name != b.name ? a.name < b.name : a.start_us < b.start_us;
  });
  std::vector<StepSpan> steps;
  for (const StepSpan& span : spans) {
    if (!steps.empty() && steps.back().name == span.name && span.start_us < steps.back().end_us) {
      steps.back().end_us = std::max(steps.back().end_us, span.end_us);
    } else {
      steps.push_back(span);
    }
  }
  std::sort(steps.begin(), steps.end(), [&](const StepSpan& a, const StepSpan& b) {
    if (a.start_us != b.start_us) return a.start_us < b.start_us;
    return trace.names.name(a.name) < trace.names.name(b.name);
  });
  return steps;
}

// Host step markers of one process.
struct HostGroup {
  std::vector<StepSpan> steps;                                  // sorted by start
  std::unordered_map<uint32_t, std::vector<uint32_t>> by_name;  // indices into steps, ascending
};

// Iterations from `steps`: step i runs from its start to the next step's start; the last ends
// with its marker, except that a host marker (the CPU runs ahead) or an empty one extends to the
// device's last kernel. Only iterations overlapping [span_start, span_end) are kept; they are
// found by binary search, so a device reads only the steps that overlap it.
void iterations_from_steps(const CompactTrace& trace, const std::vector<StepSpan>& steps,
                           bool host, double span_start, double span_end,
                           std::vector<Iteration>* out) {
  const size_t n = steps.size();
  auto end_of = [&](size_t i) {
    if (i + 1 < n) return steps[i + 1].start_us;
    double end = steps[i].end_us;
    if (host || end <= steps[i].start_us) end = std::max(end, span_end);
    return end;
  };
  // Ends are non-decreasing in i: the first iteration ending after span_start.
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (end_of(mid) > span_start) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  for (size_t i = lo; i < n && steps[i].start_us < span_end; ++i) {
    Iteration it;
    it.start_us = steps[i].start_us;
    it.end_us = end_of(i);
    if (!(it.end_us > it.start_us)) continue;  // same-start duplicates
    it.label = std::string(trace.names.name(steps[i].name));
    out->push_back(std::move(it));
  }
}

std::string ms_after(double us, double origin_us) {
  return fmt::format("{:.3f} ms", (us - origin_us) / 1000.0);
}

}  // namespace

struct TraceAnalyzer::Impl {
  const CompactTrace& trace;
  std::unordered_map<int, uint32_t> slot_of_device;
  std::vector<std::vector<uint32_t>> device_records;  // by slot, in trace order
  std::vector<uint32_t> host_records;
  std::vector<int> analysable;
  std::vector<int> with_compute;
  size_t visited = 0;
  // Host step markers by process, for the prefix they were built for.
  std::string host_prefix;
  bool host_built = false;
  std::map<int64_t, HostGroup> host_groups;

  explicit Impl(const CompactTrace& t) : trace(t) {
    std::set<int> analysable_set, compute_set;
    for (size_t i = 0; i < trace.records.size(); ++i) {
      ++visited;
      const TraceRecord& r = trace.records[i];
      if (r.device == kHostDevice) {
        if (r.kind == ActivityKind::Marker) host_records.push_back(static_cast<uint32_t>(i));
        continue;
      }
      auto [it, inserted] =
          slot_of_device.try_emplace(r.device, static_cast<uint32_t>(device_records.size()));
      if (inserted) device_records.emplace_back();
      device_records[it->second].push_back(static_cast<uint32_t>(i));
      if (r.kind == ActivityKind::Kernel) {
        analysable_set.insert(r.device);
        compute_set.insert(r.device);
      } else if (is_bubble_marker(trace, r)) {
        analysable_set.insert(r.device);
      }
    }
    analysable.assign(analysable_set.begin(), analysable_set.end());
    with_compute.assign(compute_set.begin(), compute_set.end());
  }

  std::string prefix() const { return trace.source.empty() ? std::string() : trace.source + ": "; }

  void build_host_groups(const std::string& marker) {
    if (host_built && host_prefix == marker) return;
    host_built = true;
    host_prefix = marker;
    host_groups.clear();
    std::map<int64_t, std::vector<StepSpan>> spans;
    for (const uint32_t i : host_records) {
      ++visited;
      const TraceRecord& r = trace.records[i];
      if (!has_prefix(trace.name_of(r), marker)) continue;
      spans[r.process].push_back({r.name, r.start_us, std::max(r.start_us, r.end_us)});
    }
    for (auto& [process, list] : spans) {
      HostGroup& g = host_groups[process];
      g.steps = steps_from_spans(trace, std::move(list));
      for (size_t k = 0; k < g.steps.size(); ++k) {
        g.by_name[g.steps[k].name].push_back(static_cast<uint32_t>(k));
      }
    }
  }

  pfResult_t analyze(int device, const AnalysisOptions& options, DeviceAnalysis* out);
};

namespace {

struct DeviceIntervals {
  std::vector<Interval> compute, comm, copy, fill;
  std::vector<BubbleMarker> bubble_markers;
  std::vector<StepSpan> gpu_step_spans;
  int64_t process = -1;
};

pfResult_t collect_intervals(const CompactTrace& trace, const std::vector<uint32_t>& indices,
                             int device, const std::string& marker, const std::string& prefix,
                             size_t* visited, DeviceIntervals* out, DeviceAnalysis* analysis) {
  std::unordered_map<int64_t, size_t> launchers;
  for (const uint32_t i : indices) {
    ++*visited;
    const TraceRecord& r = trace.records[i];
    std::vector<Interval>* target = nullptr;
    switch (r.kind) {
      case ActivityKind::Kernel:
        target = &out->compute;
        ++analysis->compute_kernels;
        if (r.process >= 0) ++launchers[r.process];
        break;
      case ActivityKind::Comm:
        target = &out->comm;
        ++analysis->comm_kernels;
        break;
      case ActivityKind::Fill:
        target = &out->fill;
        ++analysis->fill_kernels;
        break;
      case ActivityKind::Memcpy:
      case ActivityKind::Memset:
        target = &out->copy;
        break;
      case ActivityKind::Marker:
        if (!is_bubble_marker(trace, r)) {
          if (has_prefix(trace.name_of(r), marker)) {
            out->gpu_step_spans.push_back({r.name, r.start_us, std::max(r.start_us, r.end_us)});
          }
          continue;
        }
        break;
      default:
        continue;  // memory is read elsewhere
    }
    if (!std::isfinite(r.start_us) || !std::isfinite(r.end_us) || r.end_us < r.start_us) {
      return fail(pfErrorInvalidArgument,
                  "{}{} ({} '{}' on device {}): start {} / end {} is not a valid interval", prefix,
                  trace.where(r), activity_kind_name(r.kind), trace.name_of(r), device, r.start_us,
                  r.end_us);
    }
    if (target != nullptr) {
      target->push_back({r.start_us, r.end_us});
    } else {
      out->bubble_markers.push_back(
          {{r.start_us, r.end_us},
           std::string(trace.name_of(r).substr(std::string_view(kBubbleMarkerPrefix).size()))});
    }
  }
  size_t most = 0;
  for (const auto& [process, count] : launchers) {
    if (count > most || (count == most && process < out->process)) {
      most = count;
      out->process = process;
    }
  }
  return pfSuccess;
}

// Latest end of an interval of `merged` inside (start, end]; NaN when none.
double latest_end_inside(const std::vector<Interval>& merged, double start_us, double end_us) {
  // merged is sorted by end too: the last interval ending at or before end_us.
  auto it = std::upper_bound(merged.begin(), merged.end(), end_us,
                             [](double t, const Interval& i) { return t < i.end_us; });
  if (it == merged.begin()) return std::numeric_limits<double>::quiet_NaN();
  --it;
  return it->end_us > start_us ? it->end_us : std::numeric_limits<double>::quiet_NaN();
}

// What ran during bubbles: unions of the device's non-compute activity.
struct Surroundings {
  std::vector<Interval> comm, copy, fill, transfers;  // transfers: comm or copy

  explicit Surroundings(const DeviceIntervals& in)
      : comm(merge_intervals(in.comm)), copy(merge_intervals(in.copy)),
        fill(merge_intervals(in.fill)) {
    transfers = comm;
    transfers.insert(transfers.end(), copy.begin(), copy.end());
    transfers = merge_intervals(std::move(transfers));
  }

  Bubble measure(double start_us, double end_us) const {
    Bubble b;
    b.start_us = start_us;
    b.end_us = end_us;
    const double duration = std::max(0.0, end_us - start_us);
    b.comm_us = covered_time(comm, start_us, end_us);
    b.fill_us = covered_time(fill, start_us, end_us);
    const double copy_us = covered_time(copy, start_us, end_us);
    const double busy = covered_time(transfers, start_us, end_us);
    b.copy_us = std::min(copy_us, duration);
    b.comm_only_us = std::clamp(busy - b.copy_us, 0.0, duration - b.copy_us);
    b.idle_us = std::max(0.0, duration - b.copy_us - b.comm_only_us);
    b.kind = largest(b.idle_us, b.comm_only_us, b.copy_us);
    b.wake_us = latest_end_inside(transfers, start_us, end_us);
    if (b.kind != BubbleKind::Idle && std::isfinite(b.wake_us)) {
      b.start_delay_us = end_us - b.wake_us;
    }
    return b;
  }
};

std::vector<Bubble> find_bubbles(const Surroundings& around, const std::vector<Interval>& compute,
                                 double min_gap_us) {
  std::vector<Bubble> bubbles;
  for (size_t i = 1; i < compute.size(); ++i) {
    const double start = compute[i - 1].end_us;
    const double end = compute[i].start_us;
    if (end - start < min_gap_us) continue;
    bubbles.push_back(around.measure(start, end));
  }
  return bubbles;
}

// GPU-side step markers end before their step's kernels when a compute kernel starts after GPU
// step k has ended, before the next GPU step starts and before the host step of the same name
// ends: the host was still in step k, so the kernel is step k's (a ROCm trace's ProfilerStep
// ends at 1 ms while the step's kernels run until 9 ms). Returns a description, or "".
std::string gpu_steps_end_early(const CompactTrace& trace, const std::vector<StepSpan>& gpu,
                                const HostGroup& host, const std::vector<Interval>& compute,
                                double origin_us) {
  for (size_t k = 0; k < gpu.size(); ++k) {
    const auto named = host.by_name.find(gpu[k].name);
    if (named == host.by_name.end()) continue;
    // The host step of that name that started last before the GPU step ended.
    const StepSpan* host_step = nullptr;
    for (const uint32_t h : named->second) {
      if (host.steps[h].start_us > gpu[k].end_us) break;
      host_step = &host.steps[h];
    }
    if (host_step == nullptr) continue;
    const double limit = std::min(k + 1 < gpu.size() ? gpu[k + 1].start_us
                                                     : std::numeric_limits<double>::infinity(),
                                  host_step->end_us);
    auto first_after = std::upper_bound(compute.begin(), compute.end(), gpu[k].end_us,
                                        [](double t, const Interval& i) { return t < i.start_us; });
    if (first_after == compute.end() || !(first_after->start_us < limit)) continue;
    auto last_before = std::lower_bound(compute.begin(), compute.end(), limit,
                                        [](const Interval& i, double t) { return i.start_us < t; });
    const double until = std::prev(last_before)->end_us;
    return fmt::format("GPU-side '{}' ends at {} but compute kernels launched in that host step "
                       "run from {} until {}",
                       trace.names.name(gpu[k].name), ms_after(gpu[k].end_us, origin_us),
                       ms_after(first_after->start_us, origin_us), ms_after(until, origin_us));
  }
  return {};
}

void assign_bubbles(std::vector<Iteration>& iterations, std::vector<Bubble>& bubbles) {
  // Iterations are ascending and disjoint; a bubble belongs to the one containing its start.
  size_t next = 0;
  std::vector<int> seen(iterations.size(), 0);
  for (Bubble& b : bubbles) {
    while (next < iterations.size() && iterations[next].end_us <= b.start_us) ++next;
    if (next == iterations.size() || b.start_us < iterations[next].start_us) continue;
    Iteration& it = iterations[next];
    b.iteration = static_cast<int>(next);
    b.class_index = seen[next]++;
    b.offset_us = b.start_us - it.start_us;
    ++it.bubble_count;
    it.bubble_us += b.duration_us();
  }
}

std::vector<BubbleClass> build_classes(const std::vector<Bubble>& bubbles, size_t iterations,
                                       const std::vector<std::string>& labels,
                                       const AnalysisOptions& options) {
  int class_count = 0;
  for (const Bubble& b : bubbles) class_count = std::max(class_count, b.class_index + 1);
  std::vector<std::vector<const Bubble*>> members(static_cast<size_t>(class_count));
  for (const Bubble& b : bubbles) {
    if (b.class_index >= 0) members[static_cast<size_t>(b.class_index)].push_back(&b);
  }
  std::vector<BubbleClass> classes;
  for (int k = 0; k < class_count; ++k) {
    BubbleClass c;
    c.index = k;
    c.label = static_cast<size_t>(k) < labels.size() ? labels[static_cast<size_t>(k)]
                                                     : fmt::format("#{}", k);
    std::vector<double> durations, offsets;
    for (const Bubble* b : members[static_cast<size_t>(k)]) {
      durations.push_back(b->duration_us());
      offsets.push_back(b->offset_us);
      c.fill_us += b->fill_us;
      c.idle_us += b->idle_us;
      c.comm_only_us += b->comm_only_us;
      c.copy_us += b->copy_us;
      switch (b->kind) {
        case BubbleKind::Idle: ++c.idle; break;
        case BubbleKind::CommOnly: ++c.comm_only; break;
        case BubbleKind::Copy: ++c.copy; break;
      }
      if (b->memory.known) {
        c.memory.min_bytes = c.memory.known ? std::min(c.memory.min_bytes, b->memory.min_bytes)
                                            : b->memory.min_bytes;
        c.memory.max_bytes = c.memory.known ? std::max(c.memory.max_bytes, b->memory.max_bytes)
                                            : b->memory.max_bytes;
        c.memory.known = true;
      }
    }
    c.duration = summarize(durations);
    c.offset = summarize(offsets);
    std::sort(durations.begin(), durations.end());
    c.predicted_us = quantile_nearest_rank(durations, options.quantile);
    c.usable_us = std::max(0.0, c.predicted_us * (1.0 - options.safety_margin_fraction) -
                                    options.safety_margin_us);
    c.occurrence = iterations > 0 ? static_cast<double>(c.duration.count) / iterations : 0.0;
    if (options.device_memory_bytes > 0 && c.memory.known) {
      // device_memory_bytes <= 2^53 (validated) and max_bytes >= 0: no overflow.
      c.free_bytes = std::max<int64_t>(
          0, static_cast<int64_t>(options.device_memory_bytes) - c.memory.max_bytes);
    }
    c.item_slots = options.item_parallelism;
    if (options.item_memory_bytes > 0 && c.free_bytes >= 0) {
      c.item_slots = static_cast<int>(std::min<int64_t>(
          options.item_parallelism, c.free_bytes / static_cast<int64_t>(options.item_memory_bytes)));
    }
    if (options.item_cost_us > 0.0) {
      c.items_per_occurrence = std::floor(c.usable_us / options.item_cost_us) * c.item_slots;
    }
    classes.push_back(c);
  }
  return classes;
}

}  // namespace

pfResult_t TraceAnalyzer::Impl::analyze(int device, const AnalysisOptions& options,
                                        DeviceAnalysis* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "analyze_device: out is null");
  PF_TRY(validate_options(options));
  static const std::vector<uint32_t> kNone;
  const auto slot = slot_of_device.find(device);
  const std::vector<uint32_t>& indices =
      slot == slot_of_device.end() ? kNone : device_records[slot->second];
  DeviceAnalysis a;
  a.device = device;
  DeviceIntervals intervals;
  PF_TRY(collect_intervals(trace, indices, device, options.iteration_marker, prefix(), &visited,
                           &intervals, &a));
  a.process = intervals.process;
  const Surroundings around(intervals);
  const std::vector<Interval> compute = merge_intervals(intervals.compute);
  // Explicit bubbles: class key of each bubble (same order as a.bubbles).
  std::vector<std::string> bubble_keys;
  if (!compute.empty()) {
    a.span_start_us = compute.front().start_us;
    a.span_end_us = compute.back().end_us;
    for (const Interval& i : compute) a.compute_busy_us += i.end_us - i.start_us;
    a.bubbles = find_bubbles(around, compute, options.min_gap_us);
  } else if (!intervals.bubble_markers.empty()) {
    // A PipeFill trace: no main-job kernels, but the bubbles PipeFill measured.
    a.explicit_bubbles = true;
    std::vector<BubbleMarker>& markers = intervals.bubble_markers;
    std::stable_sort(markers.begin(), markers.end(), [](const BubbleMarker& x, const BubbleMarker& y) {
      return x.interval.start_us < y.interval.start_us;
    });
    a.span_start_us = markers.front().interval.start_us;
    for (const BubbleMarker& m : markers) {
      a.span_end_us = std::max(a.span_end_us, m.interval.end_us);
      a.bubbles.push_back(around.measure(m.interval.start_us, m.interval.end_us));
      bubble_keys.push_back(m.class_key);
    }
    a.notes.push_back(fmt::format(
        "device {}: no main-job kernels; the {} bubbles are PipeFill's bubble markers, classes "
        "their class keys, and shares are of the time from the first to the last bubble",
        device, markers.size()));
  } else if (intervals.compute.empty()) {
    return fail(pfErrorInvalidArgument,
                "{}device {} has no compute kernels and no PipeFill bubble markers in the trace "
                "(devices with kernels: [{}])",
                prefix(), device, fmt::join(with_compute, ", "));
  } else {
    return fail(pfErrorInvalidArgument,
                "{}device {}: every compute kernel ({}) has zero duration", prefix(), device,
                intervals.compute.size());
  }

  std::vector<double> delays;
  for (const Bubble& b : a.bubbles) {
    a.bubble_us += b.duration_us();
    a.fill_in_bubbles_us += b.fill_us;
    a.idle_bubble_us += b.idle_us;
    a.comm_only_bubble_us += b.comm_only_us;
    a.copy_bubble_us += b.copy_us;
    switch (b.kind) {
      case BubbleKind::Idle: ++a.idle_bubbles; break;
      case BubbleKind::CommOnly: ++a.comm_only_bubbles; break;
      case BubbleKind::Copy: ++a.copy_bubbles; break;
    }
    if (std::isfinite(b.start_delay_us)) delays.push_back(b.start_delay_us);
  }
  a.start_delay = summarize(delays);
  a.bubble_share = a.span_us() > 0.0 ? a.bubble_us / a.span_us() : 0.0;

  // Iterations.
  if (options.iteration_period_us > 0.0) {
    a.iteration_source = IterationSource::Period;
    const double origin = std::isnan(options.iteration_origin_us) ? a.span_start_us
                                                                  : options.iteration_origin_us;
    if (origin >= a.span_end_us) {
      return fail(pfErrorInvalidArgument,
                  "iteration origin {} us is after the last compute kernel on device {} ({} us)",
                  origin, device, a.span_end_us);
    }
    const double count = std::ceil((a.span_end_us - origin) / options.iteration_period_us);
    if (count > static_cast<double>(options.max_iterations)) {
      return fail(pfErrorInvalidArgument,
                  "iteration period {} us gives {:.0f} iterations over device {}'s {} us of "
                  "trace, more than the bound of {} (--max-iterations); give a longer period or "
                  "raise the bound",
                  options.iteration_period_us, count, device, a.span_end_us - origin,
                  options.max_iterations);
    }
    for (int k = 0; k < static_cast<int>(count); ++k) {
      Iteration it;
      it.label = fmt::format("period#{}", k);
      it.start_us = origin + k * options.iteration_period_us;
      it.end_us = it.start_us + options.iteration_period_us;
      a.iterations.push_back(std::move(it));
    }
  } else {
    const std::string& marker = options.iteration_marker;
    bool found = false;
    std::vector<Iteration> marked;
    if (!marker.empty()) {
      build_host_groups(marker);
      // The host markers of the process that launched this device's kernels: one process's
      // steps never delimit another's.
      const HostGroup* host = nullptr;
      if (host_groups.size() == 1) {
        host = &host_groups.begin()->second;
      } else if (!host_groups.empty()) {
        const auto it = host_groups.find(a.process);
        if (it != host_groups.end() && a.process >= 0) {
          host = &it->second;
        } else {
          // At most 8 listed: the note is per device, and a merged trace may hold many ranks.
          std::vector<int64_t> processes;
          for (const auto& [process, group] : host_groups) {
            if (processes.size() == 8) break;
            processes.push_back(process);
          }
          a.notes.push_back(fmt::format(
              "device {}: host markers '{}*' come from {} processes ([{}{}]) and which one "
              "launched this device's kernels is unknown (no runtime events with correlation "
              "ids); host markers are not used for it",
              device, marker, host_groups.size(), fmt::join(processes, ", "),
              host_groups.size() > processes.size() ? ", ..." : ""));
        }
      }
      const std::vector<StepSpan> gpu = steps_from_spans(trace, std::move(intervals.gpu_step_spans));
      bool use_gpu = !gpu.empty();
      if (use_gpu && host != nullptr) {
        const std::string early = gpu_steps_end_early(trace, gpu, *host, compute, a.span_start_us);
        if (!early.empty()) {
          use_gpu = false;
          a.notes.push_back(fmt::format(
              "device {}: {}; using the host-side '{}*' markers instead", device, early, marker));
        }
      }
      if (use_gpu) {
        found = true;
        iterations_from_steps(trace, gpu, false, a.span_start_us, a.span_end_us, &marked);
      } else if (host != nullptr && !host->steps.empty()) {
        found = true;
        a.host_markers = true;
        iterations_from_steps(trace, host->steps, true, a.span_start_us, a.span_end_us, &marked);
      }
    }
    if (!found && options.iteration_marker_required) {
      return fail(pfErrorInvalidArgument,
                  "{}no marker named '{}*' on device {} or on the host: cannot find iterations",
                  prefix(), marker, device);
    }
    // Steps that do not overlap this device's kernels (e.g. host steps before the GPU trace)
    // say nothing about its bubbles; iterations_from_steps kept only overlapping ones.
    a.iterations = std::move(marked);
    if (found && a.iterations.empty()) {
      a.notes.push_back(fmt::format("markers '{}*' do not overlap device {}'s kernels; using the "
                                    "whole trace as one iteration",
                                    marker, device));
    }
    if (!a.iterations.empty()) {
      a.iteration_source = IterationSource::Markers;
    } else {
      a.iteration_source = IterationSource::WholeTrace;
      a.host_markers = false;
      a.iterations.push_back({"trace", a.span_start_us, a.span_end_us, 0, 0.0});
    }
  }
  assign_bubbles(a.iterations, a.bubbles);
  std::vector<std::string> class_labels;
  if (a.explicit_bubbles) {
    // Classes are PipeFill's class keys, numbered in order of first appearance.
    std::map<std::string, int> index_of_key;
    for (size_t i = 0; i < a.bubbles.size(); ++i) {
      Bubble& b = a.bubbles[i];
      if (b.iteration < 0) continue;
      const auto [it, inserted] =
          index_of_key.try_emplace(bubble_keys[i], static_cast<int>(class_labels.size()));
      if (inserted) class_labels.push_back(bubble_keys[i]);
      b.class_index = it->second;
    }
  }

  double iteration_time = 0.0;
  double bubbles_in_iterations = 0.0;
  int fewest = INT32_MAX, most = 0;
  for (const Iteration& it : a.iterations) {
    iteration_time += it.duration_us();
    bubbles_in_iterations += it.bubble_us;
    fewest = std::min(fewest, it.bubble_count);
    most = std::max(most, it.bubble_count);
  }
  const double n = static_cast<double>(a.iterations.size());
  a.mean_iteration_us = iteration_time / n;
  a.bubble_us_per_iteration = bubbles_in_iterations / n;
  a.iteration_bubble_share = iteration_time > 0.0 ? bubbles_in_iterations / iteration_time : 0.0;
  if (fewest != most && !a.explicit_bubbles) {
    a.notes.push_back(fmt::format(
        "device {}: iterations have {} to {} bubbles; classes above {} occur in some iterations "
        "only (consider --min-gap-us)",
        device, fewest, most, fewest));
  }
  const size_t outside = static_cast<size_t>(std::count_if(
      a.bubbles.begin(), a.bubbles.end(), [](const Bubble& b) { return b.iteration < 0; }));
  if (outside > 0) {
    a.notes.push_back(fmt::format("device {}: {} bubble(s) lie outside every iteration and are "
                                  "left out of the classes",
                                  device, outside));
  }

  // Memory.
  MemoryTimeline memory;
  visited += indices.size();
  PF_TRY(MemoryTimeline::build(trace, indices, &memory));
  if (!memory.empty()) {
    a.memory_known = true;
    a.memory_absolute = memory.absolute();
    a.memory_peak_bytes = memory.peak_bytes();
    for (Bubble& b : a.bubbles) b.memory = memory.range(b.start_us, b.end_us);
    if (!a.memory_absolute) {
      a.notes.push_back(fmt::format(
          "device {}: memory records carry no absolute level; in-use figures count only what was "
          "allocated during the trace (lower bounds)",
          device));
    }
  }

  a.classes = build_classes(a.bubbles, a.iterations.size(), class_labels, options);
  // Fill at the trace's edges (before the first / after the last compute kernel) ran in the
  // edge bubbles, not alongside the main job; a PipeFill trace has no such edges.
  a.fill_busy_us = a.explicit_bubbles
                       ? covered_time(around.fill, -std::numeric_limits<double>::infinity(),
                                      std::numeric_limits<double>::infinity())
                       : covered_time(around.fill, a.span_start_us, a.span_end_us);
  a.fill_outside_bubbles_us = std::max(0.0, a.fill_busy_us - a.fill_in_bubbles_us);

  // What filling would give.
  FillEstimate& f = a.fill;
  for (const BubbleClass& c : a.classes) {
    f.fillable_us_per_iteration += c.usable_us * c.occurrence;
    f.items_per_iteration += c.items_per_occurrence * c.occurrence;
  }
  f.fillable_share = a.mean_iteration_us > 0.0 ? f.fillable_us_per_iteration / a.mean_iteration_us
                                               : 0.0;
  f.fill_efficiency = a.bubble_us_per_iteration > 0.0
                          ? f.fillable_us_per_iteration / a.bubble_us_per_iteration
                          : 0.0;
  if (options.item_cost_us > 0.0) {
    f.items_estimated = true;
    if (a.mean_iteration_us > 0.0) {
      f.items_per_second = f.items_per_iteration / (a.mean_iteration_us * 1e-6);
      f.dedicated_gpu_share = f.items_per_iteration * options.item_cost_us /
                              (options.item_parallelism * a.mean_iteration_us);
    }
    if (options.item_memory_bytes > 0 && (options.device_memory_bytes == 0 || !a.memory_known)) {
      a.notes.push_back(fmt::format(
          "device {}: item memory given but free memory per bubble is unknown (needs memory "
          "records and --device-memory-gb); memory was not checked",
          device));
    }
  }
  *out = std::move(a);
  return pfSuccess;
}

TraceAnalyzer::TraceAnalyzer(const CompactTrace& trace) : impl_(std::make_unique<Impl>(trace)) {}
TraceAnalyzer::~TraceAnalyzer() = default;

const std::vector<int>& TraceAnalyzer::analysable_devices() const { return impl_->analysable; }

pfResult_t TraceAnalyzer::analyze(int device, const AnalysisOptions& options, DeviceAnalysis* out) {
  return impl_->analyze(device, options, out);
}

size_t TraceAnalyzer::records_visited() const { return impl_->visited; }
void TraceAnalyzer::count_visits(size_t n) { impl_->visited += n; }

const CompactTrace& TraceAnalyzer::trace() const { return impl_->trace; }

const std::vector<uint32_t>& TraceAnalyzer::records_of(int device) const {
  static const std::vector<uint32_t> kNone;
  const auto slot = impl_->slot_of_device.find(device);
  return slot == impl_->slot_of_device.end() ? kNone : impl_->device_records[slot->second];
}

pfResult_t analyze_device(const CompactTrace& trace, int device, const AnalysisOptions& options,
                          DeviceAnalysis* out) {
  return TraceAnalyzer(trace).analyze(device, options, out);
}

pfResult_t analyze_device(const std::vector<ActivityRecord>& records, int device,
                          const AnalysisOptions& options, DeviceAnalysis* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "analyze_device: out is null");
  return analyze_device(compact_from_activity(records, ""), device, options, out);
}

}  // namespace pipefill::analysis
