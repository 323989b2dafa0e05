// Pipeline schedule generator and timer. See docs/simulator.md for the model and every formula.
//
// Model summary:
// - Each stage executes its compute ops (forward / backward, or for ZB-H1 backward-input /
//   backward-weight) strictly in the order stage_op_order() gives.
// - An op starts when the stage is free and its cross-stage dependency has arrived:
//   forward of (mb, virtual stage vs) after forward of (mb, vs-1) + p2p latency; backward of
//   (mb, vs) after backward of (mb, vs+1) + p2p latency (the last virtual stage's backward after
//   its own forward). Virtual stage vs = chunk * p + stage (Megatron's interleaving).
// - Point-to-point transfers are asynchronous (they do not occupy the stage) and take
//   p2p_latency_us + p2p_message_bytes / p2p_bytes_per_us between different physical stages.
// - Every stage starts at time 0. All stages start the data-parallel all-reduce at the
//   pipeline end (the last compute op of any stage), followed by the optimizer step: the
//   optimizer step needs the global gradient norm, which synchronises the stages.
#include "schedule/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pipefill::schedule {
namespace {

constexpr double kNotDone = -1.0;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Releases a micro-batch's activations: the full backward, or ZB's weight-gradient pass (which
// still needs the layer inputs).
bool releases_activation(OpType type) {
  return type == OpType::Backward || type == OpType::BackwardWeight;
}

bool fail_with(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

bool finite_non_negative(double value) { return std::isfinite(value) && value >= 0.0; }

bool validate(const ScheduleSpec& spec, std::string* error) {
  if (spec.stages < 1)
    return fail_with(error, fmt::format("stages must be >= 1, got {}", spec.stages));
  if (spec.microbatches < 1)
    return fail_with(error, fmt::format("microbatches must be >= 1, got {}", spec.microbatches));
  if (spec.kind == ScheduleKind::Interleaved1F1B) {
    if (spec.chunks < 2)
      return fail_with(error, fmt::format("interleaved 1F1B needs chunks >= 2, got {}", spec.chunks));
    if (spec.microbatches % spec.stages != 0)
      return fail_with(error, fmt::format("interleaved 1F1B needs microbatches ({}) to be a multiple "
                                          "of stages ({})", spec.microbatches, spec.stages));
  } else if (spec.chunks != 1) {
    return fail_with(error, fmt::format("chunks must be 1 for {} schedules, got {}",
                                        schedule_kind_name(spec.kind), spec.chunks));
  }
  if (!spec.costs.empty() && static_cast<int>(spec.costs.size()) != spec.stages)
    return fail_with(error, fmt::format("costs has {} entries but stages is {}", spec.costs.size(),
                                        spec.stages));
  for (size_t s = 0; s < spec.costs.size(); ++s) {
    const StageCosts& c = spec.costs[s];
    if (!std::isfinite(c.forward_us) || c.forward_us <= 0.0)
      return fail_with(error, fmt::format("costs[{}].forward_us must be > 0, got {}", s, c.forward_us));
    if (!std::isfinite(c.backward_us) || c.backward_us <= 0.0)
      return fail_with(error, fmt::format("costs[{}].backward_us must be > 0, got {}", s, c.backward_us));
    if (spec.kind == ScheduleKind::ZBH1 &&
        (!std::isfinite(c.weight_us) || c.weight_us <= 0.0 || c.weight_us >= c.backward_us))
      return fail_with(error, fmt::format("costs[{}].weight_us must be in (0, backward_us={}) for ZB-H1, "
                                          "got {}", s, c.backward_us, c.weight_us));
  }
  if (!finite_non_negative(spec.p2p_latency_us))
    return fail_with(error, fmt::format("p2p_latency_us must be >= 0, got {}", spec.p2p_latency_us));
  if (!finite_non_negative(spec.p2p_bytes_per_us))
    return fail_with(error, fmt::format("p2p_bytes_per_us must be >= 0, got {}", spec.p2p_bytes_per_us));
  if (!finite_non_negative(spec.allreduce_us))
    return fail_with(error, fmt::format("allreduce_us must be >= 0, got {}", spec.allreduce_us));
  if (!finite_non_negative(spec.optimizer_us))
    return fail_with(error, fmt::format("optimizer_us must be >= 0, got {}", spec.optimizer_us));
  return true;
}

StageCosts stage_costs(const ScheduleSpec& spec, int stage) {
  return spec.costs.empty() ? StageCosts{} : spec.costs[static_cast<size_t>(stage)];
}

// Duration of one compute op on `stage` (per chunk when interleaved).
double op_duration(const ScheduleSpec& spec, int stage, OpType type) {
  const StageCosts c = stage_costs(spec, stage);
  const double per_chunk = 1.0 / spec.chunks;
  switch (type) {
    case OpType::Forward: return c.forward_us * per_chunk;
    case OpType::Backward: return c.backward_us * per_chunk;
    case OpType::BackwardInput: return (c.backward_us - c.weight_us) * per_chunk;
    case OpType::BackwardWeight: return c.weight_us * per_chunk;
    default: return 0.0;
  }
}

double p2p_us(const ScheduleSpec& spec) {
  double us = spec.p2p_latency_us;
  if (spec.p2p_bytes_per_us > 0.0) us += static_cast<double>(spec.p2p_message_bytes) / spec.p2p_bytes_per_us;
  return us;
}

Op compute_op(OpType type, int microbatch, int chunk) {
  Op op;
  op.type = type;
  op.microbatch = microbatch;
  op.chunk = chunk;
  return op;
}

void gpipe_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order) {
  for (int s = 0; s < spec.stages; ++s) {
    auto& ops = (*order)[s];
    for (int mb = 0; mb < spec.microbatches; ++mb) ops.push_back(compute_op(OpType::Forward, mb, 0));
    for (int mb = 0; mb < spec.microbatches; ++mb) ops.push_back(compute_op(OpType::Backward, mb, 0));
  }
}

void one_f_one_b_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order) {
  const int p = spec.stages, m = spec.microbatches;
  for (int s = 0; s < p; ++s) {
    auto& ops = (*order)[s];
    const int warmup = std::min(p - 1 - s, m);
    for (int mb = 0; mb < warmup; ++mb) ops.push_back(compute_op(OpType::Forward, mb, 0));
    for (int i = 0; i < m - warmup; ++i) {
      ops.push_back(compute_op(OpType::Forward, warmup + i, 0));
      ops.push_back(compute_op(OpType::Backward, i, 0));
    }
    for (int mb = m - warmup; mb < m; ++mb) ops.push_back(compute_op(OpType::Backward, mb, 0));
  }
}

// Megatron-LM's interleaved schedule (forward_backward_pipelining_with_interleaving): the k-th
// virtual micro-batch of a stage belongs to chunk (k / p) % v (reversed for backward) and
// micro-batch (k / (p v)) p + k % p; warm-up runs (p - s - 1) * 2 + (v - 1) * p forwards
// (all of them when m == p).
void interleaved_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order) {
  const int p = spec.stages, m = spec.microbatches, v = spec.chunks;
  const int total = m * v;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int s = 0; s < p; ++s) {
    auto& ops = (*order)[s];
    const int warmup = (m == p) ? total : std::min((p - s - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) ops.push_back(compute_op(OpType::Forward, microbatch_of(k), chunk_of(k, true)));
    for (int i = 0; i < total - warmup; ++i) {
      const int kf = warmup + i;
      ops.push_back(compute_op(OpType::Forward, microbatch_of(kf), chunk_of(kf, true)));
      ops.push_back(compute_op(OpType::Backward, microbatch_of(i), chunk_of(i, false)));
    }
    for (int k = total - warmup; k < total; ++k)
      ops.push_back(compute_op(OpType::Backward, microbatch_of(k), chunk_of(k, false)));
  }
}

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward is split into
// B (input gradient, on the critical path to the previous stage) and W (weight gradient,
// deferrable). F and B follow 1F1B's order; stage s defers its W passes by s micro-batches in
// the steady phase (after B_i comes W_{i-s}), and in the cool-down phase runs one pending W after
// each B, so the W passes fill the gaps where 1F1B waits for the next gradient; the remaining W
// passes end the stage. Peak activations (a micro-batch's inputs live until its W): p on every
// stage, 1F1B's peak on stage 0, as in the paper. Uniform costs with t_w <= t_f give the
// paper's bubble (p-1)(t_f + t_b - t_w), t_b the B part (tests/schedule).
void zbh1_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order) {
  const int p = spec.stages, m = spec.microbatches;
  for (int s = 0; s < p; ++s) {
    auto& ops = (*order)[s];
    const int warmup = std::min(p - 1 - s, m);
    const int deferred = s;
    int next_w = 0;
    for (int mb = 0; mb < warmup; ++mb) ops.push_back(compute_op(OpType::Forward, mb, 0));
    for (int i = 0; i < m - warmup; ++i) {
      ops.push_back(compute_op(OpType::Forward, warmup + i, 0));
      ops.push_back(compute_op(OpType::BackwardInput, i, 0));
      if (i >= deferred) ops.push_back(compute_op(OpType::BackwardWeight, next_w++, 0));
    }
    for (int mb = m - warmup; mb < m; ++mb) {
      ops.push_back(compute_op(OpType::BackwardInput, mb, 0));
      ops.push_back(compute_op(OpType::BackwardWeight, next_w++, 0));
    }
    while (next_w < m) ops.push_back(compute_op(OpType::BackwardWeight, next_w++, 0));
  }
}

