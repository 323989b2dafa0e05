// Item costs learned online. The cost a job was created with (pfJobConfig_t.item_cost_us, or
// item_cost_hint_us) is a prior, often timed once on a busy rank and far off; the planner trusts
// whatever cost it is given, so a prior 25x too large makes every bubble "too short" forever.
// Here each configuration of a job keeps a small window of its timed slices' measurements (busy
// time and the rounds the planner models: ceil(items done / workers)), and the planner uses an
// estimate from that window once it has a sample.
//
// A slice's busy time is not rounds x the item cost: its workers claim items from one cursor and
// the slice ends when the slowest finishes, so busy = rounds x cost + a tail (the spread of the
// workers' last items; with 124 workers of jittered items the largest of 124 draws). busy / rounds
// then overstates the cost by tail / rounds (issue 32: 14.1-14.7 us learned for a 13.98 us item,
// one round lost in many bubbles). A gated job's estimate is therefore the slope of busy time
// against rounds over the window (Theil-Sen: the median of the pairwise slopes, robust to a few
// slow slices) once its slices differ in rounds; the tail is the intercept (slice_tail: the
// median of busy - slope x rounds), which the planner takes from a slice's budget before it
// counts rounds (JobConfigModel::slice_tail_us), so a long slice is not charged a short one's
// tail per round and no slice plans its tail past the budget. A job skipped as too short in a row gets an occasional one-item probe so that a
// too-large prior gets measured at all, and a warning (once) when the streak reaches
// warn_after_bubbles.
//
// Everything here is fixed-size (std::array), sized at job creation: adding a sample or taking
// the quantile allocates nothing on the harvest path. Pure functions of the samples: the
// simulator's runs stay deterministic.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "pipefill/pipefill.h"

namespace pipefill::core {

// Measured per-worker item times of one configuration: the last kCapacity samples.
class CostWindow {
 public:
  // Small: the estimate follows a change of load within a few slices; odd count of the
  // window's median once full. 15 samples tolerate up to 7 outliers for the median.
  static constexpr size_t kCapacity = 15;

  // A per-round time (busy_us / rounds); `rounds` (>= 1) and `busy_us` are kept for the slope.
  void add(double sample_us, uint64_t rounds = 1, double busy_us = 0.0);
  // The q-quantile (nearest rank, q in (0, 1]) of the kept samples; 0 when there are none.
  double quantile(double q) const;
  // The Theil-Sen slope of busy time against rounds: the median of the slopes between every two
  // kept samples whose rounds differ. 0 when fewer than kMinSlopePairs such pairs are kept.
  double rounds_slope() const;
  static constexpr size_t kMinSlopePairs = 3;
  // The median of busy - slope x rounds over the kept samples (floored at 0).
  double tail_at(double slope) const;
  size_t kept() const { return kept_; }
  uint64_t total() const { return total_; }

 private:
  std::array<double, kCapacity> samples_{};
  std::array<double, kCapacity> rounds_{};  // the sample's rounds (as double: slope arithmetic)
  std::array<double, kCapacity> busy_{};    // the sample's busy time
  size_t next_ = 0;   // ring position of the next sample
  size_t kept_ = 0;   // valid samples (<= kCapacity)
  uint64_t total_ = 0;
};

// Quantile of a window the planner uses as the item cost, by job kind:
//  - gated work (ticket kernels, gated graphs): the median. The gate closes at the bubble's end,
//    so an estimate a little too small overruns by at most one item, and one too large only
//    leaves bubble time unused: the central, outlier-free estimate is the right one, and a few
//    slow slices (a busy rank, a preempted thread) do not move it.
//  - opaque work: a high quantile. Nothing stops opaque work once launched and it is planned in
//    whole items, so an estimate too small by e% overruns by e% of the whole slice; sizing it to
//    the slow end of recent items keeps that overrun rare, at the price of some unused time.
inline constexpr double kGatedCostQuantile = 0.5;
// A gated job's estimate rises above its prior only once this many samples agree: one slow first
// slice (cold caches, lazy initialisation, a moment of load - the host device's SM threads under a
// sanitizer measured 37x their item) would otherwise make every bubble "too short" and leave the
// job to the probes' back-off, the very starvation learning is meant to end. Lowering needs one
// sample (a too-large prior is the common case, and the gate bounds what an estimate too small
// costs: one item). Opaque jobs rise at once: nothing bounds their overrun.
inline constexpr size_t kGatedSamplesToRaise = 3;
inline constexpr double kOpaqueCostQuantile = 0.9;

// Probes: a job too short for any bubble gets one item on one worker after this many consecutive
// too-short bubbles, then after twice as many, up to the cap. A gated probe overruns by at most
// that one item (the gate stops the rest); an opaque probe too, but it is not stopped by the gate
// even after the bubble's end, so it starts later and backs off further.
inline constexpr uint32_t kFirstProbeAfterGated = 2;
inline constexpr uint32_t kMaxProbeIntervalGated = 64;
inline constexpr uint32_t kFirstProbeAfterOpaque = 4;
inline constexpr uint32_t kMaxProbeIntervalOpaque = 256;
// The warning's streak is RuntimeOptions::too_short_warn_bubbles (default 32,
// PIPEFILL_TOO_SHORT_WARN_BUBBLES): long enough that a job waiting a few bubbles for its first
// probe is not warned about, short enough to show within a second of a real pipeline.
// Predicted durations of the job's last too-short bubbles, kept for the warning.
inline constexpr size_t kRecentTooShort = 4;

// A job's cost state: one window per configuration, the too-short streak and the probes. Guarded
// by the runtime's state lock like the job's other progress fields.
struct JobCostModel {
  static constexpr size_t kMaxConfigs = 16;  // configurations learned; later ones keep the prior

