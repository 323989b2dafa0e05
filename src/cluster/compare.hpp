// Side-by-side comparison of the fill strategies (issue 11 items 3 and 5): one training job,
// one fill-job workload and one seed, run with no fill, each peer's mechanism and ours; a table
// of the four headline metrics with each strategy's ratio to ours, a sensitivity table over the
// interference parameters, and the project's targets printed as met / missed. Shared by
// pipefill-sim --compare and bench_cluster_sim. Every figure is simulator output: the tables
// say which interference they assumed.
#pragma once

#include <string>
#include <vector>

#include "cluster/cluster_sim.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cluster {

struct ComparisonRow {
  std::string name;  // "none" or strategy_name()
  bool fill = true;
  FillStrategy strategy = FillStrategy::Ours;
  ClusterResult result;
};

// A sensitivity row: the same runs at another interference setting (slowdown per strategy).
struct SensitivityRow {
  std::string label;
  InterferenceModel interference;
  std::vector<ComparisonRow> rows;  // the fill strategies only, in all_strategies() order
};

struct Comparison {
  InterferenceModel interference;     // what the main table assumed
  std::vector<ComparisonRow> rows;    // "none" first, then all_strategies()
  std::vector<SensitivityRow> sensitivity;
  const ComparisonRow* find(const std::string& name) const;
};

// The interference settings of the sensitivity table: none, low, the calibrated default and high
// (issue-11 research section 2.4: (0, 0), (0.2, 0.1), (0.6, 0.5), (1.6, 2.2)).
std::vector<std::pair<std::string, InterferenceModel>> interference_sensitivity_points();

// Runs `spec` (its fill options and interference are the base) once with fill disabled and once
// per strategy; with `sensitivity`, again at each interference_sensitivity_points() entry.
pfResult_t run_comparison(const ClusterSimSpec& spec, bool sensitivity, Comparison* out);

// Slowdown-vs-filled frontier (issue 32 item 4): each strategy across its own knob, same spec.
// Ours: gated_prediction_quantile; paper-style: prediction_quantile; FreeRide(-ideal): the step
// admission margin (FreeRideKnobs::step_margin). Naive and Tally have no knob in this model: their
// one default point each.
struct FrontierPoint {
  std::string knob;  // "" for a strategy's one point
  double value = 0.0;
  ComparisonRow row;
};
pfResult_t run_frontier(const ClusterSimSpec& spec, std::vector<FrontierPoint>* out);
// The table, with ours' slowdown on its curve (straight between its points) at each other point's
// filled share and the verdict.
std::string frontier_report(const std::vector<FrontierPoint>& points);

// The targets of docs/results.md (design brief section 4).
struct Targets {
  double max_slowdown = 0.005;          // ours: main-job slowdown <= 0.5%
  double min_filled_share = 0.90;       // >= 90% of fillable bubble time filled
  double min_fill_per_bubble_s = 0.85;  // fill throughput per bubble-second >= 0.85 of a dedicated GPU
  double max_sm_own_p99_us = 50.0;      // bubble end -> main kernel owns its SMs, p99 <= 50 µs
};

struct TargetCheck {
  std::string what;
  std::string value;
  bool met = false;
};

// The targets evaluated on ours (and "ours ahead of every baseline on slowdown at equal or
// better filled share", one line per baseline).
std::vector<TargetCheck> check_targets(const Comparison& c, const Targets& targets = Targets{});

// The assumptions line every table carries.
std::string interference_statement(const InterferenceModel& m, const ClusterResult& ours);
// Main table, ratio table, sensitivity table and targets, as text.
std::string comparison_report(const Comparison& c, const Targets& targets = Targets{});

}  // namespace pipefill::cluster
