#include "cluster/strategies.hpp"

#include <algorithm>
#include <cmath>

namespace pipefill::cluster {
namespace {

double overlap(double a, double b, double lo, double hi) { return std::max(0.0, std::min(b, hi) - std::max(a, lo)); }

// Items needed to finish `remaining` work units (at least one: a job with work left runs).
double items_needed(double remaining, double work_per_item) {
  return std::max(1.0, std::ceil(remaining / work_per_item - 1e-9));
}

// Accumulates a bubble's fill activity and what it costs the main job.
class Ledger {
 public:
  Ledger(const StrategyParams& p, const BubbleInput& b, BubbleOutcome* o, bool co_runs)
      : p_(p), b_(b), o_(o), co_runs_(co_runs) {}

  // Fill counted as busy on [from, to), clipped to the bubble (launch overhead included, as the
  // runtime's slice accounting does).
  void busy(double from, double to) { o_->filled_us += std::max(0.0, std::min(to, b_.actual_us) - from); }

  // Fill kernels of `job` hold SMs on [a, e). Transfers they overlap are stretched (gamma); the
  // part after the bubble end co-runs with the main job (beta) for the strategies whose fill
  // yields to the main job's pending blocks (co_runs).
  void active(double a, double e, const JobView& job) {
    if (!(e > a)) return;
    const double end = b_.actual_us;
    const double load = p_.fill_sm_share * job.mem_intensity;
    double ov = 0.0;
    if (b_.comm_window_share > 0) {
      ov = overlap(a, e, 0.0, end) * b_.comm_window_share;
    } else {
      ov = overlap(a, e, 0.0, b_.transfer_out_us) + overlap(a, e, end - b_.transfer_in_us, end);
    }
    o_->comm_us += p_.interference.comm_slowdown * load * ov;
    if (e > end) {
      const double post = e - std::max(a, end);
      o_->post_us += post;
      if (co_runs_) o_->corun_us += p_.interference.mem_slowdown * load * post;
      if (a < end) {  // this run holds SMs when the bubble ends
        remaining_at_end_ = e - end;
        block_at_end_ = job.block_us;
        intensity_at_end_ = job.mem_intensity;
      }
    }
  }

  double remaining_at_end() const { return remaining_at_end_; }
  double block_at_end() const { return block_at_end_; }
  double intensity_at_end() const { return intensity_at_end_; }

