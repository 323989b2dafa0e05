// Pipeline schedule validation, op order and timing. See docs/simulator.md for the model and
// every formula; the op-order generators are in orders.cpp.
//
// Model summary:
// - Each stage executes its compute ops strictly in the order stage_op_order() gives.
// - An op starts when the stage is free and its cross-stage dependency has arrived: forward of
//   (mb, virtual stage vs) after forward of (mb, vs-1) + p2p latency; backward (or B-input) of
//   (mb, vs) after backward of (mb, vs+1) + p2p latency (the last virtual stage's backward after
//   its own forward); W of (mb, vs) after B-input of (mb, vs). The latency applies when the two
//   virtual stages are on different physical stages (placement: looped c*p+s, or V).
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
#include <new>
#include <numeric>

#include "schedule/orders.hpp"

namespace pipefill::schedule {
namespace {

constexpr double kNotDone = -1.0;
constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Hard cap of the library (memory for the op lists and dependency tables); callers such as the
// cluster simulator apply their own, lower, stated bounds first.
constexpr uint64_t kMaxComputeOps = uint64_t{1} << 27;

// Releases a micro-batch's activations: the full backward, or ZB's weight-gradient pass (which
// still needs the layer inputs).
bool releases_activation(OpType type) {
  return type == OpType::Backward || type == OpType::BackwardWeight;
}

bool is_compute(OpType type) {
  return type == OpType::Forward || type == OpType::Backward || type == OpType::BackwardInput ||
         type == OpType::BackwardWeight;
}

bool fail_with(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

bool finite_non_negative(double value) { return std::isfinite(value) && value >= 0.0; }

uint64_t saturating_mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return std::numeric_limits<uint64_t>::max();
  return a * b;
}

const char* op_letter(OpType type) {
  switch (type) {
    case OpType::Forward: return "F";
    case OpType::Backward: return "B";
    case OpType::BackwardInput: return "I";
    case OpType::BackwardWeight: return "W";
    default: return "?";
  }
}

// PyTorch's action notation: virtual stage, kind, micro-batch ("3F0").
std::string action(int virtual_stage, OpType type, int microbatch) {
  return fmt::format("{}{}{}", virtual_stage, op_letter(type), microbatch);
}

bool is_looped_interleaved(ScheduleKind kind) {
  return kind == ScheduleKind::Interleaved1F1B || kind == ScheduleKind::InterleavedZB;
}

// Structure of a custom order: sizes, placement, every (virtual stage, micro-batch) forwarded
// once and backwarded once (full B, or B-input and W), W after its B-input and every backward
// after its forward on the same stage, in the stage's order.
bool validate_custom(const ScheduleSpec& spec, std::string* error) {
  if (!spec.custom) return fail_with(error, "a custom schedule needs its op order (ScheduleSpec::custom)");
  const CustomSchedule& c = *spec.custom;
  const std::string where = c.source.empty() ? std::string("custom schedule") : c.source;
  if (c.stages != spec.stages || c.chunks != spec.chunks || c.microbatches != spec.microbatches)
    return fail_with(error, fmt::format("{} has {} stages x {} chunks x {} micro-batches but the spec says "
                                        "{} x {} x {}", where, c.stages, c.chunks, c.microbatches, spec.stages,
                                        spec.chunks, spec.microbatches));
  const int p = c.stages, v = c.chunks, m = c.microbatches;
  const size_t vsn = static_cast<size_t>(p) * static_cast<size_t>(v);
  if (c.stage_of_virtual.size() != vsn || c.chunk_of_virtual.size() != vsn || c.order.size() != static_cast<size_t>(p))
    return fail_with(error, fmt::format("{}: placement tables or op lists do not match {} stages x {} chunks", where, p, v));
  for (size_t vs = 0; vs < vsn; ++vs) {
    if (c.stage_of_virtual[vs] < 0 || c.stage_of_virtual[vs] >= p || c.chunk_of_virtual[vs] < 0 ||
        c.chunk_of_virtual[vs] >= v)
      return fail_with(error, fmt::format("{}: virtual stage {} is placed on stage {} chunk {}, outside {} x {}",
                                          where, vs, c.stage_of_virtual[vs], c.chunk_of_virtual[vs], p, v));
  }
  // State per (virtual stage, micro-batch): bit 0 F, 1 B, 2 I, 3 W.
  std::vector<uint8_t> seen(vsn * static_cast<size_t>(m), 0);
  for (int s = 0; s < p; ++s) {
    const auto& ops = c.order[static_cast<size_t>(s)];
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const auto here = [&] {
        return fmt::format("{}: stage {}, action {} ({})", where, s, i,
                           is_compute(op.type) ? action(op.virtual_stage, op.type, op.microbatch) : "?");
      };
      if (!is_compute(op.type)) return fail_with(error, here() + ": not a compute action");
      if (op.virtual_stage < 0 || static_cast<size_t>(op.virtual_stage) >= vsn)
        return fail_with(error, fmt::format("{}: virtual stage {} outside 0..{}", here(), op.virtual_stage, vsn - 1));
      if (op.microbatch < 0 || op.microbatch >= m)
        return fail_with(error, fmt::format("{}: micro-batch {} outside 0..{}", here(), op.microbatch, m - 1));
      if (c.stage_of_virtual[static_cast<size_t>(op.virtual_stage)] != s)
        return fail_with(error, fmt::format("{}: virtual stage {} belongs to stage {}", here(), op.virtual_stage,
                                            c.stage_of_virtual[static_cast<size_t>(op.virtual_stage)]));
      if (op.chunk != c.chunk_of_virtual[static_cast<size_t>(op.virtual_stage)])
        return fail_with(error, fmt::format("{}: chunk {} but virtual stage {} is chunk {}", here(), op.chunk,
                                            op.virtual_stage, c.chunk_of_virtual[static_cast<size_t>(op.virtual_stage)]));
      uint8_t& st = seen[static_cast<size_t>(op.virtual_stage) * static_cast<size_t>(m) + static_cast<size_t>(op.microbatch)];
      const std::string f = action(op.virtual_stage, OpType::Forward, op.microbatch);
      switch (op.type) {
        case OpType::Forward:
          if (st & 1) return fail_with(error, here() + ": forward runs twice");
          st |= 1;
          break;
        case OpType::Backward:
        case OpType::BackwardInput:
          if (!(st & 1)) return fail_with(error, fmt::format("{}: backward before its forward {}", here(), f));
          if (st & 6) return fail_with(error, here() + ": backward runs twice");
          st |= op.type == OpType::Backward ? 2 : 4;
          break;
        case OpType::BackwardWeight:
          if (!(st & 4))
            return fail_with(error, fmt::format("{}: weight gradient before its input gradient {}", here(),
                                                action(op.virtual_stage, OpType::BackwardInput, op.microbatch)));
          if (st & 8) return fail_with(error, here() + ": weight gradient runs twice");
          st |= 8;
          break;
        default:
          break;
      }
    }
  }
  for (size_t vs = 0; vs < vsn; ++vs) {
    for (int mb = 0; mb < m; ++mb) {
      const uint8_t st = seen[vs * static_cast<size_t>(m) + static_cast<size_t>(mb)];
      const int vsi = static_cast<int>(vs);
      if (!(st & 1)) return fail_with(error, fmt::format("{}: {} never runs", where, action(vsi, OpType::Forward, mb)));
      if (!(st & 6))
        return fail_with(error, fmt::format("{}: no backward of {} ({} or {})", where, action(vsi, OpType::Forward, mb),
                                            action(vsi, OpType::Backward, mb), action(vsi, OpType::BackwardInput, mb)));
      if ((st & 4) && !(st & 8))
        return fail_with(error, fmt::format("{}: {} has no weight gradient {}", where,
                                            action(vsi, OpType::BackwardInput, mb), action(vsi, OpType::BackwardWeight, mb)));
    }
  }
  return true;
}

bool custom_has_weight_split(const ScheduleSpec& spec) {
  if (!spec.custom) return false;
  for (const auto& ops : spec.custom->order)
    for (const Op& op : ops)
      if (op.type == OpType::BackwardInput || op.type == OpType::BackwardWeight) return true;
  return false;
}

bool validate(const ScheduleSpec& spec, std::string* error) {
  if (spec.stages < 1)
    return fail_with(error, fmt::format("stages must be >= 1, got {}", spec.stages));
  if (spec.microbatches < 1)
    return fail_with(error, fmt::format("microbatches must be >= 1, got {}", spec.microbatches));
  const char* name = schedule_kind_name(spec.kind);
  switch (spec.kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
    case ScheduleKind::ZBH1:
      if (spec.chunks != 1)
        return fail_with(error, fmt::format("chunks must be 1 for {} schedules, got {}", name, spec.chunks));
      break;
    case ScheduleKind::Interleaved1F1B:
      if (spec.chunks < 2)
        return fail_with(error, fmt::format("interleaved 1F1B needs chunks >= 2, got {}", spec.chunks));
      break;
    case ScheduleKind::InterleavedZB:
    case ScheduleKind::LoopedBFS:
      if (spec.chunks < 1) return fail_with(error, fmt::format("{} needs chunks >= 1, got {}", name, spec.chunks));
      break;
    case ScheduleKind::ZBV:
    case ScheduleKind::DualPipeV:
      if (spec.chunks != 2)
        return fail_with(error, fmt::format("{} runs exactly 2 chunks per stage (a V), got chunks = {}", name, spec.chunks));
      if (spec.kind == ScheduleKind::DualPipeV && static_cast<long long>(spec.microbatches) < 2LL * spec.stages)
        return fail_with(error, fmt::format("dualpipev needs microbatches ({}) >= 2 x stages ({}), as PyTorch's "
                                            "ScheduleDualPipeV does", spec.microbatches, spec.stages));
      break;
    case ScheduleKind::Custom:
      if (spec.chunks < 1) return fail_with(error, fmt::format("chunks must be >= 1, got {}", spec.chunks));
      break;
    default:
      return fail_with(error, fmt::format("unknown schedule kind {}", static_cast<int>(spec.kind)));
  }
  const uint64_t ops = compute_op_count(spec);
  if (ops > kMaxComputeOps)
    return fail_with(error, fmt::format("{} stages x {} chunks x {} micro-batches = {} compute ops exceed the "
                                        "schedule generator's limit of {}", spec.stages, spec.chunks,
                                        spec.microbatches, ops, kMaxComputeOps));
  if (is_looped_interleaved(spec.kind)) {
    int group = 0;
    if (!interleaved_group_size(spec, &group, error)) return false;
  } else if (spec.microbatch_group_size != 0) {
    return fail_with(error, fmt::format("microbatch_group_size applies to interleaved schedules, not {} (got {})",
                                        name, spec.microbatch_group_size));
  }
  if (spec.kind == ScheduleKind::Custom && !validate_custom(spec, error)) return false;
  if (!spec.costs.empty() && static_cast<int>(spec.costs.size()) != spec.stages)
    return fail_with(error, fmt::format("costs has {} entries but stages is {}", spec.costs.size(),
                                        spec.stages));
  const bool split = uses_weight_split(spec.kind) || (spec.kind == ScheduleKind::Custom && custom_has_weight_split(spec));
  for (size_t s = 0; s < spec.costs.size(); ++s) {
    const StageCosts& c = spec.costs[s];
    if (!std::isfinite(c.forward_us) || c.forward_us <= 0.0)
      return fail_with(error, fmt::format("costs[{}].forward_us must be > 0, got {}", s, c.forward_us));
    if (!std::isfinite(c.backward_us) || c.backward_us <= 0.0)
      return fail_with(error, fmt::format("costs[{}].backward_us must be > 0, got {}", s, c.backward_us));
    if (split && (!std::isfinite(c.weight_us) || c.weight_us <= 0.0 || c.weight_us >= c.backward_us))
      return fail_with(error, fmt::format("costs[{}].weight_us must be in (0, backward_us={}) for {}, "
                                          "got {}", s, c.backward_us, spec.kind == ScheduleKind::ZBH1 ? "ZB-H1" : name,
                                          c.weight_us));
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

// Duration of one compute op on `stage` (per chunk when chunks > 1).
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

// The placement table of a spec (already validated).
std::vector<int> placement_table(const ScheduleSpec& spec) {
  if (spec.kind == ScheduleKind::Custom) return spec.custom->stage_of_virtual;
  const int vsn = spec.stages * spec.chunks;
  std::vector<int> table(static_cast<size_t>(vsn));
  const PlacementStyle style = placement_style(spec.kind);
  for (int vs = 0; vs < vsn; ++vs) table[static_cast<size_t>(vs)] = stage_of_virtual(style, spec.stages, vs);
  return table;
}

bool build_order(const ScheduleSpec& spec, std::vector<std::vector<Op>>* order, std::string* error) {
  if (!validate(spec, error)) return false;
  const int p = spec.stages, m = spec.microbatches, v = spec.chunks;
  order->assign(static_cast<size_t>(p), {});
  int group = 0;
  if (is_looped_interleaved(spec.kind) && !interleaved_group_size(spec, &group, error)) return false;
  switch (spec.kind) {
    case ScheduleKind::GPipe: detail::gpipe_order(p, m, order); break;
    case ScheduleKind::OneFOneB: detail::one_f_one_b_order(p, m, order); break;
    case ScheduleKind::ZBH1: detail::zbh1_order(p, m, order); break;
    case ScheduleKind::Interleaved1F1B: detail::interleaved_1f1b_order(p, m, v, group, order); break;
    case ScheduleKind::InterleavedZB: detail::interleaved_zb_order(p, m, v, group, order); break;
    case ScheduleKind::LoopedBFS: detail::looped_bfs_order(p, m, v, order); break;
    case ScheduleKind::ZBV: detail::zbv_order(p, m, order); break;
    case ScheduleKind::DualPipeV: detail::dualpipev_order(p, m, order); break;
    case ScheduleKind::Custom: *order = spec.custom->order; break;
  }
  if (spec.kind != ScheduleKind::Custom) {
    const PlacementStyle style = placement_style(spec.kind);
    for (int s = 0; s < p; ++s) {
      for (Op& op : (*order)[static_cast<size_t>(s)]) {
        op.virtual_stage = style == PlacementStyle::V ? (op.chunk == 0 ? s : 2 * p - 1 - s) : op.chunk * p + s;
      }
    }
  }
  return true;
}

// Times every stage's ops in order. O(ops): a stage blocked on a dependency is parked on that
// dependency's waiter list and resumed when it completes; the result does not depend on the
// order stages are processed in (an op's start depends only on its dependency and the
// previous op of its stage).
bool time_ops(const ScheduleSpec& spec, const std::vector<int>& stage_of, std::vector<std::vector<Op>>* order,
              std::string* error) {
  const int p = spec.stages, m = spec.microbatches;
  const size_t vsn = stage_of.size();
  const size_t keys = vsn * static_cast<size_t>(m);
  const double link = p2p_us(spec);
  std::vector<double> f_end(keys, kNotDone), b_end(keys, kNotDone);
  // Waiter lists: head per key (forward / backward table), next per stage (a stage waits on one
  // key at a time).
  std::vector<int> f_head(keys, -1), b_head(keys, -1), next_waiter(static_cast<size_t>(p), -1);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<int> runnable(static_cast<size_t>(p));
  std::iota(runnable.begin(), runnable.end(), 0);
  std::reverse(runnable.begin(), runnable.end());
  size_t remaining = 0;
  for (const auto& ops : *order) remaining += ops.size();
  auto key_of = [&](int vs, int mb) { return static_cast<size_t>(vs) * static_cast<size_t>(m) + static_cast<size_t>(mb); };
  auto wake = [&](std::vector<int>& head, size_t key) {
    int w = head[key];
    head[key] = -1;
    while (w >= 0) {
      const int after = next_waiter[static_cast<size_t>(w)];
      next_waiter[static_cast<size_t>(w)] = -1;
      runnable.push_back(w);
      w = after;
    }
  };
  while (!runnable.empty()) {
    const int s = runnable.back();
    runnable.pop_back();
    auto& ops = (*order)[static_cast<size_t>(s)];
    while (next[static_cast<size_t>(s)] < ops.size()) {
      Op& op = ops[next[static_cast<size_t>(s)]];
      const int vs = op.virtual_stage;
      double ready = 0.0;
      std::vector<double>* table = nullptr;
      std::vector<int>* head = nullptr;
      size_t key = 0;
      double latency = 0.0;
      if (op.type == OpType::Forward) {
        if (vs > 0) {
          table = &f_end, head = &f_head, key = key_of(vs - 1, op.microbatch);
          latency = stage_of[static_cast<size_t>(vs - 1)] != s ? link : 0.0;
        }
      } else if (op.type == OpType::Backward || op.type == OpType::BackwardInput) {
        if (static_cast<size_t>(vs) + 1 < vsn) {
          table = &b_end, head = &b_head, key = key_of(vs + 1, op.microbatch);
          latency = stage_of[static_cast<size_t>(vs + 1)] != s ? link : 0.0;
        } else {
          table = &f_end, head = &f_head, key = key_of(vs, op.microbatch);
        }
      } else {  // BackwardWeight: after its own B-input on this stage.
        table = &b_end, head = &b_head, key = key_of(vs, op.microbatch);
      }
      if (table != nullptr) {
        const double dep = (*table)[key];
        if (dep == kNotDone) {
          next_waiter[static_cast<size_t>(s)] = (*head)[key];
          (*head)[key] = s;
          break;
        }
        ready = dep + latency;
      }
      op.start_us = std::max(free_at[static_cast<size_t>(s)], ready);
      op.end_us = op.start_us + op_duration(spec, s, op.type);
      free_at[static_cast<size_t>(s)] = op.end_us;
      if (op.type == OpType::Forward) {
        f_end[key_of(vs, op.microbatch)] = op.end_us;
        wake(f_head, key_of(vs, op.microbatch));
      } else if (op.type != OpType::BackwardWeight) {
        b_end[key_of(vs, op.microbatch)] = op.end_us;
        wake(b_head, key_of(vs, op.microbatch));
      }
      ++next[static_cast<size_t>(s)];
      --remaining;
    }
  }
  if (remaining == 0) return true;
  // Deadlock: name the first stuck stages and what they wait for.
  std::string stuck;
  int listed = 0;
  for (int s = 0; s < p && listed < 4; ++s) {
    const auto& ops = (*order)[static_cast<size_t>(s)];
    if (next[static_cast<size_t>(s)] >= ops.size()) continue;
    const Op& op = ops[next[static_cast<size_t>(s)]];
    std::string needs;
    const int vs = op.virtual_stage;
    if (op.type == OpType::Forward) needs = action(vs - 1, OpType::Forward, op.microbatch);
    else if (op.type == OpType::BackwardWeight) needs = action(vs, OpType::BackwardInput, op.microbatch);
    else if (static_cast<size_t>(vs) + 1 < vsn) needs = action(vs + 1, OpType::Backward, op.microbatch) + "/I";
    else needs = action(vs, OpType::Forward, op.microbatch);
    stuck += fmt::format("{}stage {} at action {} ({}) waits for {}", listed ? "; " : "", s, next[static_cast<size_t>(s)],
                         action(vs, op.type, op.microbatch), needs);
    ++listed;
  }
  return fail_with(error, fmt::format("the schedule's op order deadlocks ({} ops never run): {}", remaining, stuck));
}

}  // namespace

PlacementStyle placement_style(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::ZBV:
    case ScheduleKind::DualPipeV: return PlacementStyle::V;
    case ScheduleKind::Custom: return PlacementStyle::Table;
    default: return PlacementStyle::Looped;
  }
}

int chunks_for(ScheduleKind kind, int requested) {
  switch (kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
    case ScheduleKind::ZBH1: return 1;
    case ScheduleKind::ZBV:
    case ScheduleKind::DualPipeV: return 2;
    default: return requested;
  }
}

bool uses_weight_split(ScheduleKind kind) {
  return kind == ScheduleKind::ZBH1 || kind == ScheduleKind::ZBV || kind == ScheduleKind::InterleavedZB ||
         kind == ScheduleKind::DualPipeV;
}

int stage_of_virtual(PlacementStyle style, int stages, int vs) {
  if (style == PlacementStyle::V) return vs < stages ? vs : 2 * stages - 1 - vs;
  return vs % stages;
}

bool interleaved_group_size(const ScheduleSpec& spec, int* group, std::string* error) {
  const int p = spec.stages, m = spec.microbatches;
  const char* name = schedule_kind_name(spec.kind);
  if (spec.microbatch_group_size == 0) {
    // PyTorch ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble: rounds = max(1, m // p),
    // m % rounds == 0, microbatches_per_round = m / rounds.
    const int rounds = std::max(1, m / p);
    if (m % rounds != 0)
      return fail_with(error, fmt::format("{} needs microbatches ({}) to be a multiple of the rounds max(1, {} / "
                                          "stages {}) = {} (PyTorch's rule), or an explicit microbatch_group_size "
                                          "g with stages <= g <= microbatches and microbatches % g = 0 or >= stages "
                                          "(Megatron's rule)", name, m, m, p, rounds));
    *group = m / rounds;
    return true;
  }
  const int g = spec.microbatch_group_size;
  if (g < p || g > m)
    return fail_with(error, fmt::format("microbatch_group_size ({}) must be in [stages = {}, microbatches = {}] "
                                        "(Megatron's rule)", g, p, m));
  const int rest = m % g;
  if (rest != 0 && rest < p)
    return fail_with(error, fmt::format("microbatches ({}) % microbatch_group_size ({}) = {} must be 0 or >= stages "
                                        "({}) (Megatron's rule: a smaller last group stalls the pipeline)", m, g, rest, p));
  *group = g;
  return true;
}

uint64_t compute_op_count(const ScheduleSpec& spec) {
  if (spec.kind == ScheduleKind::Custom && spec.custom) {
    uint64_t n = 0;
    for (const auto& ops : spec.custom->order) n += ops.size();
    return n;
  }
  if (spec.stages < 1 || spec.microbatches < 1 || spec.chunks < 1) return 0;
  const uint64_t per_microbatch = uses_weight_split(spec.kind) ? 3 : 2;
  return saturating_mul(saturating_mul(saturating_mul(static_cast<uint64_t>(spec.stages),
                                                      static_cast<uint64_t>(spec.chunks)),
                                       static_cast<uint64_t>(spec.microbatches)),
                        per_microbatch);
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved";
    case ScheduleKind::ZBH1: return "zbh1";
    case ScheduleKind::ZBV: return "zbv";
    case ScheduleKind::InterleavedZB: return "interleaved-zb";
    case ScheduleKind::LoopedBFS: return "looped-bfs";
    case ScheduleKind::DualPipeV: return "dualpipev";
    case ScheduleKind::Custom: return "custom";
  }
  return "unknown";
}

