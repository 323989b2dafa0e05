// Pipeline schedule generator: per-stage ordered operations for GPipe, 1F1B, interleaved 1F1B
// and ZB-H1, timed with per-stage costs and an alpha-beta point-to-point model, with the
// data-parallel gradient all-reduce and optimizer step at the iteration's end. Output: each
// stage's timeline and its bubbles. Used by the cluster simulator, the runtime's tests and the
// example engine (which executes the same op order for real).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pipefill/pipefill.h"

namespace pipefill::schedule {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, ZBH1 };

enum class OpType {
  Forward,         // forward of (microbatch, chunk)
  Backward,        // full backward (input + weight gradients)
  BackwardInput,   // ZB: input-gradient part
  BackwardWeight,  // ZB: weight-gradient part
  SendActivation,
  RecvActivation,
  SendGradient,
  RecvGradient,
  AllReduce,       // data-parallel gradient reduction
  OptimizerStep
};

struct StageCosts {
  double forward_us = 1.0;
  double backward_us = 2.0;  // full backward; for ZB-H1 split as (backward - weight) + weight
  double weight_us = 1.0;    // weight-gradient part (ZB-H1 only)
  size_t weight_bytes = 0;       // parameters resident on the stage
  size_t optimizer_bytes = 0;    // optimizer state resident on the stage
  size_t activation_bytes = 0;   // per in-flight micro-batch (per chunk when interleaved)
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 4;        // p
  int microbatches = 8;  // m
  int chunks = 1;        // v (interleaved); model chunks per stage
  std::vector<StageCosts> costs;  // one per stage (per chunk costs = stage costs / chunks); empty: uniform default
  double p2p_latency_us = 0.0;    // alpha
  double p2p_bytes_per_us = 0.0;  // beta^-1 (0: infinite bandwidth)
  size_t p2p_message_bytes = 0;   // activation/gradient message size
  double allreduce_us = 0.0;      // DP gradient all-reduce at iteration end (0: none)
  double optimizer_us = 0.0;      // optimizer step at iteration end
  size_t device_memory_bytes = 0; // GPU memory (for free-memory of bubbles); 0: unknown
};

struct Op {
  OpType type = OpType::Forward;
  int microbatch = -1;
  int chunk = 0;
  int peer_stage = -1;  // for send/recv
  double start_us = 0.0;
  double end_us = 0.0;
};

struct Bubble {
  int stage = 0;
  int index_in_iteration = 0;  // k-th bubble of this stage's iteration (the bubble class)
  double start_us = 0.0;
  double duration_us = 0.0;
  pfBubbleKind_t kind = pfBubbleOther;
  size_t free_bytes = 0;       // device memory minus weights, optimizer state, live activations
  // Position in the stage's op list: the bubble lies between ops[op_before] and ops[op_before+1]
  // (op_before = -1: before the first op).
  int op_before = -1;
};

struct StageTimeline {
  // Compute ops in execution order, timed, then AllReduce / OptimizerStep at the iteration end.
  // p2p transfers are asynchronous (they delay dependencies, not the stage) and not listed.
  std::vector<Op> ops;
  std::vector<Bubble> bubbles;
  double compute_us = 0.0;    // sum of compute op durations (forward/backward/weight)
  double bubble_us = 0.0;     // sum of pipeline bubble durations (all kinds but optimizer)
  double optimizer_bubble_us = 0.0;  // the all-reduce window bubble (kind optimizer), if any
  double last_compute_end_us = 0.0;  // end of this stage's last forward/backward/weight op
  int peak_in_flight = 0;     // most micro-batches (x chunks) whose activations are live at once
  size_t peak_activation_bytes = 0;  // peak_in_flight x activation_bytes
};

struct Timeline {
  std::vector<StageTimeline> stages;
  double iteration_us = 0.0;  // first op start to last op end over all stages
  // End of the last forward/backward/weight op over all stages: the pipeline part of the
  // iteration, before the all-reduce and optimizer step (which every stage starts here).
  double pipeline_us = 0.0;
  // Share of stage-time spent in bubbles (excluding all-reduce/optimizer), averaged:
  // mean over stages of bubble_us / pipeline_us. GPipe/1F1B uniform: (p-1)/(m+p-1).
  double bubble_share() const;
  // Pipeline bubble time relative to ideal compute time: sum(bubble_us) / sum(compute_us).
  // Interleaved 1F1B uniform: (p-1)/(v*m); GPipe/1F1B uniform: (p-1)/m.
  double bubble_ratio() const;
};

// Per-stage compute op order (no times) for the schedule: what an engine executes.
// Fails (returns false, fills *error) on invalid specs (e.g. interleaved with m % p != 0).
bool stage_op_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order, std::string* error);

// Times the schedule (dependencies across stages + p2p latency) and extracts bubbles: every
// idle gap of a stage between time 0 (all stages start there) and the pipeline end (the last
// compute op of any stage) longer than min_bubble_us, plus the all-reduce window as a bubble of
// kind optimizer when allreduce_us > 0. Kinds and formulas: docs/simulator.md.
bool simulate(const ScheduleSpec& spec, Timeline* timeline, std::string* error,
              double min_bubble_us = 0.0);

const char* schedule_kind_name(ScheduleKind kind);
bool parse_schedule_kind(const std::string& text, ScheduleKind* out);

}  // namespace pipefill::schedule