 private:
  const StrategyParams& p_;
  const BubbleInput& b_;
  BubbleOutcome* o_;
  bool co_runs_;
  double remaining_at_end_ = 0.0, block_at_end_ = 0.0, intensity_at_end_ = 0.0;
};

// Ours and the PipeFill paper: slices of whole items fitted by the runtime's planner to the
// predicted bubble (minus the margins), back to back after the launch overhead; when a job
// completes inside the bubble the next one gets the rest (planned with the time used added to
// the margin).
//  - Ours (gated): the gate is closed by a stream-ordered write at the bubble end and seen by
//    the fill's blocks gate_visibility_us later; an item that started before that completes
//    (overrun <= one item), no later one starts.
//  - PipeFill paper (arXiv 2410.07192, abstract: "carefully fits fill job work to measured bubble
//    durations and GPU memory availability"): the same planner and predictor, but no device
//    gate: the whole planned piece runs to completion even when the bubble ends early.
void planned_slices(const StrategyParams& p, const BubbleInput& b, JobSource& jobs, bool gated, Ledger& ledger,
                    BubbleOutcome& o) {
  double consumed = 0.0;
  JobView job;
  while (jobs.current(consumed, &job)) {
    const PlannedSegment seg = jobs.plan(consumed);
    if (!seg.fill) break;
    double items = std::min(static_cast<double>(seg.items), items_needed(job.remaining_work, seg.work_per_item));
    const double start = consumed + p.launch_overhead_us;
    if (gated) {
      const double close = b.actual_us + p.gate_visibility_us;
      const double fits = close > start ? std::ceil((close - start) / seg.item_us - 1e-12) : 0.0;
      items = std::min(items, fits);
    }
    const double end = start + items * seg.item_us;
    ++o.segments;
    ledger.busy(consumed, end);
    ledger.active(start, end, job);
    const double work = std::min(job.remaining_work, items * seg.work_per_item);
    o.work_dedicated_us += items * seg.dedicated_item_us;
    jobs.record(consumed, end, items);
    jobs.consume(work, end);
    consumed = end;
    const bool completed = work >= job.remaining_work - 1e-9;
    if (completed && consumed < b.actual_us) continue;
    break;
  }
}

// Naive: fill launched at bubble begin on every SM, at the main job's (default) priority, in
// the main job's context (one hardware queue, as with Megatron's CUDA_DEVICE_MAX_CONNECTIONS=1):
// the host launches one item after the other while it has not seen the bubble end (it sees it
// at once: favourable), and nothing stops the item in flight. No prediction, no gate.
void naive(const StrategyParams& p, const BubbleInput& b, JobSource& jobs, Ledger& ledger, BubbleOutcome& o) {
  double t = 0.0;
  JobView job;
  while (jobs.current(t, &job)) {
    const double start = t + p.launch_overhead_us;
    if (start >= b.actual_us) break;
    const double launched = std::ceil((b.actual_us - start) / job.item_us - 1e-12);
    const double items = std::min(items_needed(job.remaining_work, job.work_per_item), launched);
    const double end = start + items * job.item_us;
    ++o.segments;
    ledger.busy(t, end);
    ledger.active(start, end, job);
    const double work = std::min(job.remaining_work, items * job.work_per_item);
    o.work_dedicated_us += items * job.dedicated_item_us;
    jobs.record(t, end, items);
    jobs.consume(work, end);
    t = end;
    if (work >= job.remaining_work - 1e-9 && t < b.actual_us) continue;
    break;
  }
}

// FreeRide (arXiv 2409.06941; jiashu-z/freeride): each side task is an MPS client at
// CUDA_MPS_CLIENT_PRIORITY 1 (a hint: the trainer's pending blocks go first), with no SM limit
// and no device gate. The scheduler (10 ms loop) starts the task when it sees a bubble, with the
// bubble's predicted end; the task (IterativeTask, 5 ms loop) runs step() only while
// `end_time - now > duration`, duration = the profiled median step rounded up to 10 ms, x 1.2,
// and sleeps 5 ms after each pass. A running step is never interrupted, and the host knows only
// the predicted end: a step admitted before it runs to completion even if the bubble has ended.
void freeride(const StrategyParams& p, const BubbleInput& b, JobSource& jobs, Rng& rng, Ledger& ledger,
              BubbleOutcome& o) {
  const FreeRideKnobs& k = p.freeride;
  // Bubble start seen by the scheduler's poll, then by the task's poll.
  const double u1 = rng.uniform(), u2 = rng.uniform();
  double t = k.scheduler_poll_us * u1 + k.task_poll_us * u2;
  JobView job;
  while (jobs.current(t, &job)) {
    const double c = job.item_us;
    const double rounded = k.step_rounding_us > 0 ? std::ceil(c / k.step_rounding_us - 1e-12) * k.step_rounding_us : c;
    const double admission = rounded * k.step_margin;
    double remaining = job.remaining_work;
    int steps = 0;
    while (b.predicted_us - t > admission && remaining > 1e-9) {
      const double end = t + c;
      ledger.busy(t, end);
      ledger.active(t, end, job);
      const double work = std::min(remaining, job.work_per_item);
      o.work_dedicated_us += job.dedicated_item_us;
      jobs.record(t, end, 1.0);
      jobs.consume(work, end);
      remaining -= work;
      t = end + k.task_poll_us;
      ++steps;
    }
    if (steps > 0) ++o.segments;
    if (remaining > 1e-9) break;  // not enough predicted time left for another step
  }
}

// Tally (ASPLOS'25, arXiv 2410.07381; tally-project/tally src/tally/scheduler/priority.cpp):
// the low-priority job's kernels are transformed into preemptive persistent thread blocks
// (PTB) on every SM (no reservation, no prediction) that claim tasks (original blocks) and
// check a retreat flag between tasks; a preempted kernel resumes from its global index, so
// progress is kept. At most one low-priority kernel is in flight (host relaunch gap between
// kernels), and a config is accepted only if its per-block latency is within the 0.1 ms budget.
//  - Tally (adapted, the headline row): the low-priority kernel is launched when the main job's
//    last kernel completes (seen by the host: signal_us) and retreats when the bubble really
//    ends (host sees it, then cudaMemsetAsync of the flag: signal_us); every worker finishes its
//    task (<= min(block_us, budget)). This is a favourable adaptation: see TallyAsCoded.
//  - Tally as coded: it preempts when the next high-priority kernel is *launched* (intercepted)
//    and runs low-priority work only while the high-priority queue is empty. A pipeline engine
//    whose CPU runs ahead enqueues the next kernel as soon as the bubble begins (hp_arrival_us
//    0), so nothing runs.
void tally(const StrategyParams& p, const BubbleInput& b, JobSource& jobs, bool as_coded, Ledger& ledger,
           BubbleOutcome& o) {
  const TallyKnobs& k = p.tally;
  const double start0 = k.signal_us + p.launch_overhead_us;
  if (as_coded && k.hp_arrival_us < start0) return;  // the main job's next kernel is already queued
  const double retreat = (as_coded ? std::min(k.hp_arrival_us, b.actual_us) : b.actual_us) + k.signal_us;
  double t = start0;
  JobView job;
  double last_end = 0.0, last_start = 0.0, last_block = 0.0, last_intensity = 0.0;
  while (t < retreat && jobs.current(t, &job)) {
    const double kernel_efficiency = job.kernel_us / (job.kernel_us + k.relaunch_gap_us);
    const double item_time = job.item_us / (k.norm_speed * kernel_efficiency);
    const double task = std::min(job.block_us, k.preemption_budget_us);
    const double stop = retreat + task / 2;  // the mean worker finishes its task after the flag
    const double finish = t + job.remaining_work / job.work_per_item * item_time;
    const double end = std::min(stop, finish);
    const double items = (end - t) / item_time;  // progress is kept across preemptions
    ++o.segments;
    ledger.busy(t, end);
    ledger.active(t, end, job);
    const double work = std::min(job.remaining_work, items * job.work_per_item);
    o.work_dedicated_us += items * job.dedicated_item_us;
    jobs.record(t, end, items);
    jobs.consume(work, end);
    last_start = t;
    last_end = end;
    last_block = task;
    last_intensity = job.mem_intensity;
    if (end >= stop) break;
    t = end + k.relaunch_gap_us + p.launch_overhead_us;  // the next job's kernel
  }
  const double A = b.actual_us;
  if (last_end > A && last_start < A) {
    // The workers hold every SM until the flag is seen, then drain their tasks.
    const double wait = std::max(0.0, retreat - A);
    o.overran = true;
    o.first_block_us = wait + last_block / (p.sm_count + 1);
    o.sm_own_us = wait + last_block;
    o.yield_us = wait + last_block / 2;
    o.corun_us = p.interference.mem_slowdown * last_intensity * last_block / 2;
  }
}

}  // namespace

const char* strategy_name(FillStrategy s) {
  switch (s) {
    case FillStrategy::Ours: return "ours";
    case FillStrategy::Naive: return "naive";
    case FillStrategy::FreeRide: return "freeride";
    case FillStrategy::FreeRideIdeal: return "freeride-ideal";
    case FillStrategy::Tally: return "tally";
    case FillStrategy::TallyAsCoded: return "tally-as-coded";
    case FillStrategy::PaperStyle: return "paper";
  }
  return "?";
}

bool parse_strategy(const std::string& text, FillStrategy* out) {
  for (FillStrategy s : all_strategies())
    if (text == strategy_name(s)) {
      *out = s;
      return true;
    }
  return false;
}

const char* strategy_choices() { return "ours, naive, freeride, freeride-ideal, tally, tally-as-coded or paper"; }

std::vector<FillStrategy> all_strategies() {
  return {FillStrategy::Ours,  FillStrategy::Naive,        FillStrategy::FreeRide,  FillStrategy::FreeRideIdeal,
          FillStrategy::Tally, FillStrategy::TallyAsCoded, FillStrategy::PaperStyle};
}

StrategyParams effective_params(const StrategyParams& in) {
  StrategyParams p = in;
  if (p.strategy != FillStrategy::Ours) {
    // Only ours reserves SMs; every peer may use all of them.
    p.fill_sm_share = 1.0;
    p.reserved = false;
  }
  if (p.strategy == FillStrategy::FreeRideIdeal) {
    p.freeride.step_rounding_us = 0.0;
    p.freeride.scheduler_poll_us = 0.0;
    p.freeride.task_poll_us = 0.0;
  }
  return p;
}

double partition_speed(double sm_share, double mem_intensity) {
  if (!(sm_share > 0)) return 0.0;
  const double i = std::clamp(mem_intensity, 0.0, 1.0);
  return 1.0 / ((1.0 - i) / std::min(1.0, sm_share) + i);
}

BubbleOutcome simulate_bubble(const StrategyParams& p, const BubbleInput& b, JobSource& jobs, Rng& rng) {
  BubbleOutcome o;
  // Naive's fill sits ahead of the main job in one queue (the main job waits for all of it);
  // Tally drains on its own terms; the others yield to the main job's pending blocks (CUDA
  // stream / MPS client priority orders pending blocks, never preempts running ones) and the
  // rest of their work co-runs with it.
  const bool co_runs = p.strategy != FillStrategy::Naive && p.strategy != FillStrategy::Tally &&
                       p.strategy != FillStrategy::TallyAsCoded;
  Ledger ledger(p, b, &o, co_runs);
  switch (p.strategy) {
    case FillStrategy::Ours: planned_slices(p, b, jobs, p.gated, ledger, o); break;
    case FillStrategy::PaperStyle: planned_slices(p, b, jobs, false, ledger, o); break;
    case FillStrategy::Naive: naive(p, b, jobs, ledger, o); break;
    case FillStrategy::FreeRide:
    case FillStrategy::FreeRideIdeal: freeride(p, b, jobs, rng, ledger, o); break;
    case FillStrategy::Tally: tally(p, b, jobs, false, ledger, o); return o;
    case FillStrategy::TallyAsCoded: tally(p, b, jobs, true, ledger, o); return o;
  }
  if (p.strategy == FillStrategy::Naive) {
    if (o.post_us > 0) {
      o.overran = true;
      o.first_block_us = o.sm_own_us = o.yield_us = o.post_us;
    }
    return o;
  }
  const double r = ledger.remaining_at_end();
  if (r > 0) {
    // The blocks running at the bubble end finish (<= one block); the main kernel gets their SMs
    // as they do (it loses half a block of time on the fill's share on average), its first block
    // starts at once on reserved SMs, else on the first SM to free up.
    const double own = std::min(r, ledger.block_at_end());
    o.overran = true;
    o.sm_own_us = own;
    o.yield_us = p.fill_sm_share * own / 2;
    o.first_block_us = p.reserved ? 0.0 : own / (p.sm_count + 1);
  }
  return o;
}

}  // namespace pipefill::cluster