// Index of virtual stage (chunk, stage) in the dependency tables.
int virtual_stage(const ScheduleSpec& spec, int stage, int chunk) { return chunk * spec.stages + stage; }

pfBubbleKind_t classify(double gap_start, double first_backward_start, bool at_end) {
  if (at_end) return pfBubbleDrain;
  if (gap_start < first_backward_start) return pfBubbleWarmup;
  return pfBubbleCooldown;
}

size_t free_bytes_at(const ScheduleSpec& spec, int stage, int in_flight) {
  if (spec.device_memory_bytes == 0) return 0;
  const StageCosts c = stage_costs(spec, stage);
  const double used = static_cast<double>(c.weight_bytes) + static_cast<double>(c.optimizer_bytes) +
                      static_cast<double>(in_flight) * static_cast<double>(c.activation_bytes);
  const double free = static_cast<double>(spec.device_memory_bytes) - used;
  return free > 0.0 ? static_cast<size_t>(free) : 0;
}

}  // namespace

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved";
    case ScheduleKind::ZBH1: return "zbh1";
  }
  return "unknown";
}

bool parse_schedule_kind(const std::string& text, ScheduleKind* out) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  ScheduleKind kind;
  if (t == "gpipe") kind = ScheduleKind::GPipe;
  else if (t == "1f1b" || t == "onefoneb") kind = ScheduleKind::OneFOneB;
  else if (t == "interleaved" || t == "interleaved1f1b" || t == "interleaved-1f1b") kind = ScheduleKind::Interleaved1F1B;
  else if (t == "zbh1" || t == "zb-h1") kind = ScheduleKind::ZBH1;
  else return false;
  if (out != nullptr) *out = kind;
  return true;
}

