// Cluster simulator: one training job on TP*PP*DP GPUs whose pipeline bubbles are filled with
// jobs from a shared queue. The bubble timeline is computed once per pipeline stage (every DP
// replica and TP rank of a stage has the same schedule); the filling is simulated per GPU and
// per iteration, so the cost is linear in GPUs x iterations. Placement and slicing go through
// the core's choose_setup_config / plan_slice / schedule_order, like the runtime's executor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cluster/model.hpp"
#include "cluster/strategies.hpp"
#include "cluster/work_bounds.hpp"
#include "cluster/workload.hpp"
#include "pipefill/pipefill.h"
#include "schedule/schedule.hpp"

namespace pipefill::cluster {

struct FillOptions {
  bool enabled = true;                // false: schedule-only baseline (no filling)
  pfSchedulePolicy_t policy = pfPolicyFifo;
  double efficiency = 0.85;           // fill throughput in a bubble vs a dedicated GPU
  double margin_us = -1.0;            // < 0: the runtime's default (RuntimeOptions)
  double margin_fraction = -1.0;      // < 0: the runtime's default
  double prediction_quantile = -1.0;  // < 0: the runtime's default; sizes ungated work (the
                                      // paper-style baseline, ours with gated false, FreeRide)
  double gated_prediction_quantile = -1.0;  // < 0: the runtime's default; sizes ours when gated
  int warmup_iterations = -1;         // iterations before filling starts; < 0: runtime min_samples
  double launch_overhead_us = 10.0;   // per slice
  double jitter = 0.0;                // actual bubble = nominal x (1 + jitter x U(-1, 1))
  double min_bubble_us = 0.0;         // bubbles shorter than this are not filled
  bool gated = true;                  // ticket kernels (gate stops at the bubble end) or opaque
  // Also fill the all-reduce window; off by default like the runtime's fill_optimizer_bubbles
  // (fill beside the collective stretches it on the critical path).
  bool fill_optimizer_bubble = false;
  // Side-by-side comparison (issue 11, docs/simulator.md section 4.2).
  FillStrategy strategy = FillStrategy::Ours;
  int reserved_sms = 0;               // ours: SMs kept free for the main job (fill uses the rest)
  double gate_visibility_us = 2.0;    // ours: gate write at the bubble end -> seen by the fill's blocks
  double max_arena_gib = 0.0;         // > 0: cap on the memory a fill job may use per GPU
  FreeRideKnobs freeride;
  TallyKnobs tally;
};

struct ClusterSimSpec {
  TrainingSpec training;
  FillOptions fill;
  InterferenceModel interference;     // beta / gamma (strategies.hpp); shared with src/sim
  WorkloadSpec workload;
  std::vector<FillJobType> job_types;
  int iterations = 100;
  int record_iteration = -1;          // iteration whose fill slices are recorded; -1: the last
  SimBounds bounds;                   // refuse runs whose work would exceed these (work_bounds.hpp)
  RunFieldNames names;                // where gpus / iterations came from, for messages
};

// A fill slice of the recorded iteration on the first GPU of a stage (for plots and traces).
struct FillSlice {
  int stage = 0;
  int bubble_index = 0;
  double start_us = 0.0;
  double busy_us = 0.0;     // launch overhead + items (may run past the bubble end: overrun)
  int job_type = -1;
  uint64_t job = 0;
  uint64_t items = 0;
};

struct StageSummary {
  int stage = 0;
  int bubbles_per_iteration = 0;
  double compute_us = 0.0;           // per iteration
  double bubble_us = 0.0;            // pipeline bubbles per iteration (nominal)
  double optimizer_bubble_us = 0.0;  // all-reduce window per iteration
  double filled_share = 0.0;         // fill busy time / fillable bubble time, this stage's GPUs
  size_t arena_bytes = 0;            // memory free through the whole iteration (for residents)
  int peak_in_flight = 0;
};

struct ClusterResult {
  // Shape.
  int gpus = 0, tensor = 0, pipeline = 0, data = 0, microbatches = 0, chunks = 1, iterations = 0;
  std::string schedule;
  // Main job, per iteration (nominal, without fill-induced slowdown).
  double iteration_us = 0.0;
  double pipeline_us = 0.0;
  double bubble_share = 0.0;        // Timeline::bubble_share(): pipeline bubbles / pipeline time
  double bubble_ratio = 0.0;        // pipeline bubble time / compute time
  double idle_share = 0.0;          // all bubbles incl. all-reduce window / iteration time
  double main_busy_share = 0.0;     // compute time / iteration time, averaged over GPUs
  double main_mfu = 0.0;            // model FLOPs / (GPUs x peak x iteration time)
  // Filling (totals over all GPUs and iterations).
  double fillable_bubble_us = 0.0;  // actual (jittered) durations of the bubbles considered
  double filled_us = 0.0;           // fill busy time inside bubbles
  double filled_share = 0.0;        // filled_us / fillable_bubble_us
  double fill_work_dedicated_us = 0.0;  // useful fill work in dedicated-GPU time
  double fill_gpu_equivalents = 0.0;    // fill_work_dedicated_us / (iterations x iteration_us)
  double utilisation_gain = 0.0;    // fill_gpu_equivalents / (GPUs x main_busy_share)
  // Main-job slowdown: per GPU and iteration, the sum over its bubbles of the main time lost to
  // the fill (waiting for SMs + co-running interference + stretched transfers); the mean over
  // iterations of its max over GPUs (every GPU's delay assumed to delay the synchronous
  // iteration), / iteration time.
  double slowdown_fraction = 0.0;
  double mean_gpu_overrun_fraction = 0.0;  // the same, mean over GPUs instead of max
  // The per-GPU mean split by cause (they add up to mean_gpu_overrun_fraction).
  double yield_fraction = 0.0, corun_fraction = 0.0, comm_fraction = 0.0;
  uint64_t slices = 0;
  uint64_t overrun_slices = 0;      // bubbles whose fill still held SMs at the bubble end
  double post_us = 0.0;             // fill running time after bubble ends (all GPUs)
  // Fill throughput vs a dedicated GPU: while the fill runs (useful work / fill running time,
  // in and after bubbles), and per second of fillable bubble (= filled share x that, plus the
  // work done past bubble ends).
  double fill_rate = 0.0;
  double fill_per_bubble_second = 0.0;
  // Bubble end -> main kernel, over the fillable bubbles of the filled iterations, µs: its first
  // block starts; it owns every SM it needs; the main time lost there (waiting + co-running).
  double first_block_p50_us = 0.0, first_block_p99_us = 0.0;
  double sm_own_p50_us = 0.0, sm_own_p99_us = 0.0;
  double end_delay_p50_us = 0.0, end_delay_p99_us = 0.0;
  uint64_t bubble_visits = 0;       // fillable bubbles of the filled iterations, all GPUs
  // What the run assumed (stated in every table).
  std::string strategy = "ours";
  InterferenceModel interference;
  int reserved_sms = 0;
  int sm_count = 0;
  // Jobs.
  uint64_t jobs_generated = 0, jobs_arrived = 0, jobs_started = 0, jobs_completed = 0, jobs_unplaceable = 0;
  double completion_mean_s = 0.0, completion_p50_s = 0.0, completion_p95_s = 0.0;
  double wait_mean_s = 0.0;         // arrival to start, started jobs
  std::vector<uint64_t> completed_per_type;
  std::vector<StageSummary> stages;
  // One stage timeline (shared by every GPU of the stage) and the recorded fill slices.
  schedule::Timeline timeline;
  std::vector<FillSlice> recorded_slices;
  int recorded_iteration = -1;
  std::string note;                 // how GPUs were aggregated, stated in outputs
};

using ProgressFn = std::function<void(int iterations_done, int iterations_total)>;

pfResult_t run_cluster_sim(const ClusterSimSpec& spec, ClusterResult* out, const ProgressFn& progress = {});

// Sets parallel.data = gpus / (tensor x pipeline); fails naming `field` and the value when it
// does not divide.
pfResult_t set_gpu_count(TrainingSpec* spec, int gpus, const std::string& field = "the GPU count");

// Value ranges of the fill options and the workload (docs/simulator.md section 5).
pfResult_t validate_fill_options(const FillOptions& fill, int iterations, const std::string& iterations_field = "iterations");
pfResult_t validate_workload(const WorkloadSpec& workload);
pfResult_t validate_interference(const InterferenceModel& model);

}  // namespace pipefill::cluster
