#include "sim/sim_pipeline.hpp"

#include <algorithm>
#include <tuple>

#include "common/error.hpp"
#include "sim/sim_world.hpp"

namespace pipefill::sim {
namespace {

bool is_compute(schedule::OpType type) {
  using schedule::OpType;
  return type == OpType::Forward || type == OpType::Backward || type == OpType::BackwardInput ||
         type == OpType::BackwardWeight;
}

double op_duration(const schedule::Op& op) { return op.end_us - op.start_us; }

}  // namespace

pfResult_t Pipeline::create(pfSimWorld_t world, const PipelineOptions& options,
                            std::unique_ptr<Pipeline>* out) {
  if (world == nullptr) return fail(pfErrorInvalidArgument, "sim pipeline: world is NULL");
  World* w = world_from_handle(world);
  if (w == nullptr) return fail(pfErrorInvalidArgument, "sim pipeline: world {} is not live",
                                static_cast<void*>(world));
  const int stages = options.spec.stages;
  if (stages < 1 || w->device_count() < stages) {
    return fail(pfErrorInvalidArgument,
                "sim pipeline: {} stages need as many devices; the world has {}", stages,
                w->device_count());
  }
  if (!options.runtimes.empty() && static_cast<int>(options.runtimes.size()) != stages) {
    return fail(pfErrorInvalidArgument,
                "sim pipeline: {} runtimes given for {} stages (give none or one per stage)",
                options.runtimes.size(), stages);
  }
  if (options.comm_sms < 0 || options.compute_sms < 0) {
    return fail(pfErrorInvalidArgument, "sim pipeline: comm_sms = {} / compute_sms = {} negative",
                options.comm_sms, options.compute_sms);
  }
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->world_ = world;
  p->options_ = options;
  std::string error;
  if (!schedule::simulate(options.spec, &p->timeline_, &error)) {
    return fail(pfErrorInvalidArgument, "sim pipeline: invalid schedule: {}", error);
  }
  const schedule::ScheduleSpec& spec = options.spec;
  p->stages_ = stages;
  p->virtual_stages_ = stages * std::max(1, spec.chunks);
  p->link_us_ = spec.p2p_latency_us +
                (spec.p2p_bytes_per_us > 0
                     ? static_cast<double>(spec.p2p_message_bytes) / spec.p2p_bytes_per_us
                     : 0.0);

  for (int s = 0; s < stages; ++s) {
    void* stream = nullptr;
    PF_TRY(pfSimStreamCreate(world, s, kHighestPriority, &stream));
    p->streams_.push_back(stream);
  }
  auto new_event = [&](pfSimEvent_t* e) { return pfSimEventCreate(world, e); };
  p->forward_done_.assign(static_cast<size_t>(p->virtual_stages_),
                          std::vector<pfSimEvent_t>(static_cast<size_t>(spec.microbatches)));
  p->backward_done_ = p->forward_done_;
  for (auto* table : {&p->forward_done_, &p->backward_done_}) {
    for (auto& row : *table) {
      for (auto& e : row) PF_TRY(new_event(&e));
    }
  }
  p->stage_done_.resize(static_cast<size_t>(stages));
  p->iteration_done_.resize(static_cast<size_t>(stages));
  for (auto& e : p->stage_done_) PF_TRY(new_event(&e));
  for (auto& e : p->iteration_done_) PF_TRY(new_event(&e));

  // Bubble marks, keyed by the op they precede; drain and optimizer bubbles are keyed by kind.
  p->marks_.resize(static_cast<size_t>(stages));
  p->window_begin_.resize(static_cast<size_t>(stages));
  p->window_end_.resize(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const schedule::StageTimeline& stl = p->timeline_.stages[static_cast<size_t>(s)];
    p->marks_[static_cast<size_t>(s)].assign(stl.ops.size() + 1, {});
    for (const schedule::Bubble& b : stl.bubbles) {
      const size_t key = static_cast<size_t>(b.op_before + 1);
      p->marks_[static_cast<size_t>(s)][key].push_back(
          Mark{b.index_in_iteration, b.kind, b.duration_us});
      pfSimEvent_t begin = nullptr, end = nullptr;
      PF_TRY(new_event(&begin));
      PF_TRY(new_event(&end));
      p->window_begin_[static_cast<size_t>(s)].push_back(begin);
      p->window_end_[static_cast<size_t>(s)].push_back(end);
    }
  }
  // Global enqueue order of the compute ops: the no-fill schedule's start times.
  for (int s = 0; s < stages; ++s) {
    const auto& ops = p->timeline_.stages[static_cast<size_t>(s)].ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (is_compute(ops[i].type)) p->order_.push_back(Step{s, i});
    }
  }
  std::stable_sort(p->order_.begin(), p->order_.end(), [&](const Step& a, const Step& b) {
    const double ta = p->timeline_.stages[static_cast<size_t>(a.stage)].ops[a.op].start_us;
    const double tb = p->timeline_.stages[static_cast<size_t>(b.stage)].ops[b.op].start_us;
    return std::tie(ta, a.stage, a.op) < std::tie(tb, b.stage, b.op);
  });
  *out = std::move(p);
  return pfSuccess;
}

