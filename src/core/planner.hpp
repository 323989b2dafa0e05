// The planner: how much of which configuration of a job fits one bubble. Shared by the runtime
// executor and the cluster simulator, so they cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "pipefill/pipefill.h"

namespace pipefill {

struct JobConfigModel {
  double item_cost_us = 0.0;           // time one worker needs for one item
  // A slice's time beyond rounds x item_cost_us (the spread of its workers' last items, learned:
  // cost_model.hpp); taken from the budget before the rounds are counted.
  double slice_tail_us = 0.0;
  int parallelism = 0;                 // items in flight; 0 = as many as fill SMs allow
  size_t resident_bytes = 0;           // stays in the arena for the job's life
  size_t workspace_bytes_per_item = 0; // per in-flight item, from the bubble's memory
  double work_per_item = 1.0;          // useful work units per item
  // SMs one worker holds while it runs, in SM x us packing (0 or 1: one, a ticket block). A graph
  // job's worker runs the graph's kernels one item after another: it holds the SMs the graph
  // uses, the whole fill partition when that is unknown.
  int sms_per_worker = 0;
};

struct PlanRequest {
  double predicted_us = 0.0;   // predicted bubble duration (already the kind's quantile)
  double margin_us = 0.0;      // absolute safety margin
  double margin_fraction = 0.0;// fraction of predicted_us also subtracted
  double launch_overhead_us = 0.0; // fixed cost of starting a slice
  size_t free_bytes = 0;       // memory available for workspace in this bubble
  int fill_sms = 0;            // workers (blocks) the fill partition allows
  uint64_t remaining_items = 0;
  bool gated = true;           // ticket kernel (gated) or opaque work
  // Configs whose resident bytes exceed this are not eligible (the job was set up with a
  // smaller resident share). Default: no limit.
  size_t resident_limit = SIZE_MAX;
  // Concurrent fill (the runtime's slice launcher): the slice holds its SMs for the whole
  // budget, so a job with fewer items than fill_sms x budget takes only the SMs it needs -
  // ceil(items / items per worker) - and leaves the rest to the next job packed into the bubble.
  // false (the cluster simulator's sequential model): every worker, for as few rounds as needed.
  bool pack_sms = false;
};

struct SlicePlan {
  bool fill = false;
  int config_index = -1;
  uint64_t items = 0;          // item budget
  int workers = 0;             // parallelism used (items in flight)
  int sms = 0;                 // SMs the slice holds: workers x the config's SMs per worker
  double expected_us = 0.0;    // predicted execution time of the slice
  size_t workspace_bytes = 0;
  double work = 0.0;           // useful work units planned
  // A one-item probe of a job whose estimated item fits no bubble (cost_model.hpp): planned by
  // the slice launcher, not by plan_slice, so that the job's real cost gets measured.
  bool probe = false;
  std::string reason;          // why no fill (empty when fill)
  pfSkipCause_t cause = pfSkipOther;  // the reason's category, counted per skipped bubble
};

// Picks the configuration with the highest work per µs that fits the memory, then the number
// of items that complete within predicted*(1-fraction) - margin - overhead. Gated work may be
// planned up to the time budget (the gate bounds overrun); opaque work only in whole items
// whose total duration fits the budget.
SlicePlan plan_slice(const PlanRequest& request, std::span<const JobConfigModel> configs);

// A one-item probe of configs[config_index] on one worker, granted the request's whole budget:
// for a job whose estimated item is longer than every bubble (the estimate may be wrong; only a
// measurement tells). Only the resources are checked (resident limit, one worker's SMs, one
// item's workspace, a positive budget, an item left); fill false with the reason otherwise.
SlicePlan plan_probe(const PlanRequest& request, std::span<const JobConfigModel> configs,
                     int config_index);

// Config to set the job up with: best throughput with unconstrained bubble memory, among those
// whose resident bytes fit `arena_free`. -1 when none fits.
int choose_setup_config(std::span<const JobConfigModel> configs, size_t arena_free, int fill_sms);

}  // namespace pipefill
