// From a loaded config plus command-line overrides to the list of runs pipefill-sim makes (GPU
// counts x schedules). Shared by the CLI and the config-mutation test, so both go through the
// same validation: every override is range-checked naming its flag, every run knows which
// field or flag its GPU count and iteration count came from (for the work-bound messages).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cluster/cluster_sim.hpp"
#include "cluster/config_io.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cluster {

struct RunOverrides {
  std::optional<int> gpus, iterations, tensor, pipeline, global_batch, micro_batch, chunks, record_iteration,
      microbatch_group_size;
  std::optional<uint64_t> seed;
  std::optional<double> jitter, efficiency;
  // Issue 11: the strategy, the interference and the sensitivity knobs of docs/results.md.
  std::optional<double> mem_interference, comm_interference, min_bubble_us, max_arena_gib, arrivals_per_gpu_hour;
  std::optional<int> reserved_sms;
  bool no_optimizer_fill = false;  // --no-optimizer-fill
  bool optimizer_fill = false;     // --optimizer-fill
  std::string strategy;      // --strategy
  std::string mix;           // --mix "name=weight,..." (replaces the config's mix)
  bool no_fill = false;
  std::string schedule;      // --schedule (overrides the config's schedule and sweep)
  std::string schedule_csv;  // --schedule-csv (a PyTorch CSV op order)
  std::string sweep_gpus;    // --sweep-gpus "1024,2048"
  std::string policy;        // --policy
  SimBounds bounds;          // --max-* flags (defaults: SimBounds)
};

struct PlannedRun {
  ClusterSimSpec spec;       // ready for run_cluster_sim (GPU count applied) unless error is set
  int gpus = 0;
  std::string schedule;      // schedule name for the reports
  std::string error;         // why this combination cannot run (e.g. GPUs not a multiple of TP x PP)
};

// Fails (naming the flag or field) when an override or the combination is invalid as a whole;
// per-run problems (one sweep entry) go to PlannedRun::error.
pfResult_t plan_runs(const SimConfig& config, const RunOverrides& overrides, std::vector<PlannedRun>* runs);

}  // namespace pipefill::cluster
