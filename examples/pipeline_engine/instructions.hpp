// Per-rank instruction lists of a Megatron/DeepSpeed-style pipeline engine, built from the
// schedule generator (src/schedule) and extended with PipeFill's bubble instructions.
//
// Every stage executes its list in order. Communication is split the way engines with separate
// communication streams do it: a Recv* instruction *posts* the receive on the stage's
// communication stream, WaitComm makes the compute stream wait for it. A recv that the no-fill
// schedule shows the stage idling on is wrapped as
//     RecvActivation, BubbleBegin, WaitComm, BubbleEnd
// so the bubble begins when the compute stream runs dry and ends when the data has arrived.
// The end-of-iteration ReduceGradients (the data-parallel all-reduce plus the cross-stage
// gradient-norm reduction Megatron does before the optimizer step) is a collective over all
// stages; the stages that finish early wait on it: the drain / optimizer bubble.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipefill/pipefill.h"
#include "schedule/schedule.hpp"

namespace engine {

enum class InstrType {
  LoadMicrobatch,
  Forward,
  Backward,
  SendActivation,
  RecvActivation,
  SendGradient,
  RecvGradient,
  WaitComm,         // compute stream waits for the last posted communication
  ReduceGradients,  // collective over all stages (posted on the communication stream)
  OptimizerStep,
  BubbleBegin,
  BubbleEnd,
  BackwardInput,    // zero-bubble kinds: input-gradient part of a backward (sends the gradient)
  BackwardWeight    // zero-bubble kinds: weight-gradient part (no communication)
};

const char* instr_name(InstrType type);

struct Instruction {
  InstrType type = InstrType::Forward;
  int microbatch = -1;
  int chunk = 0;
  int virtual_stage = -1;  // compute: this op's virtual stage; send/recv: the RECEIVER's
  int peer = -1;           // send/recv: the other physical stage
  int peer_chunk = -1;     // send/recv: the other side's chunk (the producer's, for a receive)
  // Bubble instructions: what the schedule predicts for this wait.
  pfBubbleKind_t bubble_kind = pfBubbleOther;
  double expected_us = 0.0;
  int bubble_index = -1;  // k-th bubble of the stage's iteration
};

std::string to_string(const Instruction& instruction);

// The model and hardware the engine runs, from the command-line flags.
struct ModelSpec {
  int hidden = 2048;
  int seq = 1024;
  int micro_batch = 1;
  int layers_per_stage = 2;
  double tflops = 400.0;          // achieved dense TFLOP/s of one GPU on the main job
  double hbm_gbps = 4000.0;       // memory bandwidth (optimizer step)
  double p2p_latency_us = 10.0;   // per message
  double p2p_gbps = 50.0;         // point-to-point bandwidth between stages
  double allreduce_us = 0.0;      // data-parallel gradient all-reduce (0: single replica)
};

struct PipelineSpec {
  pipefill::schedule::ScheduleKind kind = pipefill::schedule::ScheduleKind::OneFOneB;
  int stages = 4;
  int microbatches = 8;
  int chunks = 1;  // model chunks per stage (looped multi-chunk kinds; ZB-V / DualPipeV run 2)
  int microbatch_group_size = 0;  // interleaved kinds (schedule::ScheduleSpec::microbatch_group_size)
  // kind == Custom: the op order (a PyTorch CSV, schedule/pytorch_csv.hpp); stages, chunks and
  // micro-batches must match it.
  std::shared_ptr<const pipefill::schedule::CustomSchedule> custom;
  ModelSpec model;
  int sm_count = 132;
  int comm_sms = 8;            // SMs a communication kernel holds (NCCL CTAs)
  double min_bubble_us = 20.0; // shorter idle gaps are not marked as bubbles
};

// Kernel-level costs derived from the model (FLOP counting, like Megatron's estimates).
struct StageCosts {
  int layers_per_chunk = 0;
  double forward_layer_us = 0.0;   // 24 b s h^2 (1 + s / 6h) FLOPs / achieved FLOP/s
  double backward_layer_us = 0.0;  // 2x forward
  double backward_input_layer_us = 0.0;   // zero-bubble split: input gradients, 1x forward
  double backward_weight_layer_us = 0.0;  // zero-bubble split: weight gradients, 1x forward
  double load_us = 0.0;            // host-to-device copy of the micro-batch's token ids
  double optimizer_us = 0.0;       // Adam over the stage's parameters (memory bound)
  size_t message_bytes = 0;        // bf16 activations b x s x h
  double p2p_us = 0.0;             // latency + bytes / bandwidth
};

// Model chunks per stage the spec runs (the CSV's, 2 for ZB-V / DualPipeV, 1 for the
// single-chunk kinds, else spec.chunks).
int effective_chunks(const PipelineSpec& spec);
// True when the schedule needs what only the simulated transport executes today: the
// BackwardInput / BackwardWeight split or a non-looped (V, CSV table) placement.
bool needs_sim_transport(const PipelineSpec& spec);

// Validates the spec; false with a message naming the bad value.
bool validate(const PipelineSpec& spec, std::string* error);
StageCosts derive_costs(const PipelineSpec& spec);
pipefill::schedule::ScheduleSpec schedule_spec(const PipelineSpec& spec, const StageCosts& costs);

struct Programs {
  std::vector<std::vector<Instruction>> stages;  // one instruction list per stage
  pipefill::schedule::Timeline timeline;         // the no-fill schedule they come from
  std::vector<int> bubbles_per_stage;
};

// Builds each stage's instruction list from the schedule generator's op order and marks the
// waits the no-fill schedule idles on as bubbles.
bool build_programs(const PipelineSpec& spec, Programs* programs, std::string* error);

// Key of a point-to-point message: (gradient?, micro-batch, receiving virtual stage).
uint64_t message_key(bool gradient, int microbatch, int receiver_virtual_stage);

// Per bubble of a stage's program (by bubble_index): true when the wait it marks is the
// end-of-iteration collective (ReduceGradients) rather than a p2p receive.
std::vector<bool> bubbles_ending_in_collective(const std::vector<Instruction>& program);

}  // namespace engine
