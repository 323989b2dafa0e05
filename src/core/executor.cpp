// The executor: handles the bubble messages (begin: the record and, in executor mode, the fill;
// end: timing and notices), harvests completed bubbles and slices (times, items, learned costs),
// quarantines slices whose end cannot be tracked, and drains or synchronises the fill streams.
// Planning inputs per class are in executor_plans.cpp, the inline launch mode in executor_inline.cpp.
#include "core/executor.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <iterator>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/harvester.hpp"
#include "core/job_registry.hpp"
#include "core/late_slices.hpp"

namespace pipefill::core {

void record_async_error(RuntimeState& s, pfResult_t code, const std::string& message) {
  pfResult_t expected = pfSuccess;
  if (s.async_error.compare_exchange_strong(expected, code)) s.async_message = message;
  log::warn("asynchronous error {}: {}", result_name(code), message);
}

namespace {

// A harvested slice's measurement of its job's item cost (cost_model.hpp): only timed slices
// that ran items inside an open bubble measure it (a late slice ran nothing; an untimed one has
// no trustworthy times). The estimate replaces the configuration's cost the planner uses.
void learn_item_cost(RuntimeState& s, JobState& job, const SliceRecord& slice,
                     const SliceAccounting& a, bool timed) REQUIRES(s.mu) {
  if (slice.probe) job.cost.note_probe();
  const bool measured = timed && !job.detached && a.items_done > 0 && !a.late &&
                        !slice.enqueued_after_end && slice.config_index >= 0 &&
                        static_cast<size_t>(slice.config_index) < job.planned_configs.size();
  if (!measured) return;
  const size_t index = static_cast<size_t>(slice.config_index);
  job.planned_configs[index].item_cost_us = job.cost.add_slice(
      index, a.busy_us, a.items_done, slice.workers, job.configs[index].item_cost_us);
  job.planned_configs[index].slice_tail_us = job.cost.slice_tail(index);
  if (!slice.probe) job.cost.note_fitted();
}

// A timed bubble in which the job's estimated item did not fit: its streak grows, and at
// too_short_warn_bubbles in a row it is warned about once, with the numbers that made it so.
void note_too_short(RuntimeState& s, JobState& job, const BubbleRecord& bubble,
                    int warn_after) REQUIRES(s.mu) {
  job.cost.note_too_short(bubble.predicted_us, bubble.gated_budget_us);
  if (job.cost.warned || job.cost.too_short_streak < static_cast<uint32_t>(warn_after)) return;
  job.cost.warned = true;
  const size_t index = static_cast<size_t>(current_config(job));
  std::array<double, kRecentTooShort> predicted{}, budget{};
  const size_t n = job.cost.recent(predicted, budget);
  std::string predictions, budgets;
  for (size_t i = 0; i < n; ++i) {
    predictions += fmt::format("{}{:.1f}", i == 0 ? "" : ", ", predicted[i]);
    budgets += fmt::format("{}{:.1f}", i == 0 ? "" : ", ", budget[i]);
  }
  log::warn("job '{}' was skipped as too short in {} consecutive bubbles: its item is estimated "
            "at {:.1f} us (given {:.1f} us at creation, {} measured samples, {} one-item probes) "
            "and the last {} bubbles were predicted at {} us (budgets after the margins {} us). It runs only when a bubble fits one item "
            "(and in an occasional one-item probe); if the estimate is wrong, give the job a "
            "realistic item cost. (PIPEFILL_TOO_SHORT_WARN_BUBBLES={} sets when this warns.)",
            job.name, job.cost.too_short_streak, job.planned_configs[index].item_cost_us,
            job.configs[index].item_cost_us, job.cost.samples(index), job.cost.probes,
            n, predictions, budgets, warn_after);
}

}  // namespace

void Executor::handle_messages(std::span<const BubbleMessage> batch) {
  MutexLock lock(state_.mu);
  try {
    for (const BubbleMessage& m : batch) {
      if (m.type == BubbleMessage::Type::Begin) {
        handle_begin(state_, m);
      } else {
        handle_end(state_, m);
      }
    }
    refresh_plans(state_);
  } catch (const std::exception& e) {
    record_async_error(state_, pfErrorInternal, fmt::format("executor: {}", e.what()));
  } catch (...) {
    record_async_error(state_, pfErrorInternal, "executor: unknown exception");
  }
}

void Executor::poll_completions() {
  MutexLock lock(state_.mu);
  try {
    harvest(state_);
    refresh_plans(state_);
  } catch (const std::exception& e) {
    record_async_error(state_, pfErrorInternal, fmt::format("executor: {}", e.what()));
  } catch (...) {
    record_async_error(state_, pfErrorInternal, "executor: unknown exception");
  }
}

bool Executor::awaits_completions() {
  // harvest() takes bubbles from the front of `pending` once they ended; refresh_plans() (inline
  // mode only) runs after a harvest. Bubbles not yet ended wait for their End message, which
  // wakes the pump.
  MutexLock lock(state_.mu);
  return std::any_of(state_.pending.begin(), state_.pending.end(),
                     [](const BubbleRecord& b) { return b.ended; }) ||
         (options_.launch_mode == pfLaunchInline && state_.plans_dirty);
}

bool Executor::left_unfilled_by_kind(BubbleRecord& bubble) const {
  // The DP all-reduce window: NCCL moves its bytes through the whole bubble, on the main job's
  // critical path; fill beside it takes HBM bandwidth from the collective and stretches it
  // (NVIDIA/nccl#1433: send/recv up to 2x slower beside a GEMM on other SMs). Measured like any
  // bubble, filled only when the user opts in.
  if (bubble.kind != pfBubbleOptimizer || options_.fill_optimizer_bubbles) return false;
  bubble.skip_reason =
      "an optimizer (all-reduce) bubble: fill_optimizer_bubbles is 0 (fill beside the collective "
      "would stretch it; PIPEFILL_FILL_OPTIMIZER_BUBBLES=1 fills it)";
  bubble.skip_cause = pfSkipOptimizer;
  return true;
}

BubbleRecord& Executor::open_bubble_record(RuntimeState& s, const BubbleMessage& m) {
  // The record of a begun bubble, until it is harvested (both launch modes make it the same way).
  // In bubble order: in inline mode a bubble left to the executor (deferred) gets its record when
  // the executor handles its Begin, possibly after the next bubble's pfBubbleBegin made that one's.
  auto at = s.pending.end();
  while (at != s.pending.begin() && std::prev(at)->id > m.bubble_id) --at;
  BubbleRecord& bubble = *s.pending.emplace(at);
  bubble.id = m.bubble_id;
  bubble.iteration = m.iteration;
  bubble.index_in_iteration = m.index_in_iteration;
  bubble.class_key = bubble_class_key(m.index_in_iteration, m.label);
  bubble.kind = m.kind;
  bubble.tracked = m.tracked;
  if (!m.tracked) {
    bubble.skip_reason = "bubble event pool exhausted";
    bubble.skip_cause = pfSkipUntimed;
  }
  return bubble;
}

void Executor::quarantine_slice(RuntimeState& s, uint64_t bubble_id, size_t slot,
                                const std::string& why) {
  for (BubbleRecord& bubble : s.pending) {
    if (bubble.id != bubble_id) continue;
    for (auto it = bubble.slices.begin(); it != bubble.slices.end(); ++it) {
      if (it->event_slot != slot) continue;
      record_async_error(s, pfErrorCudaFailure,
                         fmt::format("fill slice of job '{}' in bubble {}: its end cannot be "
                                     "tracked ({}); its resources stay taken until its fill "
                                     "stream has passed it",
                                     it->job->name, bubble_id, why));
      s.quarantined.push_back(QuarantinedSlice{std::move(*it), bubble_id});
      bubble.slices.erase(it);
      return;
    }
  }
}

void Executor::handle_begin(RuntimeState& s, const BubbleMessage& m) {
  // Harvest first: on the simulated device this makes the prediction for this bubble depend
  // only on what completed before it was begun, hence deterministic.
  harvest(s);
  // Inline mode: pfBubbleBegin made the bubble's record and enqueued its slices, unless it left
  // the bubble to the executor (deferred): then it is filled here, as in executor mode.
  if (options_.launch_mode == pfLaunchInline && !m.deferred) return;
  BubbleRecord& bubble = open_bubble_record(s, m);
  if (!bubble.tracked || left_unfilled_by_kind(bubble)) return;
  std::string why;
  const FillRequest request = request_for(s, bubble.class_key, m.expected_us, &why);
  bubble.predicted_us = request.gated_predicted_us;
  if (bubble.predicted_us <= 0) {
    bubble.skip_reason = why;
    bubble.skip_cause = pfSkipNoHistory;
    return;
  }
  launcher_.fill(s, bubble, request);
}

void Executor::handle_end(RuntimeState& s, const BubbleMessage& m) {
  for (auto it = s.pending.rbegin(); it != s.pending.rend(); ++it) {
    if (it->id == m.bubble_id) {
      it->ended = true;
      it->abandoned = m.abandoned;
      // Whether the class's fill is bounded by an early close decides its gated quantile.
      const bool changed = m.fill_closed_early ? s.noticed_classes.insert(it->class_key).second
                                               : s.noticed_classes.erase(it->class_key) > 0;
      if (changed) s.plans_dirty = true;
      return;
    }
  }
}

void Executor::release_quarantined(RuntimeState& s, int stream, uint64_t before_sequence) {
  auto it = s.quarantined.begin();
  while (it != s.quarantined.end()) {
    if (it->slice.sequence >= before_sequence || (stream >= 0 && it->slice.stream != stream)) {
      ++it;
      continue;
    }
    SliceRecord& slice = it->slice;
    JobState& job = *slice.job;
    --job.slices_in_flight;
    job.items_in_flight -= std::min(job.items_in_flight, slice.planned_items);
    // Its read-back is lost: a ticket job's count catches up with its next slice's read-back;
    // opaque work counts as planned, as always.
    if (job.kind == pfJobOpaque && !slice.launch_failed) {
      const uint64_t before = job.items_completed;
      job.items_completed = std::min(job.item_count, job.items_completed + slice.planned_items);
      if (!job.detached) s.stats.items_completed += job.items_completed - before;
    }
    if (slice.workspace != 0) s.arena.release(slice.workspace);
    if (job.last_slice_slot == slice.event_slot) job.last_slice_slot = SIZE_MAX;
    s.free_slice_slots.push_back(slice.event_slot);
    s.plans_dirty = true;
    settle_job(s, job);
    it = s.quarantined.erase(it);
  }
}

void Executor::settle_job(RuntimeState& s, JobState& job) {
  if (job.detached) return;
  if (job.items_completed > 0 && job.status == pfJobPending) {
    job.status = pfJobRunning;
    s.job_changed.notify_all();
  }
  if (job.items_completed >= job.item_count && !is_terminal(job.status)) {
    end_job(s, job, pfJobCompleted, pfSuccess, "");
  }
  maybe_teardown(s, job);
}

void Executor::harvest(RuntimeState& s) {
  while (!s.pending.empty()) {
    BubbleRecord& bubble = s.pending.front();
    if (!bubble.ended) return;
    // Bubble ids are consecutive; a gap is a deferred bubble (inline mode) whose record the
    // executor has not made yet: the harvest stays in bubble order and waits for it.
    if (bubble.id != s.harvested_upto.load(std::memory_order_relaxed) + 1) return;
    double begin_us = 0.0, end_us = 0.0;
    auto completed = [&](Event e, double* t) {
      s.mu.assert_held();
      bool done = false;
      if (device_.query_event(e, &done, t) != pfSuccess) {
        record_async_error(s, pfErrorInternal,
                           fmt::format("query_event failed while harvesting bubble {}: {}",
                                       bubble.id, last_error_message()));
        *t = 0.0;
        return true;  // never block the harvest on a broken event
      }
      return done;
    };
    if (bubble.tracked) {
      if (!completed(resources_.begin_event(bubble.id), &begin_us)) return;
      if (!bubble.abandoned) {
        if (!completed(resources_.end_event(bubble.id), &end_us)) return;
      }
    }
    // Slices of untracked bubbles never launch; those of abandoned ones must still end.
    for (const SliceRecord& slice : bubble.slices) {
      double t = 0.0;
      if (!completed(resources_.slice_start_events[slice.event_slot], &t)) return;
      if (!completed(resources_.slice_end_events[slice.event_slot], &t)) return;
    }
    // Each fill stream runs in order: a completed slice end means every slice enqueued on that
    // stream before it has ended too, including those whose own end could not be tracked.
    std::array<uint64_t, kMaxFillStreams> last_sequence{};
    for (const SliceRecord& slice : bubble.slices) {
      uint64_t& last = last_sequence[static_cast<size_t>(slice.stream)];
      last = std::max(last, slice.sequence);
    }
    harvest_bubble(s, bubble, begin_us, end_us);
    if (!s.quarantined.empty()) {
      for (size_t stream = 0; stream < last_sequence.size(); ++stream) {
        if (last_sequence[stream] > 0) {
          release_quarantined(s, static_cast<int>(stream), last_sequence[stream]);
        }
      }
    }
    s.harvested_upto.store(bubble.id, std::memory_order_release);
    s.pending.pop_front();
  }
}

void Executor::harvest_bubble(RuntimeState& s, BubbleRecord& bubble, double begin_us,
                              double end_us) {
  // Not timed: no event pair was free (untracked), or its stream died before the end
  // (abandoned). Its slices still settle their jobs; there is no bubble to measure them against.
  const bool timed = bubble.tracked && !bubble.abandoned;
  // Observe every slice, then account. A job has at most one slice per bubble, so the jobs'
  // counts read here are those before the bubble.
  std::vector<SliceObservation> observations;
  observations.reserve(bubble.slices.size());
  for (const SliceRecord& slice : bubble.slices) {
    SliceObservation o;
    bool done = false;
    device_.query_event(resources_.slice_start_events[slice.event_slot], &done, &o.start_us);
    device_.query_event(resources_.slice_end_events[slice.event_slot], &done, &o.end_us);
    o.kind = slice.launch_failed ? pfJobTicket : slice.job->kind;  // count only what ran
    o.cursor_readback = resources_.host_words[slice.event_slot];
    o.planned_items = slice.planned_items;
    o.items_completed_before = slice.job->items_completed;
    o.item_count = slice.job->item_count;
    o.sms = slice.sms;
    observations.push_back(o);
  }
  if (!timed) {
    begin_us = end_us = observations.empty() ? 0.0 : observations.front().start_us;
  }
  const BubbleAccounting accounting = account_bubble(begin_us, end_us, observations);
  s.plans_dirty = true;  // the predictor and the jobs' counts change
  // Every harvested bubble counts, timed or not, so bubbles_skipped (which counts the untimed
  // ones under pfSkipUntimed) never exceeds bubbles; only timed ones have a duration.
  ++s.stats.bubbles;
  if (timed) {
    s.predictor.add_sample(bubble.class_key, accounting.duration_us);
    s.stats.bubble_time_us += accounting.duration_us;
  }
  // The jobs whose estimated item fitted no budget of this bubble (counted once per bubble,
  // before its slices: a probe among them then backs off from the streak it ends on).
  if (timed && bubble.too_short_slots.any()) {
    for (const std::shared_ptr<JobState>& job : s.jobs) {
      if (job->slot >= 0 && bubble.too_short_slots.test(static_cast<size_t>(job->slot)) &&
          !job->detached && !is_terminal(job->status)) {
        note_too_short(s, *job, bubble, options_.too_short_warn_bubbles);
      }
    }
  }
  size_t launched = 0;
  uint64_t class_items = 0;
  uint64_t late_backoffs = 0;
  // Jobs held out by late slices (note_late_slices) that got no slice of this timed bubble: one
  // more bubble towards their next retry.
  if (timed) {
    for (const std::shared_ptr<JobState>& job : s.jobs) {
      if (job->late_hold_us <= 0 || job->detached || is_terminal(job->status)) continue;
      const bool had_slice =
          std::any_of(bubble.slices.begin(), bubble.slices.end(),
                      [&](const SliceRecord& slice) { return slice.job == job; });
      if (!had_slice && bubble.predicted_us > 0 && bubble.predicted_us <= job->late_hold_us) {
        ++job->late_hold_skipped;
      }
    }
  }
  for (size_t i = 0; i < bubble.slices.size(); ++i) {
    SliceRecord& slice = bubble.slices[i];
    const SliceAccounting& a = accounting.slices[i];
    JobState& job = *slice.job;
    --job.slices_in_flight;
    job.items_in_flight -= std::min(job.items_in_flight, slice.planned_items);
    // Items whose function failed (the host device: it threw) were claimed, so the read-back
    // counts them: they are not completed, and they fail the job (below).
    std::string item_failure;
    uint64_t not_run = 0;
    const uint64_t failed_items =
        slice.launch_failed ? 0
                            : device_.item_failures(resources_.slice_start_events[slice.event_slot],
                                                    &not_run, &item_failure);
    const uint64_t not_done = std::min(a.items_done, failed_items + not_run);
    const uint64_t items_done = a.items_done - not_done;
    job.items_completed = a.items_completed_after - not_done;
    // Slices of detached (destroyed) jobs count towards filled time and overrun too: their work
    // ran on the device all the same.
    if (timed) job.busy_time_us += a.busy_us;
    if (!job.detached) {
      s.stats.items_completed += items_done;
      class_items += items_done;
    }
    if (failed_items > 0 && !job.detached && !is_terminal(job.status)) {
      const std::string message = fmt::format(
          "job '{}': {} item(s) failed in bubble {} ({} of the slice's items completed): {}",
          job.name, failed_items, bubble.id, items_done, item_failure);
      end_job(s, job, pfJobFailed, pfErrorJobFailed, message);
      record_async_error(s, pfErrorJobFailed, message);
    }
    if (!slice.launch_failed) {
      ++launched;
      if (failed_items == 0) learn_item_cost(s, job, slice, a, timed);
      // A ticket slice that started while its bubble was open and still claimed nothing: its
      // launch callback enqueued nothing (or no block ever got an SM). Many in a row end the job
      // instead of letting it take bubble time forever.
      const bool late = a.late || slice.enqueued_after_end;
      if (is_gated(job.kind) && timed && !job.detached &&
          note_late_slices(s, job, late, a.items_done, slice.enqueued_after_end,
                           options_.launch_mode, observations[i].start_us - begin_us, bubble)) {
        ++late_backoffs;
      }
      if (is_gated(job.kind) && timed && !late && !job.detached) {
        job.slices_without_progress = a.items_done > 0 ? 0 : job.slices_without_progress + 1;
        if (job.slices_without_progress >= kMaxSlicesWithoutProgress) {
          const std::string message = fmt::format(
              "job '{}': {} slices in a row ran in open bubbles and completed no item; {}",
              job.name, job.slices_without_progress,
              job.kind == pfJobGraph
                  ? "does its graph's item finish (no host sync, no wait on other streams)?"
                  : "does its launch callback enqueue a ticket kernel on the given stream?");
          log::warn("{}", message);
          end_job(s, job, pfJobFailed, pfErrorJobFailed, message);
          record_async_error(s, pfErrorJobFailed, message);
        }
      }
      s.trace.add(TraceSlice{bubble.id, job.name, observations[i].start_us,
                             observations[i].end_us, a.items_done, slice.config_index, late});
    }
    if (slice.workspace != 0) s.arena.release(slice.workspace);
    if (job.last_slice_slot == slice.event_slot) job.last_slice_slot = SIZE_MAX;
    s.free_slice_slots.push_back(slice.event_slot);
    settle_job(s, job);
  }
  // The class's counters (pfRuntimeGetClassStats), made at its first harvested bubble.
  auto [slot, added] = s.class_index.try_emplace(bubble.class_key, s.classes.size());
  if (added) s.classes.push_back(ClassCounters{.key = bubble.class_key});
  ClassCounters& counters = s.classes[slot->second];
  ++counters.bubbles;
  counters.late_backoffs += late_backoffs;
  counters.kind = bubble.kind;
  counters.items_completed += class_items;
  if (!timed) {
    ++s.stats.bubbles_skipped;
    ++s.skip_counts[pfSkipUntimed];
    ++counters.skips[pfSkipUntimed];
    return;
  }
  ++counters.bubbles_timed;
  counters.bubble_time_us += accounting.duration_us;
  counters.filled_time_us += accounting.filled_us;
  s.stats.filled_time_us += accounting.filled_us;
  s.stats.filled_sm_us += accounting.filled_sm_us;
  s.stats.capacity_sm_us += accounting.duration_us * resources_.partition.fill_sms;
  if (bubble.iteration > s.calibration_iteration) {
    s.calibration_iteration = bubble.iteration;
    collect_calibration(s);
  }
  if (accounting.overrun_us > 0) {
    s.stats.overrun_time_us += accounting.overrun_us;
    s.stats.max_overrun_us = std::max(s.stats.max_overrun_us, accounting.overrun_us);
  }
  s.stats.slices_past_end += accounting.slices_past_end;
  if (accounting.fill_start_delay_us >= 0) {
    ++s.stats.bubbles_fill_started;
    s.stats.fill_start_delay_us += accounting.fill_start_delay_us;
    s.stats.max_fill_start_delay_us = std::max(s.stats.max_fill_start_delay_us, accounting.fill_start_delay_us);
  }
  if (launched == 0) {
    ++s.stats.bubbles_skipped;
    // Slices recorded but none launched: their launches failed, whatever the plan noted first.
    const pfSkipCause_t cause = bubble.slices.empty() ? bubble.skip_cause : pfSkipLaunchFailed;
    ++s.skip_counts[static_cast<size_t>(cause)];
    ++counters.skips[static_cast<size_t>(cause)];
    log::trace("bubble {} ({}) not filled: {}", bubble.id, bubble.class_key, bubble.skip_reason);
  } else {
    ++s.stats.bubbles_filled;
    ++counters.bubbles_filled;
  }
  s.trace.add(TraceBubble{bubble.id, bubble.iteration, bubble.class_key, bubble.kind, begin_us,
                          end_us, bubble.predicted_us, launched});
}

void Executor::collect_calibration(RuntimeState& s) {
  if (!options_.enable_cupti || !s.calibration_available) return;
  std::vector<ActivityRecord> batch;
  const pfResult_t result = device_.collect_activity(&batch);
  if (result == pfErrorNotSupported) {
    s.calibration_available = false;  // the device said why (e.g. CUPTI held by a profiler)
    log::warn("calibration mode: the {} device collects no activity records ({}); continuing "
              "with bubble events only",
              device_.name(), last_error_message());
    return;
  }
  if (result != pfSuccess) {
    log::warn("calibration mode: collecting activity records failed: {}", last_error_message());
    return;
  }
  for (ActivityRecord& r : batch) {
    if (s.trace.calibration.size() >= TraceRecords::kMaxRecords) {
      s.trace.truncated = true;
      break;
    }
    s.trace.add(std::move(r));
  }
}

pfResult_t Executor::drain_fill_streams(RuntimeState& s) {
  uint64_t enqueued_before = 0;
  {
    MutexLock lock(s.mu);
    enqueued_before = s.next_slice_sequence;
  }
  for (Stream stream : resources_.fill_streams) PF_TRY(device_.synchronize_stream(stream));
  MutexLock lock(s.mu);
  release_quarantined(s, /*stream=*/-1, enqueued_before);
  return pfSuccess;
}

pfResult_t Executor::synchronize(RuntimeState& s) {
  PF_TRY(drain_fill_streams(s));
  // The end events to wait for are copied under the lock and waited on without it: a GPU wait
  // under s.mu would hold the trainer's next bubble instruction (inline mode) and the executor's
  // harvest until the GPU caught up (issue 33 item 3). The pool's events live as long as the
  // runtime; one re-recorded meanwhile by a later bubble is waited on to that bubble's end.
  std::vector<Event> ended;
  {
    MutexLock lock(s.mu);
    for (const BubbleRecord& b : s.pending) {
      if (b.ended && b.tracked) ended.push_back(resources_.end_event(b.id));
    }
  }
  for (Event event : ended) PF_TRY(device_.synchronize_event(event));
  MutexLock lock(s.mu);
  harvest(s);
  collect_calibration(s);
  return pfSuccess;
}

}  // namespace pipefill::core
