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

struct RuntimeGuard {
  pfRuntime_t runtime = nullptr;
  fjJob_t job = nullptr;
  void* stream = nullptr;
  ~RuntimeGuard() {
    if (stream != nullptr) pfStreamDestroy(runtime, stream);
    if (runtime != nullptr) pfRuntimeDestroy(runtime);
    if (job != nullptr) fjJobDestroy(job);
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

Status measure_alone(const EngineOptions& options, uint64_t items, AloneRate* out) {
  RuntimeGuard g;
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  config.backend = pfBackendHost;
  config.reserved_sms = 0;
  ENGINE_PF(pfRuntimeCreate(&config, &g.runtime));
  const int kind = parse_fill_kind(options.fill);
  if (kind < 0) return Status{pfErrorInvalidArgument, "measure_alone needs a fill job kind"};
  fjParams_t p;
  if (fjParamsInit(&p, kind, pfBackendHost) != pfSuccess)
    return Status{pfErrorInvalidArgument, fmt::format("fjParamsInit: {}", fjGetLastErrorMessage())};
  p.items = std::max(options.fill_items > 0 ? options.fill_items : p.items, items);
  if (options.fill_execution >= 0) p.execution = options.fill_execution;
  if (options.fill_item_cost_us > 0) p.item_cost_us = options.fill_item_cost_us;
  p.seed = options.seed * 1000;
  p.keep_every = options.keep_every;
  if (fjJobCreate(&p, &g.job) != pfSuccess)
    return Status{pfErrorInvalidArgument, fmt::format("fjJobCreate: {}", fjGetLastErrorMessage())};
  pfJobDesc_t desc;
  if (fjJobGetDesc(g.job, &desc) != pfSuccess)
    return Status{pfErrorInvalidArgument, fmt::format("fjJobGetDesc: {}", fjGetLastErrorMessage())};
  ENGINE_PF(pfStreamCreateHighPriority(g.runtime, &g.stream));
  // The slice's words: an open gate (0 < bubble id 1), the cursor and the budget counter.
  alignas(64) uint64_t words[3] = {0, 0, 0};
  pfSliceDesc_t slice{};
  slice.bubble_id = 1;
  slice.max_items = items;
  slice.total_items = p.items;
  slice.max_blocks = 1024;  // the device caps it at its fill SMs, as the runtime's plan does
  slice.time_budget_us = 1e12;
  slice.gate = &words[0];
  slice.cursor = &words[1];
  slice.budget_counter = &words[2];
  const auto t0 = std::chrono::steady_clock::now();
  ENGINE_PF(desc.launch(desc.user, &slice, g.stream));
  ENGINE_PF(pfHostStreamSynchronize(g.stream));
  const auto t1 = std::chrono::steady_clock::now();
  fjProgress_t progress{};
  fjJobGetProgress(g.job, &progress);
  out->items = progress.items_done;
  out->seconds = std::chrono::duration<double>(t1 - t0).count();
  out->items_per_s = out->seconds > 0 ? static_cast<double>(out->items) / out->seconds : 0.0;
  if (out->items != items)
    return Status{pfErrorInternal, fmt::format("the job alone ran {} of {} items", out->items, items)};
  return {};
}

std::vector<StageRow> host_stage_rows(const RunResult& filled, const HostTimeline& timeline,
                                      int first_counted_iteration, double item_cost_us,
                                      double min_factor, double alone_items_per_s) {
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
    r.ratio = alone_items_per_s > 0 ? r.rate_per_bubble_s / alone_items_per_s : 0.0;
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
                                    double min_factor, const AloneRate& alone) {
  std::string out = fmt::format(
      "per stage, bubble classes >= {:.0f}x the item cost ({:.0f} us items; alone: {:.0f} items/s, "
      "{} items in {:.3f} s); goals: filled >= {:.0f}%, ratio >= {:.2f}\n",
      min_factor, item_cost_us, alone.items_per_s, alone.items, alone.seconds, 100 * kFilledGoal,
      kRatioGoal);
  out += fmt::format("{:>5} | {:>7} | {:>7} | {:>9} | {:>7} | {:>7} | {:>11} | {:>6} | {:>9} | {}\n", "stage",
                     "classes", "bubbles", "bubble ms", "filled", "items", "items/bub-s", "ratio",
                     "learned", "verdict");
  for (const StageRow& r : rows) {
    const double share = r.bubble_us > 0 ? r.filled_us / r.bubble_us : 0.0;
    out += fmt::format("{:>5} | {:>7} | {:>7} | {:>9.3f} | {:>6.1f}% | {:>7} | {:>11.0f} | {:>6.3f} | {:>6.1f} us | {}\n",
                       r.stage, r.long_classes, r.bubbles, r.bubble_us / 1e3, 100 * share, r.items,
                       r.rate_per_bubble_s, r.ratio, r.learned_cost_us,
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