const char* schedule_kind_choices() {
  return "gpipe, 1f1b, interleaved, zbh1, zbv, interleaved-zb, looped-bfs or dualpipev";
}

bool parse_schedule_kind(const std::string& text, ScheduleKind* out) {
  std::string t;
  for (unsigned char c : text) {
    if (c == '-' || c == '_') continue;  // "interleaved-zb" == "interleaved_zb" == "interleavedzb"
    t.push_back(static_cast<char>(std::tolower(c)));
  }
  ScheduleKind kind;
  if (t == "gpipe") kind = ScheduleKind::GPipe;
  else if (t == "1f1b" || t == "onefoneb") kind = ScheduleKind::OneFOneB;
  else if (t == "interleaved" || t == "interleaved1f1b") kind = ScheduleKind::Interleaved1F1B;
  else if (t == "zbh1") kind = ScheduleKind::ZBH1;
  else if (t == "zbv" || t == "zbvzerobubble") kind = ScheduleKind::ZBV;
  else if (t == "interleavedzb" || t == "interleavedzerobubble" || t == "zb1p") kind = ScheduleKind::InterleavedZB;
  else if (t == "loopedbfs" || t == "bfs") kind = ScheduleKind::LoopedBFS;
  else if (t == "dualpipev") kind = ScheduleKind::DualPipeV;
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
  try {
    return build_order(spec, order, error);
  } catch (const std::bad_alloc&) {
    return fail_with(error, fmt::format("out of memory building the op order of {} compute ops", compute_op_count(spec)));
  }
}

bool simulate(const ScheduleSpec& spec, Timeline* timeline, std::string* error, double min_bubble_us) try {
  if (timeline == nullptr) return fail_with(error, "timeline must not be null");
  if (!std::isfinite(min_bubble_us) || min_bubble_us < 0.0)
    return fail_with(error, fmt::format("min_bubble_us must be >= 0, got {}", min_bubble_us));
  std::vector<std::vector<Op>> order;
  if (!build_order(spec, &order, error)) return false;
  const int p = spec.stages;
  std::vector<int> stage_of = placement_table(spec);
  if (!time_ops(spec, stage_of, &order, error)) return false;

  Timeline out;
  out.stages.resize(static_cast<size_t>(p));
  out.stage_of_virtual = std::move(stage_of);
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
} catch (const std::bad_alloc&) {
  return fail_with(error, fmt::format("out of memory timing {} compute ops", compute_op_count(spec)));
}

}  // namespace pipefill::schedule
