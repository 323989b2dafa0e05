#include "core/executor.hpp"

#include <algorithm>
#include <exception>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/harvester.hpp"
#include "core/job_registry.hpp"

namespace pipefill::core {

void record_async_error(RuntimeState& s, pfResult_t code, const std::string& message) {
  pfResult_t expected = pfSuccess;
  if (s.async_error.compare_exchange_strong(expected, code)) s.async_message = message;
  log::warn("asynchronous error {}: {}", result_name(code), message);
}

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
  } catch (const std::exception& e) {
    record_async_error(state_, pfErrorInternal, fmt::format("executor: {}", e.what()));
  } catch (...) {
    record_async_error(state_, pfErrorInternal, "executor: unknown exception");
  }
}

void Executor::handle_begin(RuntimeState& s, const BubbleMessage& m) {
  // Harvest first: on the simulated device this makes the prediction for this bubble depend
  // only on what completed before it was begun, hence deterministic.
  harvest(s);
  s.pending.emplace_back();
  BubbleRecord& bubble = s.pending.back();
  bubble.id = m.bubble_id;
  bubble.iteration = m.iteration;
  bubble.index_in_iteration = m.index_in_iteration;
  bubble.class_key = bubble_class_key(m.index_in_iteration, m.label);
  bubble.kind = m.kind;
  bubble.tracked = m.tracked;
  if (!m.tracked) {
    bubble.skip_reason = "bubble event pool exhausted";
    return;
  }
  const BubblePrediction prediction =
      s.predictor.predict(bubble.class_key, options_.prediction_quantile);
  double predicted = 0.0;
  if (prediction.ready && prediction.count > 0) {
    predicted = prediction.quantile_us;
  } else if (m.expected_us > 0) {
    predicted = m.expected_us;
  }
  bubble.predicted_us = predicted;
  if (predicted <= 0) {
    bubble.skip_reason = fmt::format("class {} has {} of {} samples and no expected duration",
                                     bubble.class_key, prediction.count, options_.min_samples);
    return;
  }
  launcher_.fill(s, bubble, predicted, m);
}

void Executor::handle_end(RuntimeState& s, const BubbleMessage& m) {
  for (auto it = s.pending.rbegin(); it != s.pending.rend(); ++it) {
    if (it->id == m.bubble_id) {
      it->ended = true;
      return;
    }
  }
}

void Executor::harvest(RuntimeState& s) {
  while (!s.pending.empty()) {
    BubbleRecord& bubble = s.pending.front();
    if (!bubble.ended) return;
    double begin_us = 0.0, end_us = 0.0;
    if (bubble.tracked) {
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
      if (!completed(resources_.begin_event(bubble.id), &begin_us)) return;
      if (!completed(resources_.end_event(bubble.id), &end_us)) return;
      for (const SliceRecord& slice : bubble.slices) {
        double t = 0.0;
        if (!completed(resources_.slice_start_events[slice.event_slot], &t)) return;
        if (!completed(resources_.slice_end_events[slice.event_slot], &t)) return;
      }
    }
    harvest_bubble(s, bubble, begin_us, end_us);
    s.harvested_upto.store(bubble.id, std::memory_order_release);
    s.pending.pop_front();
  }
}

void Executor::harvest_bubble(RuntimeState& s, BubbleRecord& bubble, double begin_us,
                              double end_us) {
  if (!bubble.tracked) {
    ++s.stats.bubbles_skipped;
    return;
  }
  // Observe every slice, then account. A job has at most one slice per bubble, so the jobs'
  // counts read here are those before the bubble.
  std::vector<SliceObservation> observations;
  observations.reserve(bubble.slices.size());
  for (const SliceRecord& slice : bubble.slices) {
    SliceObservation o;
    bool done = false;
    device_.query_event(resources_.slice_start_events[slice.event_slot], &done, &o.start_us);
    device_.query_event(resources_.slice_end_events[slice.event_slot], &done, &o.end_us);
    o.kind = slice.job->kind;
    o.cursor_readback = resources_.host_words[slice.event_slot];
    o.planned_items = slice.planned_items;
    o.items_completed_before = slice.job->items_completed;
    o.item_count = slice.job->item_count;
    observations.push_back(o);
  }
  const BubbleAccounting accounting = account_bubble(begin_us, end_us, observations);
  s.predictor.add_sample(bubble.class_key, accounting.duration_us);
  ++s.stats.bubbles;
  s.stats.bubble_time_us += accounting.duration_us;
  for (size_t i = 0; i < bubble.slices.size(); ++i) {
    SliceRecord& slice = bubble.slices[i];
    const SliceAccounting& a = accounting.slices[i];
    JobState& job = *slice.job;
    --job.slices_in_flight;
    job.items_in_flight -= std::min(job.items_in_flight, slice.planned_items);
    job.items_completed = a.items_completed_after;
    // Slices of detached (destroyed) jobs count towards filled time and overrun too: their work
    // ran on the device all the same.
    job.busy_time_us += a.busy_us;
    if (!job.detached) {
      s.stats.items_completed += a.items_done;
      if (job.items_completed > 0 && job.status == pfJobPending) {
        job.status = pfJobRunning;
        s.job_changed.notify_all();
      }
      if (job.items_completed >= job.item_count && !is_terminal(job.status)) {
        end_job(s, job, pfJobCompleted, pfSuccess, "");
      }
      maybe_teardown(s, job);
    }
    if (slice.workspace != 0) s.arena.release(slice.workspace);
    s.free_slice_slots.push_back(slice.event_slot);
    s.trace.add(TraceSlice{bubble.id, job.name, observations[i].start_us, observations[i].end_us,
                           a.items_done, slice.config_index, false});
  }
  s.stats.filled_time_us += accounting.filled_us;
  if (bubble.iteration > s.calibration_iteration) {
    s.calibration_iteration = bubble.iteration;
    collect_calibration(s);
  }
  if (accounting.overrun_us > 0) {
    s.stats.overrun_time_us += accounting.overrun_us;
    s.stats.max_overrun_us = std::max(s.stats.max_overrun_us, accounting.overrun_us);
  }
  if (bubble.slices.empty()) {
    ++s.stats.bubbles_skipped;
    log::trace("bubble {} ({}) not filled: {}", bubble.id, bubble.class_key, bubble.skip_reason);
  } else {
    ++s.stats.bubbles_filled;
  }
  s.trace.add(TraceBubble{bubble.id, bubble.iteration, bubble.class_key, bubble.kind, begin_us,
                          end_us, bubble.predicted_us, bubble.slices.size()});
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

pfResult_t Executor::synchronize(RuntimeState& s) {
  PF_TRY(device_.synchronize_stream(resources_.fill_stream));
  MutexLock lock(s.mu);
  for (const BubbleRecord& b : s.pending) {
    if (b.ended && b.tracked) PF_TRY(device_.synchronize_event(resources_.end_event(b.id)));
  }
  harvest(s);
  collect_calibration(s);
  return pfSuccess;
}

}  // namespace pipefill::core
