#include "analysis/bubbles.hpp"

#include <algorithm>
#include <map>
#include <set>

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

pfResult_t validate_options(const AnalysisOptions& o) {
  if (!std::isfinite(o.min_gap_us) || o.min_gap_us < 0.0) {
    return fail(pfErrorInvalidArgument, "min_gap_us must be a finite value >= 0, got {}",
                o.min_gap_us);
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

namespace {

struct BubbleMarker {
  Interval interval;
  std::string class_key;
};

struct DeviceIntervals {
  std::vector<Interval> compute, comm, copy, fill;
  std::vector<BubbleMarker> bubble_markers;
};

pfResult_t collect_intervals(const std::vector<ActivityRecord>& records, int device,
                             DeviceIntervals* out, DeviceAnalysis* analysis) {
  for (size_t i = 0; i < records.size(); ++i) {
    const ActivityRecord& r = records[i];
    if (r.device != device) continue;
    std::vector<Interval>* target = nullptr;
    switch (r.kind) {
      case ActivityKind::Kernel:
        target = &out->compute;
        ++analysis->compute_kernels;
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
        if (!is_bubble_marker(r)) continue;  // iteration markers are read elsewhere
        break;
      default:
        continue;  // memory is read elsewhere
    }
    if (!std::isfinite(r.start_us) || !std::isfinite(r.end_us) || r.end_us < r.start_us) {
      return fail(pfErrorInvalidArgument,
                  "record {} ({} '{}' on device {}): start {} / end {} is not a valid interval",
                  i, activity_kind_name(r.kind), r.name, device, r.start_us, r.end_us);
    }
    if (target != nullptr) {
      target->push_back({r.start_us, r.end_us});
    } else {
      out->bubble_markers.push_back(
          {{r.start_us, r.end_us}, r.name.substr(std::string_view(kBubbleMarkerPrefix).size())});
    }
  }
  return pfSuccess;
}

// Latest end of an interval of `intervals` inside (start, end]; NaN when none.
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
  std::vector<Interval> comm, copy, fill, waking;

  explicit Surroundings(const DeviceIntervals& in)
      : comm(merge_intervals(in.comm)), copy(merge_intervals(in.copy)),
        fill(merge_intervals(in.fill)) {
    waking = comm;
    waking.insert(waking.end(), copy.begin(), copy.end());
    waking = merge_intervals(std::move(waking));
  }

  Bubble measure(double start_us, double end_us) const {
    Bubble b;
    b.start_us = start_us;
    b.end_us = end_us;
    b.comm_us = covered_time(comm, b.start_us, b.end_us);
    b.copy_us = covered_time(copy, b.start_us, b.end_us);
    b.fill_us = covered_time(fill, b.start_us, b.end_us);
    b.kind = b.copy_us > 0.0 ? BubbleKind::Copy
             : b.comm_us > 0.0 ? BubbleKind::CommOnly
                               : BubbleKind::Idle;
    b.wake_us = latest_end_inside(waking, b.start_us, b.end_us);
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

struct MarkerSpan {
  double start_us;
  double end_us;
};

// Iterations from markers named `prefix...`: GPU-side markers of the device when there are any,
// else host-side ones. Markers with the same name that overlap in time are one step (PyTorch
// annotates each stream with the step's own span); the same name again later (a marker without
// a step number, e.g. "train_step") is the next step.
pfResult_t marker_iterations(const std::vector<ActivityRecord>& records, int device,
                             const AnalysisOptions& options, double span_end_us,
                             std::vector<Iteration>* out, bool* found) {
  *found = false;
  const std::string& prefix = options.iteration_marker;
  if (prefix.empty()) return pfSuccess;
  for (const int source_device : {device, kHostDevice}) {
    std::map<std::string, std::vector<MarkerSpan>> by_name;
    for (const ActivityRecord& r : records) {
      if (r.kind != ActivityKind::Marker || r.device != source_device) continue;
      if (r.name.compare(0, prefix.size(), prefix) != 0) continue;
      by_name[r.name].push_back({r.start_us, std::max(r.start_us, r.end_us)});
    }
    if (by_name.empty()) continue;
    std::vector<std::pair<std::string, MarkerSpan>> steps;
    for (auto& [name, spans] : by_name) {
      std::sort(spans.begin(), spans.end(),
                [](const MarkerSpan& a, const MarkerSpan& b) { return a.start_us < b.start_us; });
      for (const MarkerSpan& span : spans) {
        if (!steps.empty() && steps.back().first == name && span.start_us < steps.back().second.end_us) {
          steps.back().second.end_us = std::max(steps.back().second.end_us, span.end_us);
        } else {
          steps.emplace_back(name, span);
        }
      }
    }
    std::stable_sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) {
      return a.second.start_us < b.second.start_us;
    });
    for (size_t i = 0; i < steps.size(); ++i) {
      Iteration it;
      it.label = steps[i].first;
      it.start_us = steps[i].second.start_us;
      if (i + 1 < steps.size()) {
        it.end_us = steps[i + 1].second.start_us;
      } else {
        // The last step ends with its marker; a host marker can end before the GPU finishes the
        // step's work (the CPU runs ahead), so then the step extends to the last kernel.
        it.end_us = steps[i].second.end_us;
        if (source_device == kHostDevice || it.end_us <= it.start_us) {
          it.end_us = std::max(it.end_us, span_end_us);
        }
      }
      if (it.end_us > it.start_us) out->push_back(std::move(it));  // same-start duplicates
    }
    *found = true;
    return pfSuccess;
  }
  if (options.iteration_marker_required) {
    return fail(pfErrorInvalidArgument,
                "no marker named '{}*' on device {} or on the host: cannot find iterations",
                prefix, device);
  }
  return pfSuccess;
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

pfResult_t analyze_device(const std::vector<ActivityRecord>& records, int device,
                          const AnalysisOptions& options, DeviceAnalysis* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "analyze_device: out is null");
  PF_TRY(validate_options(options));
  DeviceAnalysis a;
  a.device = device;
  DeviceIntervals intervals;
  PF_TRY(collect_intervals(records, device, &intervals, &a));
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
                "device {} has no compute kernels and no PipeFill bubble markers in the trace "
                "(devices with kernels: [{}])",
                device, fmt::join(devices_with_compute(records), ", "));
  } else {
    return fail(pfErrorInvalidArgument, "device {}: every compute kernel has zero duration", device);
  }

  std::vector<double> delays;
  for (const Bubble& b : a.bubbles) {
    a.bubble_us += b.duration_us();
    a.fill_in_bubbles_us += b.fill_us;
    switch (b.kind) {
      case BubbleKind::Idle: a.idle_bubble_us += b.duration_us(); break;
      case BubbleKind::CommOnly: a.comm_only_bubble_us += b.duration_us(); break;
      case BubbleKind::Copy: a.copy_bubble_us += b.duration_us(); break;
    }
    if (std::isfinite(b.wake_us)) delays.push_back(b.end_us - b.wake_us);
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
    if (count > 1e7) {
      return fail(pfErrorInvalidArgument,
                  "iteration period {} us gives {} iterations over the trace; too short a period",
                  options.iteration_period_us, count);
    }
    for (int k = 0; k < static_cast<int>(count); ++k) {
      Iteration it;
      it.label = fmt::format("period#{}", k);
      it.start_us = origin + k * options.iteration_period_us;
      it.end_us = it.start_us + options.iteration_period_us;
      a.iterations.push_back(std::move(it));
    }
  } else {
    bool found = false;
    std::vector<Iteration> marked;
    PF_TRY(marker_iterations(records, device, options, a.span_end_us, &marked, &found));
    // Steps that do not overlap this device's kernels (e.g. host steps before the GPU trace)
    // say nothing about its bubbles.
    for (Iteration& it : marked) {
      if (it.end_us > a.span_start_us && it.start_us < a.span_end_us) {
        a.iterations.push_back(std::move(it));
      }
    }
    if (found && a.iterations.empty()) {
      a.notes.push_back(fmt::format("markers '{}*' do not overlap device {}'s kernels; using the "
                                    "whole trace as one iteration",
                                    options.iteration_marker, device));
    }
    if (!a.iterations.empty()) {
      a.iteration_source = IterationSource::Markers;
    } else {
      a.iteration_source = IterationSource::WholeTrace;
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
  const MemoryTimeline memory = MemoryTimeline::build(records, device);
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

}  // namespace pipefill::analysis