Pipeline::~Pipeline() {
  // Streams and events belong to the world; they are released with it. Destroy what we made
  // so a long-lived world does not accumulate them.
  for (void* s : streams_) pfSimStreamDestroy(s);
  auto drop = [](pfSimEvent_t e) {
    if (e != nullptr) pfSimEventDestroy(e);
  };
  for (auto* table : {&forward_done_, &backward_done_, &window_begin_, &window_end_}) {
    for (auto& row : *table) std::for_each(row.begin(), row.end(), drop);
  }
  std::for_each(stage_done_.begin(), stage_done_.end(), drop);
  std::for_each(iteration_done_.begin(), iteration_done_.end(), drop);
}

pfResult_t Pipeline::begin_bubble(int stage, const Mark& mark, size_t slot) {
  void* stream = streams_[static_cast<size_t>(stage)];
  PF_TRY(pfSimEventRecord(window_begin_[static_cast<size_t>(stage)][slot], stream));
  pfRuntime_t rt = options_.runtimes.empty() ? nullptr : options_.runtimes[static_cast<size_t>(stage)];
  if (rt != nullptr) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.kind = mark.kind;
    if (options_.hint_expected_durations) hint.expected_duration_us = mark.expected_us;
    PF_TRY(pfBubbleBegin(rt, stream, &hint));
  }
  BubbleWindow w;
  w.stage = stage;
  w.iteration = iteration_;
  w.index_in_iteration = mark.index_in_iteration;
  w.kind = mark.kind;
  pending_windows_.push_back(w);
  pending_slots_.emplace_back(stage, slot);
  return pfSuccess;
}

pfResult_t Pipeline::end_bubble(int stage, size_t slot) {
  void* stream = streams_[static_cast<size_t>(stage)];
  pfRuntime_t rt = options_.runtimes.empty() ? nullptr : options_.runtimes[static_cast<size_t>(stage)];
  if (rt != nullptr) PF_TRY(pfBubbleEnd(rt, stream));
  return pfSimEventRecord(window_end_[static_cast<size_t>(stage)][slot], stream);
}

