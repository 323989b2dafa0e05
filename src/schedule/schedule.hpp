// Pipeline schedule generator: per-stage ordered operations for the schedules PyTorch and
// Megatron-LM run (GPipe, 1F1B, interleaved 1F1B with micro-batch groups, ZB-H1, ZB-V,
// interleaved zero bubble, looped BFS, DualPipeV) and for user-supplied op orders (PyTorch's CSV
// format, schedule/pytorch_csv.hpp), timed with per-stage costs and an alpha-beta point-to-point
// model, with the data-parallel gradient all-reduce and optimizer step at the iteration's end.
// Output: each stage's timeline and its bubbles. Used by the cluster simulator, the runtime's
// tests and the example engine (which executes the same op order for real).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipefill/pipefill.h"

namespace pipefill::schedule {

enum class ScheduleKind {
  GPipe,
  OneFOneB,
  Interleaved1F1B,  // Megatron-LM interleaving with micro-batch groups / PyTorch's rounds
  ZBH1,
  ZBV,              // PyTorch ScheduleZBVZeroBubble: 2 chunks per stage in a V
  InterleavedZB,    // PyTorch ScheduleInterleavedZeroBubble (ZB1P)
  LoopedBFS,        // PyTorch ScheduleLoopedBFS (breadth-first)
  DualPipeV,        // PyTorch ScheduleDualPipeV (DeepSeek's DualPipe, V variant)
  Custom            // op order given in ScheduleSpec::custom (e.g. a PyTorch CSV)
};

// Where the virtual stages (model chunks) live. Looped: chunk c of stage s is virtual stage
// c*p + s (Megatron, PyTorch's "loop" style). V: chunk 0 of stage s is virtual stage s, chunk 1
// is 2p-1-s (PyTorch's "v" style; the last virtual stage is on stage 0). Custom: a table.
enum class PlacementStyle { Looped, V, Table };

enum class OpType {
  Forward,         // forward of (microbatch, chunk)
  Backward,        // full backward (input + weight gradients)
  BackwardInput,   // ZB: input-gradient part (PyTorch "I")
  BackwardWeight,  // ZB: weight-gradient part (PyTorch "W")
  SendActivation,
  RecvActivation,
  SendGradient,
  RecvGradient,
  AllReduce,       // data-parallel gradient reduction
  OptimizerStep
};

struct StageCosts {
  double forward_us = 1.0;
  double backward_us = 2.0;  // full backward; zero-bubble kinds split it as (backward - weight) + weight
  double weight_us = 1.0;    // weight-gradient part (kinds with BackwardWeight ops)
  size_t weight_bytes = 0;       // parameters resident on the stage
  size_t optimizer_bytes = 0;    // optimizer state resident on the stage
  size_t activation_bytes = 0;   // per in-flight micro-batch (per chunk when chunks > 1)
};

struct Op {
  OpType type = OpType::Forward;
  int microbatch = -1;
  int chunk = 0;           // model chunk on this stage (0..chunks-1)
  int virtual_stage = -1;  // global index of the model chunk (PyTorch's stage_index)
  int peer_stage = -1;     // for send/recv
  // DualPipeV: this op and the next one form one overlapped F&B action (PyTorch OVERLAP_F_B).
  // Timed like PyTorch's runtime runs it: the two sub-actions back to back.
  bool overlapped_with_next = false;
  double start_us = 0.0;
  double end_us = 0.0;
};

// A schedule given as per-stage op orders (type, microbatch, virtual_stage and chunk set;
// times ignored), with the placement of its virtual stages. Built by the PyTorch CSV importer.
struct CustomSchedule {
  int stages = 0;
  int chunks = 0;
  int microbatches = 0;
  std::vector<int> stage_of_virtual;          // size stages * chunks
  std::vector<int> chunk_of_virtual;          // size stages * chunks
  std::vector<std::vector<Op>> order;         // one list per stage
  std::string source;                         // for messages (file name)
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 4;        // p
  int microbatches = 8;  // m
  int chunks = 1;        // v: model chunks per stage (looped kinds >= 1 or 2; ZBV/DualPipeV: 2)
  // Interleaved kinds: Megatron's microbatch_group_size_per_vp_stage (micro-batches that run
  // through one chunk before the next chunk starts). 0: PyTorch's rounds rule,
  // m / max(1, m / p), which is Megatron's default (p) whenever m % p == 0.
  int microbatch_group_size = 0;
  std::vector<StageCosts> costs;  // one per stage (per chunk costs = stage costs / chunks); empty: uniform default
  double p2p_latency_us = 0.0;    // alpha
  double p2p_bytes_per_us = 0.0;  // beta^-1 (0: infinite bandwidth)
  size_t p2p_message_bytes = 0;   // activation/gradient message size
  double allreduce_us = 0.0;      // DP gradient all-reduce at iteration end (0: none)
  double optimizer_us = 0.0;      // optimizer step at iteration end
  size_t device_memory_bytes = 0; // GPU memory (for free-memory of bubbles); 0: unknown
  std::shared_ptr<const CustomSchedule> custom;  // kind == Custom
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
  // Physical stage of each virtual stage (size stages x chunks): where a dependency comes from.
  std::vector<int> stage_of_virtual;
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

// Per-stage compute op order (no times) for the schedule: what an engine executes. Every op
// has its chunk and virtual_stage set. Fails (returns false, fills *error naming the value) on
// invalid specs (e.g. ZB-V with chunks != 2, interleaved micro-batch groups Megatron refuses).
bool stage_op_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order, std::string* error);

// Times the schedule (dependencies across stages + p2p latency) and extracts bubbles: every
// idle gap of a stage between time 0 (all stages start there) and the pipeline end (the last
// compute op of any stage) longer than min_bubble_us, plus the all-reduce window as a bubble of
// kind optimizer when allreduce_us > 0. Kinds and formulas: docs/simulator.md. A custom order
// that deadlocks fails naming the stages and the ops they wait on.
bool simulate(const ScheduleSpec& spec, Timeline* timeline, std::string* error,
              double min_bubble_us = 0.0);

// How the kind places its chunks, and how many chunks it runs with `requested` chunks asked
// for (ZBV/DualPipeV: 2; GPipe/1F1B/ZB-H1: 1; looped kinds: `requested`).
PlacementStyle placement_style(ScheduleKind kind);
int chunks_for(ScheduleKind kind, int requested);
bool uses_weight_split(ScheduleKind kind);  // kinds that run BackwardInput/BackwardWeight ops
// Physical stage holding virtual stage `vs` (placement styles Looped and V).
int stage_of_virtual(PlacementStyle style, int stages, int vs);

// Interleaved kinds: the micro-batch group size the spec runs with (explicit, or PyTorch's
// rounds rule); false with a message naming the values when Megatron / PyTorch refuse it.
bool interleaved_group_size(const ScheduleSpec& spec, int* group, std::string* error);

// Number of compute ops the spec's order holds (p x v x m x 2, or x 3 with the weight split),
// computed in 64 bits: what simulate() allocates, for callers that bound the work first.
uint64_t compute_op_count(const ScheduleSpec& spec);

const char* schedule_kind_name(ScheduleKind kind);
bool parse_schedule_kind(const std::string& text, ScheduleKind* out);
// "gpipe, 1f1b, interleaved, zbh1, zbv, interleaved-zb, looped-bfs or dualpipev" (for messages).
const char* schedule_kind_choices();

}  // namespace pipefill::schedule