  std::array<CostWindow, kMaxConfigs> windows{};
  bool gated = true;
  // The caller stated the item cost (pfGraphJobDesc_t.on_item_is_work == 2): the estimate stays
  // the prior, whatever the slices measure - items inside bubbles may run slower than alone, and
  // a user who measured the item alone must be able to say so (issue 32).
  bool fixed = false;
  // The items are a host thread's own work (pfGraphJobDesc_t.on_item_is_work, Python items): the
  // estimate is the window's fastest sample. Such items run slower inside bubbles whenever the
  // thread waits for the CPU or the GIL (a loaded machine, the trainer's other threads), and a
  // few slow slices raised the median past every bubble and starved the job (issue 32); the gate
  // bounds an estimate too small to one item's overrun, as for any gated job.
  bool fastest = false;
  // Bubbles in a row in which the job was planned and its estimated item did not fit the budget
  // (probe bubbles included: a probe is not a slice the planner believed would fit). Reset by a
  // regular slice that completed an item.
  uint32_t too_short_streak = 0;
  uint64_t too_short_bubbles = 0;     // all of them, over the job's life
  uint32_t next_probe_at = 0;         // streak at which the next probe is planned
  uint32_t probe_interval = 0;        // current back-off
  uint64_t probes = 0;                // probes harvested
  bool warned = false;                // the too-short warning fired (once per job)
  std::array<double, kRecentTooShort> recent_predicted_us{};  // ring, by too_short_bubbles
  std::array<double, kRecentTooShort> recent_budget_us{};

  void init(bool gated_kind);
  // The estimate of configuration `config`: the kind's quantile of its window, `prior_us` until
  // it has a sample (gated: at most `prior_us` until kGatedSamplesToRaise samples). A gated job
  // (not `fastest`) whose window has slices of different rounds takes the slope of busy time
  // against rounds instead (the per-item cost without the slice's tail), at most the median.
  double estimate(size_t config, double prior_us) const;
  // The slice's tail of `config`: the median of busy - slope x rounds over the window when the
  // estimate is the slope, else 0.
  double slice_tail(size_t config) const;
  // Samples measured for `config` over the job's life (0 beyond kMaxConfigs: not learned).
  uint64_t samples(size_t config) const {
    return config < windows.size() ? windows[config].total() : 0;
  }
  // A timed slice's measurement (items_done >= 1, workers >= 1). Returns the new estimate.
  double add_slice(size_t config, double busy_us, uint64_t items_done, int workers,
                   double prior_us);
  // Harvest of a bubble in which the job was too short (predicted: the bubble's prediction,
  // budget: the time its slice would have had).
  void note_too_short(double predicted_us, double budget_us);
  // A regular (not probe) slice completed an item: the streak and the probe back-off reset.
  void note_fitted();
  // A probe was harvested: the next one after a doubled interval.
  void note_probe();
  bool probe_due() const { return too_short_streak >= next_probe_at; }
  // The last up to kRecentTooShort predictions and budgets, oldest first, into the spans;
  // returns how many.
  size_t recent(std::span<double> predicted, std::span<double> budget) const;
};

}  // namespace pipefill::core