pfResult_t Pipeline::enqueue_iteration() {
  const schedule::ScheduleSpec& spec = options_.spec;
  const int p = stages_;
  const int compute_sms = options_.compute_sms;  // 0 = whole device, resolved per stage below
  World* world = world_from_handle(world_);
  auto sms_for = [&](int stage) {
    const int device_sms = world->sm_count(stage);
    return compute_sms > 0 ? std::min(compute_sms, device_sms) : device_sms;
  };
  // Bubble slots in order of the stage's bubbles (index_in_iteration).
  std::vector<size_t> next_slot(static_cast<size_t>(p), 0);
  std::vector<size_t> last_compute(static_cast<size_t>(p), 0);
  for (int s = 0; s < p; ++s) {
    const auto& ops = timeline_.stages[static_cast<size_t>(s)].ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (is_compute(ops[i].type)) last_compute[static_cast<size_t>(s)] = i;
    }
  }

  for (const Step& step : order_) {
    const int s = step.stage;
    void* stream = streams_[static_cast<size_t>(s)];
    const schedule::Op& op = timeline_.stages[static_cast<size_t>(s)].ops[step.op];
    const int vs = op.virtual_stage;  // placement-aware (looped c*p+s, or the V of ZB-V / DualPipeV)
    const auto& stage_of = timeline_.stage_of_virtual;
    pfSimEvent_t dependency = nullptr;
    double latency = 0.0;
    int hold = 0;
    if (op.type == schedule::OpType::Forward && vs > 0) {
      dependency = forward_done_[static_cast<size_t>(vs - 1)][static_cast<size_t>(op.microbatch)];
      if (stage_of[static_cast<size_t>(vs - 1)] != s) {
        latency = link_us_;
        hold = options_.comm_sms;
      }
    } else if ((op.type == schedule::OpType::Backward ||
                op.type == schedule::OpType::BackwardInput) &&
               vs < virtual_stages_ - 1) {
      dependency = backward_done_[static_cast<size_t>(vs + 1)][static_cast<size_t>(op.microbatch)];
      if (stage_of[static_cast<size_t>(vs + 1)] != s) {
        latency = link_us_;
        hold = options_.comm_sms;
      }
    }
    // Bubbles the no-fill schedule shows right before this op (normally at most one).
    const auto& marks = marks_[static_cast<size_t>(s)][step.op];
    std::vector<size_t> opened;
    for (const Mark& mark : marks) {
      if (mark.kind == pfBubbleDrain || mark.kind == pfBubbleOptimizer) continue;
      const size_t slot = next_slot[static_cast<size_t>(s)]++;
      PF_TRY(begin_bubble(s, mark, slot));
      opened.push_back(slot);
    }
    if (dependency != nullptr) PF_TRY(pfSimStreamWaitEvent(stream, dependency, latency, hold));
    for (size_t slot : opened) PF_TRY(end_bubble(s, slot));
    PF_TRY(pfSimLaunchKernel(stream, op_duration(op), sms_for(s)));
    if (op.type == schedule::OpType::Forward) {
      PF_TRY(pfSimEventRecord(forward_done_[static_cast<size_t>(vs)][static_cast<size_t>(op.microbatch)], stream));
    } else if (op.type == schedule::OpType::Backward ||
               op.type == schedule::OpType::BackwardInput) {
      PF_TRY(pfSimEventRecord(backward_done_[static_cast<size_t>(vs)][static_cast<size_t>(op.microbatch)], stream));
    }
    if (step.op == last_compute[static_cast<size_t>(s)]) {
      PF_TRY(pfSimEventRecord(stage_done_[static_cast<size_t>(s)], stream));
    }
  }

  // End of iteration: a barrier on every other stage (the drain bubble), the data-parallel
  // all-reduce (an optimizer bubble) and the optimizer step.
  for (int s = 0; s < p; ++s) {
    void* stream = streams_[static_cast<size_t>(s)];
    const auto& tail = marks_[static_cast<size_t>(s)][last_compute[static_cast<size_t>(s)] + 1];
    const Mark* drain = nullptr;
    const Mark* optimizer = nullptr;
    for (const Mark& m : tail) {
      if (m.kind == pfBubbleDrain) drain = &m;
      if (m.kind == pfBubbleOptimizer) optimizer = &m;
    }
    size_t drain_slot = 0;
    if (drain != nullptr) {
      drain_slot = next_slot[static_cast<size_t>(s)]++;
      PF_TRY(begin_bubble(s, *drain, drain_slot));
    }
    for (int other = 0; other < p; ++other) {
      if (other == s) continue;
      PF_TRY(pfSimStreamWaitEvent(stream, stage_done_[static_cast<size_t>(other)], link_us_,
                                  options_.comm_sms));
    }
    if (drain != nullptr) PF_TRY(end_bubble(s, drain_slot));
    if (spec.allreduce_us > 0) {
      size_t slot = 0;
      if (optimizer != nullptr) {
        slot = next_slot[static_cast<size_t>(s)]++;
        PF_TRY(begin_bubble(s, *optimizer, slot));
      }
      PF_TRY(pfSimLaunchKernel(stream, spec.allreduce_us, std::max(1, options_.comm_sms)));
      if (optimizer != nullptr) PF_TRY(end_bubble(s, slot));
    }
    if (spec.optimizer_us > 0) PF_TRY(pfSimLaunchKernel(stream, spec.optimizer_us, sms_for(s)));
    PF_TRY(pfSimEventRecord(iteration_done_[static_cast<size_t>(s)], stream));
    pfRuntime_t rt = options_.runtimes.empty() ? nullptr : options_.runtimes[static_cast<size_t>(s)];
    if (rt != nullptr) PF_TRY(pfIterationEnd(rt));
  }
  return pfSuccess;
}

pfResult_t Pipeline::run_iteration(IterationResult* result) {
  pending_windows_.clear();
  pending_slots_.clear();
  PF_TRY(enqueue_iteration());
  PF_TRY(pfSimRunUntilIdle(world_));
  for (size_t i = 0; i < pending_windows_.size(); ++i) {
    BubbleWindow w = pending_windows_[i];
    const auto [stage, slot] = pending_slots_[i];
    PF_TRY(pfSimEventTime(window_begin_[static_cast<size_t>(stage)][slot], &w.begin_us));
    PF_TRY(pfSimEventTime(window_end_[static_cast<size_t>(stage)][slot], &w.end_us));
    windows_.push_back(w);
  }
  IterationResult r;
  r.start_us = last_end_us_;
  for (int s = 0; s < stages_; ++s) {
    double t = 0.0;
    PF_TRY(pfSimEventTime(iteration_done_[static_cast<size_t>(s)], &t));
    r.stage_end_us.push_back(t);
    r.end_us = std::max(r.end_us, t);
  }
  last_end_us_ = r.end_us;
  ++iteration_;
  if (result != nullptr) *result = r;
  return pfSuccess;
}

pfResult_t Pipeline::run(int count, std::vector<IterationResult>* results) {
  for (int i = 0; i < count; ++i) {
    IterationResult r;
    PF_TRY(run_iteration(&r));
    if (results != nullptr) results->push_back(r);
  }
  return pfSuccess;
}

}  // namespace pipefill::sim
