#include "instructions.hpp"

#include <fmt/format.h>

#include <cmath>

namespace engine {

namespace sched = pipefill::schedule;

const char* instr_name(InstrType type) {
  switch (type) {
    case InstrType::LoadMicrobatch: return "LoadMicrobatch";
    case InstrType::Forward: return "Forward";
    case InstrType::Backward: return "Backward";
    case InstrType::SendActivation: return "SendActivation";
    case InstrType::RecvActivation: return "RecvActivation";
    case InstrType::SendGradient: return "SendGradient";
    case InstrType::RecvGradient: return "RecvGradient";
    case InstrType::WaitComm: return "WaitComm";
    case InstrType::ReduceGradients: return "ReduceGradients";
    case InstrType::OptimizerStep: return "OptimizerStep";
    case InstrType::BubbleBegin: return "BubbleBegin";
    case InstrType::BubbleEnd: return "BubbleEnd";
    case InstrType::BackwardInput: return "BackwardInput";
    case InstrType::BackwardWeight: return "BackwardWeight";
  }
  return "?";
}

std::string to_string(const Instruction& in) {
  switch (in.type) {
    case InstrType::Forward:
    case InstrType::Backward:
    case InstrType::BackwardInput:
    case InstrType::BackwardWeight:
    case InstrType::LoadMicrobatch:
      return fmt::format("{}(mb={}, chunk={})", instr_name(in.type), in.microbatch, in.chunk);
    case InstrType::SendActivation:
    case InstrType::SendGradient:
      return fmt::format("{}(mb={}, to stage {})", instr_name(in.type), in.microbatch, in.peer);
    case InstrType::RecvActivation:
    case InstrType::RecvGradient:
      return fmt::format("{}(mb={}, from stage {})", instr_name(in.type), in.microbatch, in.peer);
    case InstrType::BubbleBegin: {
      static const char* const kinds[] = {"other", "warmup", "cooldown", "drain", "optimizer"};
      const int k = static_cast<int>(in.bubble_kind);
      return fmt::format("BubbleBegin(#{}, {}, expected {:.1f} us)", in.bubble_index,
                         k >= 0 && k < pfBubbleKindCount ? kinds[k] : "?", in.expected_us);
    }
    default:
      return instr_name(in.type);
  }
}

uint64_t message_key(bool gradient, int microbatch, int receiver_virtual_stage) {
  return (static_cast<uint64_t>(gradient) << 62) |
         (static_cast<uint64_t>(static_cast<uint32_t>(microbatch)) << 24) |
         static_cast<uint64_t>(static_cast<uint32_t>(receiver_virtual_stage) & 0xFFFFFFu);
}

int effective_chunks(const PipelineSpec& spec) {
  if (spec.kind == sched::ScheduleKind::Custom) return spec.custom ? spec.custom->chunks : spec.chunks;
  return sched::chunks_for(spec.kind, spec.chunks);
}

bool needs_sim_transport(const PipelineSpec& spec) {
  if (sched::uses_weight_split(spec.kind)) return true;
  if (sched::placement_style(spec.kind) != sched::PlacementStyle::Looped) return true;
  return false;
}

bool validate(const PipelineSpec& s, std::string* error) {
  auto bad = [&](std::string message) {
    if (error) *error = std::move(message);
    return false;
  };
  const ModelSpec& m = s.model;
  if (s.stages < 1) return bad(fmt::format("--stages must be >= 1, got {}", s.stages));
  if (s.microbatches < 1)
    return bad(fmt::format("--microbatches must be >= 1, got {}", s.microbatches));
  if (s.chunks < 1) return bad(fmt::format("--chunks must be >= 1, got {}", s.chunks));
  if (s.kind == sched::ScheduleKind::Custom) {
    if (!s.custom) return bad("a custom schedule needs its op order (--schedule-csv)");
    if (s.custom->stages != s.stages || s.custom->microbatches != s.microbatches)
      return bad(fmt::format("the schedule CSV has {} ranks and {} micro-batches; --stages is {} and "
                             "--microbatches {}", s.custom->stages, s.custom->microbatches, s.stages,
                             s.microbatches));
  }
  const int chunks = effective_chunks(s);
  if (m.hidden < 1) return bad(fmt::format("--hidden must be >= 1, got {}", m.hidden));
  if (m.seq < 1) return bad(fmt::format("--seq must be >= 1, got {}", m.seq));
  if (m.micro_batch < 1)
    return bad(fmt::format("--micro-batch must be >= 1, got {}", m.micro_batch));
  if (m.layers_per_stage < 1)
    return bad(fmt::format("--layers-per-stage must be >= 1, got {}", m.layers_per_stage));
  if (m.layers_per_stage % chunks != 0)
    return bad(fmt::format("--layers-per-stage {} must be a multiple of the {} chunks per stage {} runs",
                           m.layers_per_stage, chunks, sched::schedule_kind_name(s.kind)));
  if (!(m.tflops > 0) || !std::isfinite(m.tflops))
    return bad(fmt::format("--tflops must be > 0, got {}", m.tflops));
  if (!(m.hbm_gbps > 0) || !std::isfinite(m.hbm_gbps))
    return bad(fmt::format("HBM bandwidth must be > 0, got {}", m.hbm_gbps));
  if (!(m.p2p_latency_us >= 0) || !std::isfinite(m.p2p_latency_us))
    return bad(fmt::format("--p2p-latency-us must be >= 0, got {}", m.p2p_latency_us));
  if (!(m.p2p_gbps > 0) || !std::isfinite(m.p2p_gbps))
    return bad(fmt::format("--p2p-gbps must be > 0, got {}", m.p2p_gbps));
  if (!(m.allreduce_us >= 0) || !std::isfinite(m.allreduce_us))
    return bad(fmt::format("--allreduce-us must be >= 0, got {}", m.allreduce_us));
  if (s.sm_count < 2) return bad(fmt::format("--sms must be >= 2, got {}", s.sm_count));
  if (s.comm_sms < 1 || s.comm_sms >= s.sm_count)
    return bad(fmt::format("--comm-sms must be in [1, {}), got {}", s.sm_count, s.comm_sms));
  if (!(s.min_bubble_us >= 0))
    return bad(fmt::format("--min-bubble-us must be >= 0, got {}", s.min_bubble_us));
  return true;
}

StageCosts derive_costs(const PipelineSpec& spec) {
  const ModelSpec& m = spec.model;
  StageCosts c;
  c.layers_per_chunk = m.layers_per_stage / effective_chunks(spec);
  const double b = m.micro_batch, s = m.seq, h = m.hidden;
  const double layer_flops = 24.0 * b * s * h * h * (1.0 + s / (6.0 * h));
  const double flops_per_us = m.tflops * 1e6;
  c.forward_layer_us = layer_flops / flops_per_us;
  c.backward_layer_us = 2.0 * c.forward_layer_us;
  // The weight-gradient GEMMs repeat the forward's FLOPs: half of the backward each.
  c.backward_input_layer_us = c.forward_layer_us;
  c.backward_weight_layer_us = c.backward_layer_us - c.backward_input_layer_us;
  c.load_us = b * s * 8.0 / 25e3;  // int64 token ids over a 25 GB/s host link
  // Adam with fp32 master weights: ~32 bytes of HBM traffic per parameter (12 h^2 per layer).
  const double params = 12.0 * h * h * m.layers_per_stage;
  c.optimizer_us = params * 32.0 / (m.hbm_gbps * 1e3);
  c.message_bytes = static_cast<size_t>(b * s * h * 2.0);  // bf16
  c.p2p_us = m.p2p_latency_us + static_cast<double>(c.message_bytes) / (m.p2p_gbps * 1e3);
  return c;
}

sched::ScheduleSpec schedule_spec(const PipelineSpec& spec, const StageCosts& c) {
  sched::ScheduleSpec out;
  out.kind = spec.kind;
  out.stages = spec.stages;
  out.microbatches = spec.microbatches;
  out.chunks = effective_chunks(spec);
  out.microbatch_group_size = spec.microbatch_group_size;
  out.custom = spec.custom;
  sched::StageCosts stage;
  stage.forward_us = c.forward_layer_us * spec.model.layers_per_stage;
  stage.backward_us = c.backward_layer_us * spec.model.layers_per_stage;
  stage.weight_us = c.backward_weight_layer_us * spec.model.layers_per_stage;
  out.costs.assign(static_cast<size_t>(spec.stages), stage);
  out.p2p_latency_us = spec.model.p2p_latency_us;
  out.p2p_bytes_per_us = spec.model.p2p_gbps * 1e3;
  out.p2p_message_bytes = c.message_bytes;
  out.allreduce_us = spec.model.allreduce_us;
  out.optimizer_us = c.optimizer_us;
  return out;
}

bool build_programs(const PipelineSpec& spec, Programs* out, std::string* error) {
  if (!validate(spec, error)) return false;
  const StageCosts costs = derive_costs(spec);
  const sched::ScheduleSpec sspec = schedule_spec(spec, costs);
  Programs programs;
  if (!sched::simulate(sspec, &programs.timeline, error, spec.min_bubble_us)) return false;

  const int p = spec.stages;
  const std::vector<int>& stage_of = programs.timeline.stage_of_virtual;
  const int virtual_stages = static_cast<int>(stage_of.size());
  // Chunk of each virtual stage on its stage (the op lists say it; the placement table does not).
  std::vector<int> chunk_of(static_cast<size_t>(virtual_stages), 0);
  for (const auto& st : programs.timeline.stages)
    for (const sched::Op& op : st.ops)
      if (op.virtual_stage >= 0) chunk_of[static_cast<size_t>(op.virtual_stage)] = op.chunk;
  programs.stages.assign(static_cast<size_t>(p), {});
  programs.bubbles_per_stage.assign(static_cast<size_t>(p), 0);
  auto is_compute = [](sched::OpType t) {
    return t == sched::OpType::Forward || t == sched::OpType::Backward || t == sched::OpType::BackwardInput ||
           t == sched::OpType::BackwardWeight;
  };

  for (int s = 0; s < p; ++s) {
    const sched::StageTimeline& tl = programs.timeline.stages[static_cast<size_t>(s)];
    // Compute ops are the timeline's forward/backward ops, in order (all-reduce and optimizer
    // ops are appended after them).
    size_t compute_ops = 0;
    while (compute_ops < tl.ops.size() && is_compute(tl.ops[compute_ops].type)) ++compute_ops;
    // Which wait each bubble belongs to: the one before the compute op that follows the gap,
    // or the end-of-iteration collective for the drain and all-reduce window (merged: the
    // stage waits on one collective for both).
    std::vector<const sched::Bubble*> before_op(compute_ops + 1, nullptr);
    double end_bubble_us = 0.0;
    pfBubbleKind_t end_kind = pfBubbleOptimizer;
    for (const sched::Bubble& b : tl.bubbles) {
      const size_t next = static_cast<size_t>(b.op_before + 1);
      if (next < compute_ops) {
        before_op[next] = &b;
      } else {
        end_bubble_us += b.duration_us;
        if (b.kind == pfBubbleDrain) end_kind = pfBubbleDrain;
      }
    }

    std::vector<Instruction>& prog = programs.stages[static_cast<size_t>(s)];
    int bubble_index = 0;
    auto wait_maybe_bubble = [&](const sched::Bubble* b, double duration, pfBubbleKind_t kind) {
      if (b != nullptr || duration > 0.0) {
        Instruction begin;
        begin.type = InstrType::BubbleBegin;
        begin.bubble_kind = b ? b->kind : kind;
        begin.expected_us = b ? b->duration_us : duration;
        begin.bubble_index = bubble_index++;
        prog.push_back(begin);
        prog.push_back(Instruction{InstrType::WaitComm});
        Instruction end = begin;
        end.type = InstrType::BubbleEnd;
        prog.push_back(end);
      } else {
        prog.push_back(Instruction{InstrType::WaitComm});
      }
    };
    // A W pass has no dependency wait: a gap before it (there is none in these schedules, the
    // B-input it follows is on the same stage) would stay unmarked.
    auto remote = [&](int vs) { return vs >= 0 && vs < virtual_stages && stage_of[static_cast<size_t>(vs)] != s; };

    for (size_t i = 0; i < compute_ops; ++i) {
      const sched::Op& op = tl.ops[i];
      const int vs = op.virtual_stage;
      Instruction compute;
      switch (op.type) {
        case sched::OpType::Forward: compute.type = InstrType::Forward; break;
        case sched::OpType::Backward: compute.type = InstrType::Backward; break;
        case sched::OpType::BackwardInput: compute.type = InstrType::BackwardInput; break;
        default: compute.type = InstrType::BackwardWeight; break;
      }
      compute.microbatch = op.microbatch;
      compute.chunk = op.chunk;
      compute.virtual_stage = vs;
      if (compute.type == InstrType::Forward) {
        if (vs == 0) {
          Instruction load = compute;
          load.type = InstrType::LoadMicrobatch;
          // Nothing to wait for: a gap before it (none in these schedules) stays unmarked.
          prog.push_back(load);
        } else if (remote(vs - 1)) {
          Instruction recv = compute;
          recv.type = InstrType::RecvActivation;
          recv.peer = stage_of[static_cast<size_t>(vs - 1)];
          recv.peer_chunk = chunk_of[static_cast<size_t>(vs - 1)];
          prog.push_back(recv);
          wait_maybe_bubble(before_op[i], 0.0, pfBubbleOther);
        }
        prog.push_back(compute);
        if (vs < virtual_stages - 1 && remote(vs + 1)) {
          Instruction send = compute;
          send.type = InstrType::SendActivation;
          send.virtual_stage = vs + 1;
          send.peer = stage_of[static_cast<size_t>(vs + 1)];
          send.peer_chunk = chunk_of[static_cast<size_t>(vs + 1)];
          prog.push_back(send);
        }
      } else if (compute.type == InstrType::BackwardWeight) {
        prog.push_back(compute);
      } else {
        if (vs < virtual_stages - 1 && remote(vs + 1)) {
          Instruction recv = compute;
          recv.type = InstrType::RecvGradient;
          recv.peer = stage_of[static_cast<size_t>(vs + 1)];
          recv.peer_chunk = chunk_of[static_cast<size_t>(vs + 1)];
          prog.push_back(recv);
          wait_maybe_bubble(before_op[i], 0.0, pfBubbleOther);
        }
        prog.push_back(compute);
        if (vs > 0 && remote(vs - 1)) {
          Instruction send = compute;
          send.type = InstrType::SendGradient;
          send.virtual_stage = vs - 1;
          send.peer = stage_of[static_cast<size_t>(vs - 1)];
          send.peer_chunk = chunk_of[static_cast<size_t>(vs - 1)];
          prog.push_back(send);
        }
      }
    }
    prog.push_back(Instruction{InstrType::ReduceGradients});
    wait_maybe_bubble(nullptr, end_bubble_us, end_kind);
    prog.push_back(Instruction{InstrType::OptimizerStep});
    programs.bubbles_per_stage[static_cast<size_t>(s)] = bubble_index;
  }
  *out = std::move(programs);
  return true;
}

std::vector<bool> bubbles_ending_in_collective(const std::vector<Instruction>& program) {
  std::vector<bool> out;
  bool collective = false;  // the last communication posted was the collective
  for (const Instruction& in : program) {
    if (in.type == InstrType::RecvActivation || in.type == InstrType::RecvGradient) collective = false;
    if (in.type == InstrType::ReduceGradients) collective = true;
    if (in.type != InstrType::BubbleBegin || in.bubble_index < 0) continue;
    if (out.size() <= static_cast<size_t>(in.bubble_index)) out.resize(static_cast<size_t>(in.bubble_index) + 1);
    out[static_cast<size_t>(in.bubble_index)] = collective;
  }
  return out;
}

}  // namespace engine
