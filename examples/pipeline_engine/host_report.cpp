// The host transport's per-stage report (host_report.hpp).
#include "host_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "../fill_jobs/fill_jobs.h"

namespace engine {
namespace {

const char* skip_name(int cause) {
  static const char* const kNames[PF_SKIP_CAUSE_COUNT] = {
      "no history", "too short", "no memory", "no job",     "optimizer",
      "late",       "no resources", "launch failed", "untimed", "other"};
  return cause >= 0 && cause < PF_SKIP_CAUSE_COUNT ? kNames[cause] : "?";
}

// "#k" -> k; -1 for a labelled class.
int class_index(const std::string& key) {
  if (key.size() < 2 || key[0] != '#') return -1;
  char* end = nullptr;
  const long k = std::strtol(key.c_str() + 1, &end, 10);
  return end != nullptr && *end == '\0' && k >= 0 ? static_cast<int>(k) : -1;
}

// One device of the alone measurement: its runtime, job, stream, slice words and finish time.
struct AloneDevice {
  pfRuntime_t runtime = nullptr;
  fjJob_t job = nullptr;
  void* stream = nullptr;
  pfJobDesc_t desc{};
  alignas(64) uint64_t words[3] = {0, 0, 0};  // an open gate (0 < bubble id 1), cursor, budget
  pfSliceDesc_t slice{};
  std::chrono::steady_clock::time_point done{};
  ~AloneDevice() {
    if (stream != nullptr) pfStreamDestroy(runtime, stream);
    if (runtime != nullptr) pfRuntimeDestroy(runtime);
    if (job != nullptr) fjJobDestroy(job);
  }
  static void mark_done(void* user) {
    static_cast<AloneDevice*>(user)->done = std::chrono::steady_clock::now();
  }
};

// Why a stage misses a goal: the largest share of its bubble time that held no item.
std::string explain(const StageRow& r, double item_cost_us, double min_factor) {
  if (r.long_classes == 0)
    return fmt::format("no bubble class >= {:.0f}x the item cost ({:.0f} us): its longest class "
                       "averages {:.0f} us",
                       min_factor, min_factor * item_cost_us, r.longest_class_us);
  const StageBreakdown& b = r.breakdown;
  if (!(b.bubble_us > 0)) return "no bubble of its long classes was timed";
  struct Loss {
    double us;
    std::string what;
  };
  std::vector<Loss> losses = {
      {b.unfilled_us, fmt::format("{} of {} bubbles got no slice", r.skipped, r.bubbles)},
      {b.executor_late_us, "the executor enqueued the slice after the bubble began"},
      {b.stream_wake_us, "the fill stream's thread woke late after the begin (a thread hop)"},
      {b.first_item_us, "the SM threads started their first item late (a thread hop per block)"},
      {b.tail_us, "the bubble's tail after the last item (safety margin, last round)"}};
  std::sort(losses.begin(), losses.end(), [](const Loss& x, const Loss& y) { return x.us > y.us; });
  return fmt::format("{:.0f}% of its bubble time: {}", 100.0 * losses[0].us / b.bubble_us,
                     losses[0].what);
}

}  // namespace

Status measure_alone(const EngineOptions& options, uint64_t items, int devices, AloneRate* out) {
  const int kind = parse_fill_kind(options.fill);
  if (kind < 0) return Status{pfErrorInvalidArgument, "measure_alone needs a fill job kind"};
  if (devices < 1)
    return Status{pfErrorInvalidArgument, fmt::format("measure_alone: devices {} must be >= 1", devices)};
  std::vector<std::unique_ptr<AloneDevice>> all;
  for (int d = 0; d < devices; ++d) {
    auto dev = std::make_unique<AloneDevice>();
    pfConfig_t config = PF_CONFIG_INITIALIZER;
    config.backend = pfBackendHost;
    config.reserved_sms = 0;
    ENGINE_PF(pfRuntimeCreate(&config, &dev->runtime));
    fjParams_t p;
    if (fjParamsInit(&p, kind, pfBackendHost) != pfSuccess)
      return Status{pfErrorInvalidArgument, fmt::format("fjParamsInit: {}", fjGetLastErrorMessage())};
    p.items = std::max(options.fill_items > 0 ? options.fill_items : p.items, items);
    if (options.fill_execution >= 0) p.execution = options.fill_execution;
    if (options.fill_item_cost_us > 0) p.item_cost_us = options.fill_item_cost_us;
    p.seed = options.seed * 1000 + static_cast<uint64_t>(d);
    p.keep_every = options.keep_every;
    if (fjJobCreate(&p, &dev->job) != pfSuccess)
      return Status{pfErrorInvalidArgument, fmt::format("fjJobCreate: {}", fjGetLastErrorMessage())};
    if (fjJobGetDesc(dev->job, &dev->desc) != pfSuccess)
      return Status{pfErrorInvalidArgument, fmt::format("fjJobGetDesc: {}", fjGetLastErrorMessage())};
    ENGINE_PF(pfStreamCreateHighPriority(dev->runtime, &dev->stream));
    pfSliceDesc_t& slice = dev->slice;
    slice.bubble_id = 1;
    slice.max_items = items;
    slice.total_items = p.items;
    slice.max_blocks = 1024;  // the device caps it at its fill SMs, as the runtime's plan does
    slice.time_budget_us = 1e12;
    slice.gate = &dev->words[0];
    slice.cursor = &dev->words[1];
    slice.budget_counter = &dev->words[2];
    all.push_back(std::move(dev));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& dev : all) {
    ENGINE_PF(dev->desc.launch(dev->desc.user, &dev->slice, dev->stream));
    ENGINE_PF(pfHostLaunchHostFunc(dev->stream, &AloneDevice::mark_done, dev.get()));
  }
  for (auto& dev : all) ENGINE_PF(pfHostStreamSynchronize(dev->stream));
  double seconds = 0.0;
  for (auto& dev : all) {
    fjProgress_t progress{};
    fjJobGetProgress(dev->job, &progress);
    if (progress.items_done != items)
      return Status{pfErrorInternal,
                    fmt::format("the job alone ran {} of {} items", progress.items_done, items)};
    seconds += std::chrono::duration<double>(dev->done - t0).count();
  }
  out->devices = devices;
  out->items = items;
  out->seconds = seconds / devices;
  out->items_per_s = out->seconds > 0 ? static_cast<double>(items) / out->seconds : 0.0;
  return {};
}

uint64_t host_alone_items(double item_cost_us) {
  int sms = 8;  // PIPEFILL_HOST_SMS's default (the device validates the variable itself)
  if (const char* env = std::getenv("PIPEFILL_HOST_SMS")) sms = std::max(1, std::atoi(env));
  return static_cast<uint64_t>(std::max(200.0, 0.15e6 / std::max(item_cost_us, 1.0) * sms));
}

std::vector<StageRow> host_stage_rows(const RunResult& filled, const HostTimeline& timeline,
                                      int first_counted_iteration, double item_cost_us,
                                      double min_factor, const AloneRate& alone,
                                      const AloneRate& alone_single) {
  std::vector<StageRow> rows;
  for (size_t s = 0; s < filled.stages.size(); ++s) {
    const StageFillSummary& summary = filled.stages[s];
    StageRow r;
    r.stage = static_cast<int>(s);
    std::vector<bool> long_classes;
    for (const ClassSummary& c : summary.classes) {
      if (c.bubbles == 0) continue;
      const double mean = c.bubble_us / static_cast<double>(c.bubbles);
      r.longest_class_us = std::max(r.longest_class_us, mean);
      const int k = class_index(c.key);
      if (mean < min_factor * item_cost_us || k < 0) continue;
      if (long_classes.size() <= static_cast<size_t>(k)) long_classes.resize(k + 1, false);
      long_classes[static_cast<size_t>(k)] = true;
      ++r.long_classes;
      r.bubbles += c.bubbles;
      r.bubble_us += c.bubble_us;
      r.filled_us += c.filled_us;
      r.items += c.items;
      r.skipped += c.bubbles - c.bubbles_filled;
    }
    r.rate_per_bubble_s = r.bubble_us > 0 ? static_cast<double>(r.items) / (r.bubble_us * 1e-6) : 0.0;
    r.ratio = alone.items_per_s > 0 ? r.rate_per_bubble_s / alone.items_per_s : 0.0;
    r.ratio_single = alone_single.items_per_s > 0 ? r.rate_per_bubble_s / alone_single.items_per_s : 0.0;
    r.learned_cost_us = summary.learned_cost_us;
    r.breakdown = timeline.breakdown(r.stage, first_counted_iteration, long_classes, item_cost_us);
    const double share = r.bubble_us > 0 ? r.filled_us / r.bubble_us : 0.0;
    if (r.long_classes == 0 || share < kFilledGoal || r.ratio < kRatioGoal)
      r.why = explain(r, item_cost_us, min_factor);
    // The skip causes of those classes, when a bubble got no slice.
    if (r.skipped > 0) {
      uint64_t causes[PF_SKIP_CAUSE_COUNT] = {};
      for (const ClassSummary& c : summary.classes) {
        const int k = class_index(c.key);
        if (k < 0 || static_cast<size_t>(k) >= long_classes.size() || !long_classes[static_cast<size_t>(k)]) continue;
        for (int i = 0; i < PF_SKIP_CAUSE_COUNT; ++i) causes[i] += c.skips[i];
      }
      std::string list;
      for (int i = 0; i < PF_SKIP_CAUSE_COUNT; ++i)
        if (causes[i] > 0) list += fmt::format("{}{} {}", list.empty() ? "" : ", ", causes[i], skip_name(i));
      if (!r.why.empty()) r.why += fmt::format(" (skipped: {})", list);
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string format_host_stage_table(const std::vector<StageRow>& rows, double item_cost_us,
                                    double min_factor, const AloneRate& alone,
                                    const AloneRate& alone_single) {
  std::string out = fmt::format(
      "per stage, bubble classes >= {:.0f}x the item cost ({:.0f} us items); goals: filled >= {:.0f}%, "
      "ratio >= {:.2f}\nalone: {:.0f} items/s per device ({} items on each of {} host devices at once, "
      "{:.3f} s): the ratio's base; on one device alone: {:.0f} items/s ({:.3f} s): ratio 1dev\n",
      min_factor, item_cost_us, 100 * kFilledGoal, kRatioGoal, alone.items_per_s, alone.items,
      alone.devices, alone.seconds, alone_single.items_per_s, alone_single.seconds);
  out += fmt::format("{:>5} | {:>7} | {:>7} | {:>9} | {:>7} | {:>7} | {:>11} | {:>6} | {:>10} | {:>9} | {}\n",
                     "stage", "classes", "bubbles", "bubble ms", "filled", "items", "items/bub-s",
                     "ratio", "ratio 1dev", "learned", "verdict");
  for (const StageRow& r : rows) {
    const double share = r.bubble_us > 0 ? r.filled_us / r.bubble_us : 0.0;
    out += fmt::format("{:>5} | {:>7} | {:>7} | {:>9.3f} | {:>6.1f}% | {:>7} | {:>11.0f} | {:>6.3f} | {:>10.3f} | {:>6.1f} us | {}\n",
                       r.stage, r.long_classes, r.bubbles, r.bubble_us / 1e3, 100 * share, r.items,
                       r.rate_per_bubble_s, r.ratio, r.ratio_single, r.learned_cost_us,
                       r.why.empty() ? "meets both goals" : r.why);
  }
  out += fmt::format("where the bubble time went (host timeline, same bubbles; % of bubble time):\n");
  out += fmt::format("{:>5} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>10} | {:>13}\n", "stage",
                     "no slice", "exec late", "fill hop", "block hop", "items", "tail", "late items",
                     "stop after end");
  for (const StageRow& r : rows) {
    const StageBreakdown& b = r.breakdown;
    const auto pct = [&](double us) { return b.bubble_us > 0 ? 100.0 * us / b.bubble_us : 0.0; };
    const double per = b.bubbles > 0 ? b.stop_after_end_us / static_cast<double>(b.bubbles) : 0.0;
    out += fmt::format("{:>5} | {:>8.1f}% | {:>8.1f}% | {:>8.1f}% | {:>8.1f}% | {:>8.1f}% | {:>8.1f}% | {:>10} | {:>10.1f} us\n",
                       r.stage, pct(b.unfilled_us), pct(b.executor_late_us), pct(b.stream_wake_us),
                       pct(b.first_item_us), pct(b.items_span_us), pct(b.tail_us), b.late_items, per);
  }
  return out;
}

}  // namespace engine