double Timeline::bubble_share() const {
  if (stages.empty() || pipeline_us <= 0.0) return 0.0;
  double sum = 0.0;
  for (const auto& s : stages) sum += s.bubble_us / pipeline_us;
  return sum / static_cast<double>(stages.size());
}

double Timeline::bubble_ratio() const {
  double bubble = 0.0, compute = 0.0;
  for (const auto& s : stages) {
    bubble += s.bubble_us;
    compute += s.compute_us;
  }
  return compute > 0.0 ? bubble / compute : 0.0;
}

bool stage_op_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order, std::string* error) {
  if (order == nullptr) return fail_with(error, "order must not be null");
  if (!validate(spec, error)) return false;
  order->assign(static_cast<size_t>(spec.stages), {});
  switch (spec.kind) {
    case ScheduleKind::GPipe: gpipe_order(spec, order); return true;
    case ScheduleKind::OneFOneB: one_f_one_b_order(spec, order); return true;
    case ScheduleKind::Interleaved1F1B: interleaved_order(spec, order); return true;
    case ScheduleKind::ZBH1: zbh1_order(spec, order); return true;
  }
  return fail_with(error, fmt::format("unknown schedule kind {}", static_cast<int>(spec.kind)));
}

bool simulate(const ScheduleSpec& spec, Timeline* timeline, std::string* error, double min_bubble_us) {
  if (timeline == nullptr) return fail_with(error, "timeline must not be null");
  if (!std::isfinite(min_bubble_us) || min_bubble_us < 0.0)
    return fail_with(error, fmt::format("min_bubble_us must be >= 0, got {}", min_bubble_us));
  std::vector<std::vector<Op>> order;
  if (!stage_op_order(spec, &order, error)) return false;

  const int p = spec.stages, m = spec.microbatches, v = spec.chunks;
  const int virtual_stages = p * v;
  const double link = p2p_us(spec);
  std::vector<std::vector<double>> f_end(virtual_stages, std::vector<double>(m, kNotDone));
  std::vector<std::vector<double>> b_end(virtual_stages, std::vector<double>(m, kNotDone));
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);

  // Times ops in each stage's order; a pass advances every stage as far as its dependencies
  // allow. The result does not depend on the pass order (an op's start depends only on its
  // dependency and the previous op of its stage). No progress in a pass = a cyclic order.
  size_t remaining = 0;
  for (const auto& ops : order) remaining += ops.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      auto& ops = order[s];
      while (next[s] < ops.size()) {
        Op& op = ops[next[s]];
        const int vs = virtual_stage(spec, s, op.chunk);
        double ready = 0.0;
        if (op.type == OpType::Forward) {
          if (vs > 0) {
            const double dep = f_end[vs - 1][op.microbatch];
            if (dep == kNotDone) break;
            ready = dep + ((vs - 1) % p != s ? link : 0.0);
          }
        } else if (op.type == OpType::Backward || op.type == OpType::BackwardInput) {
          if (vs < virtual_stages - 1) {
            const double dep = b_end[vs + 1][op.microbatch];
            if (dep == kNotDone) break;
            ready = dep + ((vs + 1) % p != s ? link : 0.0);
          } else {
            const double dep = f_end[vs][op.microbatch];
            if (dep == kNotDone) break;
            ready = dep;
          }
        }  // BackwardWeight: only follows its own B on the same stage, ensured by the order.
        op.start_us = std::max(free_at[s], ready);
        op.end_us = op.start_us + op_duration(spec, s, op.type);
        free_at[s] = op.end_us;
        if (op.type == OpType::Forward) f_end[vs][op.microbatch] = op.end_us;
        else if (op.type != OpType::BackwardWeight) b_end[vs][op.microbatch] = op.end_us;
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) return fail_with(error, "internal error: schedule op order deadlocks");
  }

  Timeline out;
  out.stages.resize(static_cast<size_t>(p));
  double pipeline_end = 0.0;
  for (int s = 0; s < p; ++s)
    if (!order[s].empty()) pipeline_end = std::max(pipeline_end, order[s].back().end_us);
  out.pipeline_us = pipeline_end;
  // Gaps shorter than this are floating-point noise of equal sums, not idle time.
  const double noise_us = 1e-9 * std::max(1.0, pipeline_end);
  const double bubble_floor = std::max(min_bubble_us, noise_us);

  for (int s = 0; s < p; ++s) {
    StageTimeline& stl = out.stages[s];
    stl.ops = std::move(order[s]);
    double first_backward = kInfinity;
    for (const Op& op : stl.ops) {
      if (op.type != OpType::Forward) {
        first_backward = op.start_us;
        break;
      }
    }
    int in_flight = 0;
    double cursor = 0.0;
    auto add_bubble = [&](double start, double end, pfBubbleKind_t kind, int op_before) {
      const double duration = end - start;
      if (duration <= bubble_floor) return;
      Bubble b;
      b.stage = s;
      b.index_in_iteration = static_cast<int>(stl.bubbles.size());
      b.start_us = start;
      b.duration_us = duration;
      b.kind = kind;
      b.free_bytes = free_bytes_at(spec, s, in_flight);
      b.op_before = op_before;
      stl.bubbles.push_back(b);
      if (kind == pfBubbleOptimizer) stl.optimizer_bubble_us += duration;
      else stl.bubble_us += duration;
    };
    for (size_t i = 0; i < stl.ops.size(); ++i) {
      const Op& op = stl.ops[i];
      add_bubble(cursor, op.start_us, classify(cursor, first_backward, false), static_cast<int>(i) - 1);
      stl.compute_us += op.end_us - op.start_us;
      if (op.type == OpType::Forward) {
        ++in_flight;
        stl.peak_in_flight = std::max(stl.peak_in_flight, in_flight);
      } else if (releases_activation(op.type)) {
        --in_flight;
      }
      cursor = op.end_us;
    }
    stl.last_compute_end_us = cursor;
    add_bubble(cursor, pipeline_end, pfBubbleDrain, static_cast<int>(stl.ops.size()) - 1);
    stl.peak_activation_bytes = static_cast<size_t>(stl.peak_in_flight) * stage_costs(spec, s).activation_bytes;

    // Iteration end: every stage all-reduces its gradients from the pipeline end (the SMs are
    // idle apart from the NCCL kernels: an optimizer-kind bubble), then steps the optimizer.
    double t = pipeline_end;
    if (spec.allreduce_us > 0.0) {
      Op ar;
      ar.type = OpType::AllReduce;
      ar.start_us = t;
      ar.end_us = t + spec.allreduce_us;
      add_bubble(ar.start_us, ar.end_us, pfBubbleOptimizer, static_cast<int>(stl.ops.size()) - 1);
      stl.ops.push_back(ar);
      t = ar.end_us;
    }
    if (spec.optimizer_us > 0.0) {
      Op opt;
      opt.type = OpType::OptimizerStep;
      opt.start_us = t;
      opt.end_us = t + spec.optimizer_us;
      stl.ops.push_back(opt);
      t = opt.end_us;
    }
    out.iteration_us = std::max(out.iteration_us, t);
  }
  *timeline = std::move(out);
  return true;
}

}  // namespace pipefill::schedule
