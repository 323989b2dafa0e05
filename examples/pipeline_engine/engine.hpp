// The example pipeline engine: runs each stage's instruction list through a Transport, with one
// PipeFill runtime per stage, and measures every iteration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../fill_jobs/fill_jobs.h"
#include "instructions.hpp"
#include "transport.hpp"

namespace engine {

// How fill work gets into the bubbles. PipeFill is this library; the others are the baselines
// a user would pick instead, each written from its published description (engine.cpp and
// sim_transport.cpp cite them). The peers (FreeRide, Tally, PaperStyle) run on the simulated
// transport only.
enum class FillMode { None, PipeFill, Naive, FreeRide, Tally, PaperStyle };

const char* fill_mode_name(FillMode mode);
// "none", "pipefill", "naive", "freeride", "tally", "paper"; false for anything else.
bool parse_fill_mode(const std::string& name, FillMode* out);


// The lead of the benchmarks' "PipeFill+notice" rows (EngineOptions::notice_lead_us): the
// notice's own trip (the example's p2p latency, 10 us), so the receiver closes its fill at the
// sender's nominal send, and the items in flight drain while the message's latency passes,
// before its bytes move. docs/results-peers.md has the curve across leads.
constexpr double kDefaultNoticeLeadUs = 10.0;

struct EngineOptions {
  PipelineSpec pipeline;
  int iterations = 8;
  std::string transport = "auto";  // sim | emulated | nccl | host | auto
  std::string fill = "mlp";        // none | mlp | encoder | train
  int fill_execution = -1;         // fjExecution_t; -1: the kind's default
  uint64_t fill_items = 0;         // 0: the kind's default
  double fill_item_cost_us = 0.0;  // > 0: the fill job's item cost (host: each item takes this
                                   // long on an SM thread); 0: the kind's FLOP-derived cost
  uint64_t keep_every = 4096;      // inference: compute/keep every Nth item's output on the sim
  uint64_t seed = 1;
  double jitter = 0.0;
  // Simulated interference, the calibrated defaults of pfSimDeviceDesc_t (beta, beta_f, gamma;
  // docs/simulated-device.md). Set all three to 0 for the old, interference-free device.
  double interference = 0.6;
  double fill_slowdown = 0.6;
  double comm_slowdown = 0.5;
  bool hint_durations = false;     // pass the schedule's expected bubble durations as hints
  // The runtime's safety_margin_us for every stage. < 0: the p2p time of the receive that ends a
  // bubble (latency + its bytes / p2p bandwidth), at least the runtime's default 20 us, so that
  // fill stops before the peer sends the message it would otherwise slow (comm interference,
  // gamma, set by the fill load when the send starts).
  double margin_us = -1.0;
  // The runtime's safety_margin_fraction for every stage. 0: margin_us already covers the known
  // tail of each bubble (the receive's transfer) and the gated prediction quantile covers the
  // spread of a class's durations; the paper-style baseline fits its pieces with the same margins.
  double margin_fraction = 0.0;
  // Per bubble class (pfRuntimeSetClassMargin): a bubble that ends in the end-of-iteration
  // collective moving no bytes (allreduce_us 0: a wait for the other stages) gets margin 0 - no
  // transfer at its end for fill to slow, and the gate stops the fill at its end - instead of
  // the receive's p2p time; the paper-style baseline fits its pieces with the same margins. Only
  // where the engine resolves the margin itself (margin_us < 0, not the host transport).
  bool class_margins = true;
  // The fill mode's own knob, for its slowdown-vs-filled frontier (frontier.hpp); < 0: the mode's
  // default. PipeFill: gated_prediction_quantile (0.5); naive: share of the expected bubble its
  // ungated work is sized to (1); FreeRide-style: the admission pad, a step starts while
  // k x step + pad x step fits (1.2); Tally-style: share of the SMs its persistent kernel takes
  // (1); paper-style: the prediction quantile its pieces are fitted to (0.1).
  double mode_knob = -1.0;
  // The sending stage's notice (sender_notice.hpp): each sender tells its receiver this many us
  // before its send (each stage the others before its arrival at the collective), and the
  // receiver closes the fill of the bubble waiting for it (pfBubbleCloseFill); its gated work is
  // then planned to the class's longest bubble. < 0: off.
  // PipeFill mode on the simulated transport only.
  double notice_lead_us = -1.0;
  // Sim transport: fill accounting (RunResult::filled_sm_us ...) counts iterations from this
  // one on (the predictor's warm-up is left out).
  int warm_iterations = 2;
  std::string trace_prefix;        // write <prefix>.stage<N>.json Chrome traces
};

struct IterationResult {
  double time_us = 0.0;
  double bubble_us = 0.0;   // summed over stages
  double filled_us = 0.0;   // fill execution inside bubbles, summed over stages
  double overrun_us = 0.0;
  uint64_t items = 0;       // fill items completed in this iteration (all stages)
  uint64_t bubbles = 0;
  uint64_t bubbles_filled = 0;
};

// One bubble class of a stage over the counted iterations (pfClassStats_t differences).
struct ClassSummary {
  std::string key;
  uint64_t bubbles = 0, bubbles_filled = 0;
  double bubble_us = 0.0, filled_us = 0.0;
  uint64_t items = 0;
  uint64_t skips[PF_SKIP_CAUSE_COUNT] = {};
};

struct StageFillSummary {
  uint64_t items_completed = 0;  // the runtime's count
  int job_status = pfJobPending;
  double learned_cost_us = 0.0;  // the item cost the planner uses at the end (pfJobGetCostInfo)
  fjProgress_t progress{};       // the job's own count (simulated and host backends)
  double eval_loss_before = 0.0, eval_loss_after = 0.0;  // training
  // The runtime's statistics of this stage over the iterations from `warm_iterations` on.
  uint64_t counted_bubbles = 0, counted_items = 0;
  double counted_bubble_us = 0.0, counted_filled_us = 0.0;
  std::vector<ClassSummary> classes;
};

struct RunResult {
  std::string transport;
  FillMode mode = FillMode::None;
  std::vector<IterationResult> iterations;
  std::vector<StageFillSummary> stages;
  double max_overrun_us = 0.0;
  double host_begin_end_ns = 0.0;
  uint64_t naive_items = 0;
  // Per bubble: its end to the start of the stage's next main-job kernel (sim transport).
  std::vector<double> resume_delays_us;
  // Sim transport, every mode alike: per bubble, its end to the first block of the stage's next
  // main-job kernel (from the simulated device's activity log).
  std::vector<double> first_block_delays_us;
  std::vector<double> all_blocks_delays_us;  // ... to its last block: it holds every SM it needs
  // Sim transport, every mode alike, over the iterations from `warm_iterations` on: fill item
  // work (nominal item cost, SM x us) inside the bubbles, the bubbles' length, and all fill
  // item work done. Filled share = filled_sm_us / (bubble_us x fill-usable SMs).
  double filled_sm_us = 0.0;
  double bubble_us = 0.0;
  double item_work_sm_us = 0.0;
  double transfer_free_us = 0.0;  // Transport::FillAccounting::transfer_free_us
  double item_cost_us = 0.0;  // nominal cost of one item on one SM
};

// Resolves the fill-kind name to fjKind_t (-1 for "none", -2 when unknown).
int parse_fill_kind(const std::string& name);

// Picks the transport for options.transport ("auto": NCCL with >= stages GPUs, emulated with
// one GPU, else sim).
Status choose_transport(const EngineOptions& options, std::unique_ptr<Transport>* out);

// The safety margin the engine gives each stage's runtime (options.margin_us, resolved); -1 on
// the host transport unless set: the runtime's own default.
double engine_margin_us(const EngineOptions& options, const StageCosts& costs);
// Per bubble index of a stage's program: the margin the engine gives that bubble's class, or -1
// for the stage's margin (engine_margin_us); see EngineOptions::class_margins.
std::vector<double> engine_class_margins_us(const EngineOptions& options, const StageCosts& costs,
                                            const std::vector<Instruction>& program);

// Runs `options.iterations` iterations with the given fill mode on a fresh transport.
Status run_engine(const EngineOptions& options, FillMode mode, RunResult* result);
// The same on a transport the caller made (and reads afterwards, e.g. the host transport's
// timeline); the transport is opened and closed by the run.
Status run_engine_on(Transport& transport, const EngineOptions& options, FillMode mode,
                     RunResult* result);

}  // namespace engine
