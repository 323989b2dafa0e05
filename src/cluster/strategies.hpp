// Fill strategies of the cluster simulator: ours and the mechanisms of the systems a user would
// pick instead (naive co-location, FreeRide, Tally, the PipeFill paper), each written from its
// published description and code as a rule for what happens in one bubble on one GPU: when fill
// work starts, how much runs, what is still running when the bubble really ends, and what that
// costs the main job (waiting for SMs, co-running interference, stretched transfers).
// docs/simulator.md section 4.2 gives the formulas and the sources; the citations are repeated
// beside each rule in strategies.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/workload.hpp"

namespace pipefill::cluster {

enum class FillStrategy {
  Ours,          // prediction + margins, device gate, SM reservation (this project)
  Naive,         // ungated fill on every SM at the main job's priority, one hardware queue
  FreeRide,      // FreeRide as coded: host-admitted side-task steps, MPS priority, host polling
  FreeRideIdeal, // the same admission rule with no host latency and no 10 ms rounding
  Tally,         // Tally adapted to pipelines: preemptible persistent blocks, retreat at bubble end
  TallyAsCoded,  // Tally's own trigger: retreat when the next main kernel is launched
  PaperStyle,    // PipeFill paper: pieces fitted to the predicted bubble, no device gate
};

const char* strategy_name(FillStrategy s);
bool parse_strategy(const std::string& text, FillStrategy* out);
const char* strategy_choices();
// Every strategy, ours first (the order of the side-by-side tables).
std::vector<FillStrategy> all_strategies();

// Interference between fill work and the main job. Same parameter names, meaning and defaults as
// the device-level simulator's model (src/sim, docs/simulated-device.md), calibrated in the
// issue-11 research (arXiv 2604.22430, arXiv 2507.03114, NVIDIA/nccl#1428 and #1433). The load
// of a fill job is L = (its share of the SMs) x mem_intensity.
struct InterferenceModel {
  double mem_slowdown = 0.6;   // beta: main work beside fill runs (1 + beta L) times longer
  double comm_slowdown = 0.5;  // gamma: the transfer part of a comm kernel beside fill, (1 + gamma L)
};

// FreeRide's knobs as its code sets them (jiashu-z/freeride at 1994c371 / bb431753):
// ae/side_task_deepspeed/run_side_task.py `duration = ceil(median_step * 100) / 100 * 1.2`;
// src/freeride/scheduler_v1.py `time.sleep(0.01)`; src/freeride/task_v2.py `time.sleep(0.005)`
// after every pass of the task loop (also after each step).
struct FreeRideKnobs {
  double step_rounding_us = 10000.0;   // profiled median step rounded up to this
  double step_margin = 1.2;            // ... and multiplied by this: the admission duration
  double scheduler_poll_us = 10000.0;  // scheduler loop period (bubble start seen after U(0, this))
  double task_poll_us = 5000.0;        // task loop sleep (start seen after U(0, this); after each step)
};

// Tally's knobs (tally-project/tally include/tally/env.h, src/tally/scheduler/priority.cpp).
struct TallyKnobs {
  double preemption_budget_us = 100.0;  // PRIORITY_MAX_ALLOWED_PER_BLOCK_LATENCY_MS = 0.1
  double norm_speed = 0.9;              // transformed (PTB) kernel speed vs original (SHARING_USE_PTB_THRESHOLD)
  double signal_us = 10.0;              // host sees the event + cudaMemsetAsync of the retreat flag
  double relaunch_gap_us = 10.0;        // at most one low-priority kernel in flight: host gap between them
  double hp_arrival_us = 0.0;           // as coded: the next main kernel is intercepted this long after
                                        // the bubble begins (0: a pipeline engine whose CPU runs ahead)
};

// Everything simulate_bubble needs besides the bubble and the jobs.
struct StrategyParams {
  FillStrategy strategy = FillStrategy::Ours;
  bool gated = true;               // ours: ticket kernels / gated graphs (false: opaque, as before)
  double fill_sm_share = 1.0;      // f: SMs the fill may use / all SMs (ours: (sm_count - reserved) / sm_count)
  int sm_count = 132;
  bool reserved = false;           // some SMs are kept free for the main job (ours)
  double launch_overhead_us = 10.0;
  double gate_visibility_us = 2.0; // ours: stream-ordered gate write -> seen by the fill's blocks
  InterferenceModel interference;
  FreeRideKnobs freeride;
  TallyKnobs tally;
};

// The parameters a strategy runs with: its own knobs, FreeRide-ideal's zero host latency.
StrategyParams effective_params(const StrategyParams& p);

// Throughput of a job on a share f of the SMs relative to all of them: its memory-bound part
// (mem_intensity I) does not speed up with SMs, the rest does (Amdahl): 1 / ((1 - I) / f + I).
double partition_speed(double sm_share, double mem_intensity);

// One bubble on one GPU.
struct BubbleInput {
  double actual_us = 0.0;        // how long the bubble really lasts
  double predicted_us = 0.0;     // the predictor's quantile this strategy plans to (ours gated:
                                 // gated_prediction_quantile; the rest: prediction_quantile)
  double transfer_out_us = 0.0;  // bandwidth part of the p2p send that starts with the bubble
  double transfer_in_us = 0.0;   // ... of the p2p receive that ends it
  // > 0: a comm kernel runs through the whole bubble (the DP all-reduce window); this share of
  // its time is bandwidth (the rest is latency, which fill cannot stretch).
  double comm_window_share = 0.0;
};

// The job the GPU runs, as this strategy sees it.
struct JobView {
  double item_us = 1.0;            // time of one item (step) in the bubble, with this strategy's SMs
  double dedicated_item_us = 1.0;  // on a whole dedicated GPU
  double work_per_item = 1.0;
  double remaining_work = 0.0;     // work units left
  double mem_intensity = 0.5;
  double kernel_us = 50.0;
  double block_us = 20.0;
};

// A slice of whole items the planner fitted to the predicted bubble (ours, paper-style).
struct PlannedSegment {
  bool fill = false;
  uint64_t items = 0;
  double item_us = 0.0;
  double dedicated_item_us = 0.0;
  double work_per_item = 1.0;
};

// Where a bubble gets its fill jobs from (the cluster simulator's queue, or a test's hand-made job).
class JobSource {
 public:
  virtual ~JobSource() = default;
  // The GPU's current job, taking one from the queue at `at_us` (bubble-relative) when idle.
  virtual bool current(double at_us, JobView* out) = 0;
  // Ours and paper-style: the planner's slice for the current job when `consumed_us` of the
  // bubble is already used.
  virtual PlannedSegment plan(double consumed_us) = 0;
  // `work` units of the current job done, the last at `end_us`; completes it when none is left.
  virtual void consume(double work, double end_us) = 0;
  // A slice / step run / persistent launch of the current job on [start_us, end_us) with
  // `items` items (for traces; optional).
  virtual void record(double start_us, double end_us, double items) {
    (void)start_us;
    (void)end_us;
    (void)items;
  }
};

// What happened in the bubble. Delays are what the main job loses (µs), measured from the
// bubble's actual end.
struct BubbleOutcome {
  double filled_us = 0.0;          // fill busy time inside the bubble (incl. launch overhead)
  double post_us = 0.0;            // fill running after the bubble end
  double work_dedicated_us = 0.0;  // useful work, in dedicated-GPU time
  int segments = 0;                // slices / steps / persistent launches
  bool overran = false;            // fill still held SMs at the bubble end
  double first_block_us = 0.0;     // bubble end -> first block of the main kernel starts
  double sm_own_us = 0.0;          // bubble end -> the main kernel owns every SM it needs
  double yield_us = 0.0;           // main time lost waiting for SMs (lost SM-time / all SMs)
  double corun_us = 0.0;           // main work slowed by fill running beside it (beta)
  double comm_us = 0.0;            // transfers stretched by fill beside them (gamma)
  double main_delay_us() const { return yield_us + corun_us + comm_us; }
};

// Runs one bubble with one strategy. `rng` is used only by FreeRide-as-coded's host polling.
BubbleOutcome simulate_bubble(const StrategyParams& params, const BubbleInput& bubble, JobSource& jobs, Rng& rng);

}  // namespace pipefill::cluster
