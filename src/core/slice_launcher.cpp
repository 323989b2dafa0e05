#include "core/slice_launcher.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "core/graph_job.hpp"
#include "core/job_registry.hpp"
#include "core/scheduler.hpp"

namespace pipefill::core {
namespace {

// "pfErrorJobFailed", or "999 (not a pfResult_t)" for a value a callback made up.
std::string result_text(int result) {
  const bool known = result > pfSuccess && result < pfResultCount;
  return known ? std::string(result_name(static_cast<pfResult_t>(result)))
               : fmt::format("{} (not a pfResult_t)", result);
}

// Workers a configuration may use in the partition (its parallelism, capped by the fill SMs).
int workers_of(const JobConfigModel& c, int fill_sms) {
  return std::max(1, c.parallelism > 0 ? std::min(c.parallelism, fill_sms) : fill_sms);
}

}  // namespace

SliceLauncher::Observed SliceLauncher::observe(const RuntimeState& s, const BubbleRecord& bubble,
                                               bool elapsed) {
  Observed o;
  bool done = false;
  double t = 0.0;
  // The end event of this bubble may only be queried once it was recorded (its slot still holds
  // the completed record of an older bubble until then).
  if (s.ended_upto.load(std::memory_order_acquire) >= bubble.id &&
      device_.query_event(resources_.end_event(bubble.id), &done, &t) == pfSuccess && done) {
    o.ended = true;
    return o;
  }
  clear_last_error();
  if (!elapsed) return o;
  if (device_.query_event(resources_.begin_event(bubble.id), &done, &t) == pfSuccess && done) {
    o.elapsed_us = std::max(0.0, device_.now_us() - t);
  }
  clear_last_error();
  return o;
}

void SliceLauncher::fill(RuntimeState& s, BubbleRecord& bubble, const FillRequest& request) {
  if (observe(s, bubble, /*elapsed=*/false).ended) {
    bubble.skip_reason = "the bubble had ended before the executor handled it";
    bubble.skip_cause = pfSkipLate;
    return;
  }
  const BubblePlan packed = plan(s, request, &bubble);
  bubble.skip_reason = packed.skip_reason;
  bubble.skip_cause = packed.skip_cause;
  fill_packed(s, bubble, request, packed, /*observed=*/true, /*tails=*/nullptr);
}

BubblePlan SliceLauncher::plan(RuntimeState& s, const FillRequest& in,
                               const BubbleRecord* observed, const Packed* so_far) {
  BubblePlan out;
  const auto usable = [&](double predicted) {
    const double margin = in.margin_us >= 0 ? in.margin_us : options_.safety_margin_us;
    return predicted * (1.0 - options_.safety_margin_fraction) - margin;
  };
  const double gated_budget = usable(in.gated_predicted_us);
  const double ungated_budget = in.ungated_predicted_us > 0 ? usable(in.ungated_predicted_us) : 0.0;
  const auto note = [&](pfSkipCause_t cause, std::string reason) {
    if (!out.skip_reason.empty()) return;
    out.skip_reason = std::move(reason);
    out.skip_cause = cause;
  };

  out.gated_budget_us = gated_budget - resources_.launch_overhead_us;
  const int fill_sms = resources_.partition.fill_sms;
  const size_t job_count = s.jobs.size();
  std::vector<JobSchedView> views(job_count);
  for (size_t i = 0; i < job_count; ++i) {
    const JobState& job = *s.jobs[i];
    JobSchedView& v = views[i];
    v.sequence = job.sequence;
    v.priority = job.priority;
    const uint64_t remaining = remaining_items(job);
    const JobConfigModel& c =
        job.planned_configs[static_cast<size_t>(std::max(0, job.setup_config))];
    v.remaining_work_us =
        static_cast<double>(remaining) * c.item_cost_us / workers_of(c, fill_sms);
    // Fair share in SM·µs: a 1-SM job given the whole bubble got 1/fill_sms of it.
    v.received_bubble_us = job.granted_sm_us;
    v.runnable = !is_terminal(job.status) && remaining > 0;
  }
  const std::vector<size_t> order = schedule_order(options_.policy, views);

  const size_t streams = resources_.fill_streams.size();
  // bit i: fill stream i holds a slice of this bubble
  uint64_t streams_taken = so_far != nullptr ? so_far->streams_taken : 0;
  int free_sms = fill_sms - (so_far != nullptr ? so_far->sms_taken : 0);
  size_t planned_bytes = 0;
  bool looked = false;
  Observed now;
  for (const size_t index : order) {
    const std::shared_ptr<JobState>& job = s.jobs[index];
    if (so_far != nullptr && std::find(so_far->jobs.begin(), so_far->jobs.end(), job.get()) !=
                                 so_far->jobs.end()) {
      continue;  // already holds (or was refused) a slice of this bubble
    }
    if (held_out_by_late_slices(*job, in.gated_predicted_us)) {  // executor.cpp, late slices
      note(pfSkipLate,
           fmt::format("job '{}' is held out of bubbles predicted at {:.1f} us or less: its slices "
                       "kept starting after their bubbles had ended",
                       job->name, job->late_hold_us));
      continue;
    }
    if (static_cast<size_t>(std::popcount(streams_taken)) >= streams) {
      note(pfSkipNoResources,
           fmt::format("job '{}': all {} fill streams hold a slice of this bubble", job->name,
                       streams));
      break;
    }
    if (free_sms <= 0) {
      note(pfSkipNoResources, fmt::format("job '{}': every fill SM is packed", job->name));
      break;
    }
    PlanRequest request;
    request.predicted_us = gated_budget;
    if (job->kind == pfJobOpaque) {
      // Nothing stops opaque work: only a measured prediction, and only the time left of it.
      if (!(ungated_budget > 0)) {
        note(pfSkipNoHistory,
             fmt::format("job '{}': opaque work waits for a measured history of the class",
                         job->name));
        continue;
      }
      if (observed != nullptr && !looked) {
        now = observe(s, *observed, /*elapsed=*/true);
        looked = true;
      }
      if (now.ended) {
        note(pfSkipLate,
             fmt::format("job '{}': the bubble ended before its opaque slice could be launched",
                         job->name));
        continue;
      }
      request.predicted_us = std::min(gated_budget, ungated_budget) - now.elapsed_us;
    }
    // The k-th slice of the bubble is enqueued after k others: it starts that much later.
    request.launch_overhead_us =
        resources_.launch_overhead_us * static_cast<double>(out.slices.size() + 1);
    const size_t largest = s.arena.largest_free_block();
    request.free_bytes = largest > planned_bytes ? largest - planned_bytes : 0;
    request.fill_sms = free_sms;
    request.remaining_items = remaining_items(*job);
    request.gated = is_gated(job->kind);
    request.resident_limit = job->resident_reserved;
    request.pack_sms = true;
    SlicePlan slice = plan_slice(request, job->planned_configs);
    // Its estimated item is longer than a positive budget: the job's too-short streak counts this
    // bubble (at harvest), and when a probe is due it gets one item anyway, so that a wrong
    // estimate is measured instead of trusted forever (cost_model.hpp). One probe at a time: the
    // job's previous slice must have been harvested (its measurement is in).
    if (!slice.fill && slice.cause == pfSkipTooShort &&
        request.predicted_us - request.launch_overhead_us > 0) {
      if (job->slot >= 0) out.too_short_slots.set(static_cast<size_t>(job->slot));
      if (job->cost.probe_due() && job->slices_in_flight == 0) {
        SlicePlan probe = plan_probe(request, job->planned_configs, current_config(*job));
        if (probe.fill) slice = std::move(probe);
      }
    }
    if (!slice.fill) {
      note(slice.cause, fmt::format("job '{}': {}", job->name, slice.reason));
      continue;
    }
    // The job's last stream when free (no cross-stream wait for its previous slice), else the
    // first free one.
    int stream = -1;
    if (job->last_stream >= 0 && static_cast<size_t>(job->last_stream) < streams &&
        (streams_taken & (uint64_t{1} << job->last_stream)) == 0) {
      stream = job->last_stream;
    } else {
      stream = std::countr_one(streams_taken);
    }
    streams_taken |= uint64_t{1} << stream;
    free_sms -= slice.sms;
    planned_bytes += slice.workspace_bytes;
    const double opaque_budget =
        job->kind == pfJobOpaque ? std::min(gated_budget, ungated_budget) : 0.0;
    out.slices.push_back(PackedSlice{job, std::move(slice), stream, opaque_budget});
  }
  if (order.empty() && so_far == nullptr)  // the skip's log line names its cause, not nothing
    note(pfSkipNoJob, job_count == 0 ? "no fill job exists"
                                     : fmt::format("none of the {} fill jobs is runnable (each "
                                                   "finished, failed, or has no items left)",
                                                   job_count));
  return out;
}

void SliceLauncher::fill_packed(RuntimeState& s, BubbleRecord& bubble, const FillRequest& request,
                                const BubblePlan& first, bool observed, SliceTails* tails) {
  Packed done;
  BubblePlan next;
  const BubblePlan* current = &first;
  // A slice that could not be launched (its callback failed, its workspace no longer fits, a
  // device call failed) leaves its SMs and stream free: the jobs not yet packed get them. Each
  // round excludes the jobs it tried, so this ends.
  bubble.gated_budget_us = first.gated_budget_us;
  for (size_t round = 0; round <= s.jobs.size(); ++round) {
    bubble.too_short_slots |= current->too_short_slots;
    if (!enqueue(s, bubble, *current, tails, &done)) return;
    next = plan(s, request, observed ? &bubble : nullptr, &done);
    if (next.slices.empty()) return;
    current = &next;
  }
}

bool SliceLauncher::enqueue(RuntimeState& s, BubbleRecord& bubble, const BubblePlan& packed,
                            SliceTails* tails, Packed* done) {
  bool launched_any = false;
  bool left_unused = false;
  for (const PackedSlice& p : packed.slices) {
    JobState& job = *p.job;
    done->jobs.push_back(&job);
    // Taken by the launch below; given back (left_unused) when the slice does not go out.
    const auto unused = [&] { left_unused = true; };
    if (job.detached || is_terminal(job.status)) {
      unused();
      continue;
    }
    const uint64_t remaining = remaining_items(job);
    if (remaining == 0) {  // never an empty slice inside a bubble
      unused();
      continue;
    }
    SlicePlan plan = p.plan;
    if (plan.probe && job.slices_in_flight > 0) {
      // A prepared plan's probe used again before the first one was harvested: one is enough.
      unused();
      continue;
    }
    if (plan.items > remaining) {
      // A prepared plan older than the job's last slice: fewer items, on fewer workers.
      const JobConfigModel& c = job.planned_configs[static_cast<size_t>(plan.config_index)];
      plan.items = remaining;
      plan.workers = static_cast<int>(std::min<uint64_t>(plan.workers, plan.items));
      plan.sms = plan.workers * std::max(1, c.sms_per_worker);
      const uint64_t rounds =
          (plan.items + static_cast<uint64_t>(plan.workers) - 1) / static_cast<uint64_t>(plan.workers);
      plan.expected_us = static_cast<double>(rounds) * c.item_cost_us;
      plan.workspace_bytes = c.workspace_bytes_per_item * static_cast<size_t>(plan.workers);
    }
    if (job.kind == pfJobOpaque && tails == nullptr) {
      // Executor mode: the slices launched before this one may have taken long (a slow launch
      // callback, a late executor). Opaque work gets only the time left now, none once the
      // bubble ended.
      const Observed now = observe(s, bubble, /*elapsed=*/true);
      const JobConfigModel& c = job.planned_configs[static_cast<size_t>(plan.config_index)];
      const double left = p.opaque_budget_us - now.elapsed_us - resources_.launch_overhead_us;
      // A probe's item is estimated not to fit at all (that is why it is a probe): it only needs
      // the bubble still open, with time left.
      const double rounds_left =
          now.ended ? 0.0
          : plan.probe ? (left > 0 ? 1.0 : 0.0)
                       : std::floor(left / c.item_cost_us + 1e-9);
      if (rounds_left < 1) {
        if (bubble.skip_reason.empty()) {
          bubble.skip_reason = fmt::format(
              "job '{}': the bubble {} before its opaque slice could be launched", job.name,
              now.ended ? "ended" : "had too little time left");
          bubble.skip_cause = pfSkipLate;
        }
        unused();
        continue;
      }
      const uint64_t workers = static_cast<uint64_t>(plan.workers);
      const uint64_t rounds = (plan.items + workers - 1) / workers;
      if (!plan.probe && static_cast<double>(rounds) > rounds_left) {
        plan.items = std::min<uint64_t>(plan.items, static_cast<uint64_t>(rounds_left) * workers);
        plan.expected_us = rounds_left * c.item_cost_us;
      }
    }
    if (s.free_slice_slots.empty()) {
      bubble.skip_reason = "slice event pool exhausted";
      bubble.skip_cause = pfSkipNoResources;
      break;
    }
    uintptr_t workspace_block = 0;
    if (plan.workspace_bytes > 0 && !s.arena.allocate(plan.workspace_bytes, 0, &workspace_block)) {
      if (bubble.skip_reason.empty()) {
        bubble.skip_reason = fmt::format("job '{}': {} workspace bytes do not fit the arena now",
                                         job.name, plan.workspace_bytes);
        bubble.skip_cause = pfSkipNoMemory;
      }
      unused();
      continue;
    }
    if (launch(s, bubble, p.job, plan, p.stream, workspace_block, tails) != Launched::No) {
      launched_any = true;
      done->sms_taken += plan.sms;
      done->streams_taken |= uint64_t{1} << p.stream;
    } else {
      if (bubble.skip_reason.empty()) {
        bubble.skip_reason = fmt::format("job '{}': its slice could not be launched", job.name);
        bubble.skip_cause = pfSkipLaunchFailed;
      }
      unused();
    }
  }
  if (launched_any) s.plans_dirty = true;  // items in flight changed: prepared plans are stale
  return left_unused;
}

int SliceLauncher::launch_slice_work(const JobState& job, const pfSliceDesc_t& slice,
                                     Stream stream, std::string* why) {
  clear_last_error();
  // Held as an int: a callback may return a value outside the enum (reading such a value
  // through the enum type is undefined behaviour).
  int result = pfErrorInternal;
  try {
    if (job.kind == pfJobGraph) {
      // The graph kind has no launch callback: the runtime enqueues the gated graph itself.
      result = static_cast<int>(launch_graph_slice(device_, job, slice, stream));
    } else {
      CallbackScope scope("launch", const_cast<JobState*>(&job));  // its pfJobCancel
      // The callback launches kernels on the device: its context current for the call only (the
      // caller's thread in inline mode keeps its own context afterwards).
      LaunchContextScope device_context(device_);
      result = static_cast<int>(job.launch(job.user, &slice, stream));
    }
    if (result != pfSuccess) *why = last_error_message();
  } catch (const std::exception& e) {
    result = pfErrorJobFailed;
    *why = fmt::format("launch threw: {}", e.what());
  } catch (...) {
    result = pfErrorJobFailed;
    *why = "launch threw an unknown exception";
  }
  return result;
}

namespace {

// A queued pfRuntimeSetSliceObserver call, run by the fill stream's thread.
void run_observer_call(void* user) {
  const SliceObserverCall& call = *static_cast<const SliceObserverCall*>(user);
  call.observer.fn(call.observer.user, &call.event);
}

// Fills the slot's start and end calls for a slice about to be launched; returns them, or
// {nullptr, nullptr} when no observer is set.
std::pair<SliceObserverCall*, SliceObserverCall*> prepare_observer_calls(
    RuntimeState& s, size_t slot, const std::shared_ptr<JobState>& job, uint64_t bubble_id,
    int stream, uint64_t first_item, uint64_t max_items) REQUIRES(s.mu) {
  if (s.slice_observer.fn == nullptr) return {nullptr, nullptr};
  SliceObserverCall* calls = &s.observer_calls[2 * slot];
  for (int phase : {pfSliceStart, pfSliceEnd}) {
    SliceObserverCall& call = calls[phase];
    call.observer = s.slice_observer;
    call.job = job;
    call.event = pfSliceEvent_t{};
    call.event.size = sizeof(pfSliceEvent_t);
    call.event.phase = phase;
    call.event.fill_stream = stream;
    call.event.bubble_id = bubble_id;
    call.event.first_item = first_item;
    call.event.max_items = max_items;
    call.event.job_name = job->name.c_str();
  }
  return {&calls[pfSliceStart], &calls[pfSliceEnd]};
}

}  // namespace

SliceLauncher::Launched SliceLauncher::launch(RuntimeState& s, BubbleRecord& bubble,
                                              const std::shared_ptr<JobState>& job_ptr,
                                              const SlicePlan& plan, int stream,
                                              uintptr_t workspace_block, SliceTails* tails) {
  JobState& job = *job_ptr;
  const size_t slot = s.free_slice_slots.back();
  const Stream fill = resources_.fill_streams[static_cast<size_t>(stream)];
  // Before the callback nothing of the job is queued: a failing device call drops the slice (an
  // asynchronous error of the runtime) and returns its workspace.
  auto not_queued = [&](pfResult_t code, const char* what) {
    s.mu.assert_held();
    record_async_error(s, code,
                       fmt::format("fill slice of job '{}' in bubble {}: {} failed: {}", job.name,
                                   bubble.id, what, last_error_message()));
    if (workspace_block != 0) s.arena.release(workspace_block);
    return Launched::No;
  };
  pfResult_t r = pfSuccess;
  // One slice of a job at a time: its claims and read-back must not interleave with those of its
  // previous slice, still unharvested on another fill stream.
  if (job.slices_in_flight > 0 && job.last_stream != stream && job.last_slice_slot != SIZE_MAX) {
    r = device_.stream_wait_event(fill, resources_.slice_end_events[job.last_slice_slot]);
    if (r != pfSuccess) return not_queued(r, "waiting for the job's previous slice");
  }
  r = device_.write_word(fill, job.budget_counter, 0);
  if (r != pfSuccess) return not_queued(r, "zeroing the budget counter");
  r = device_.stream_wait_event(fill, resources_.begin_event(bubble.id));
  if (r != pfSuccess) return not_queued(r, "waiting for the begin event");
  const uint64_t first_item_hint =
      job.kind == pfJobOpaque ? job.next_opaque_item : job.items_completed + job.items_in_flight;
  r = device_.record_event(resources_.slice_start_events[slot], fill);
  if (r != pfSuccess) return not_queued(r, "recording the slice start");
  // The slice observer's start call runs once the bubble began, before the slice's work. Queued
  // last before the callback: no failure after it can leave it queued with its slot still free.
  const auto [start_call, end_call] = prepare_observer_calls(s, slot, job_ptr, bubble.id, stream,
                                                             first_item_hint, plan.items);
  if (start_call != nullptr) {
    r = device_.host_func(fill, &run_observer_call, start_call);
    if (r != pfSuccess) return not_queued(r, "queuing the slice observer's start call");
  }

  pfSliceDesc_t slice{};
  slice.job = job.handle;
  slice.config_index = plan.config_index;
  slice.bubble_id = bubble.id;
  slice.first_item_hint = first_item_hint;
  slice.max_items = plan.items;
  slice.total_items = job.item_count;
  slice.max_blocks = plan.workers;
  slice.time_budget_us = plan.expected_us;
  slice.gate = resources_.gate();
  slice.cursor = job.cursor;
  slice.budget_counter = job.budget_counter;
  slice.workspace = reinterpret_cast<void*>(workspace_block);
  slice.workspace_bytes = workspace_block != 0 ? plan.workspace_bytes : 0;

  std::string why;
  const int launched = launch_slice_work(job, slice, fill, &why);
  const bool failed = launched != pfSuccess;
  if (failed) {
    const bool known = launched > pfSuccess && launched < pfResultCount;
    const pfResult_t code = known ? static_cast<pfResult_t>(launched) : pfErrorJobFailed;
    const std::string message =
        fmt::format("job '{}': {} returned {} in bubble {}{}{}", job.name,
                    job.kind == pfJobGraph ? "the graph launch" : "launch callback",
                    result_text(launched), bubble.id, why.empty() ? "" : ": ", why);
    log::warn("{}", message);
    end_job(s, job, pfJobFailed, code, message);
    record_async_error(s, pfErrorJobFailed, message);
  }

  // From here the callback may have queued work that uses the slot's words, the workspace and
  // the job's resident share: they stay taken until the slice's end is known, even when the
  // callback failed (its job then gets no further slices and is torn down after this one).
  s.free_slice_slots.pop_back();
  SliceRecord record;
  record.job = job_ptr;
  record.event_slot = slot;
  record.planned_items = failed ? 0 : plan.items;
  record.first_item = slice.first_item_hint;
  record.config_index = plan.config_index;
  record.granted_us = plan.expected_us;
  record.workspace = workspace_block;
  record.sequence = s.next_slice_sequence++;
  record.stream = stream;
  record.sms = plan.sms;
  record.workers = plan.workers;
  record.probe = plan.probe;
  record.launch_failed = failed;
  record.enqueued_after_end = !failed && observe(s, bubble, /*elapsed=*/false).ended;
  ++job.slices_in_flight;
  job.items_in_flight += record.planned_items;
  job.last_stream = stream;
  job.last_slice_slot = slot;
  // The callback cancelled its own job (pfJobCancel from launch): this slice runs out like any
  // slice in flight at a cancel; the job gets no further slices.
  if (job.cancel_requested.exchange(false, std::memory_order_acq_rel)) {
    end_job(s, job, pfJobCancelled, pfSuccess, "");
  }
  if (!failed) {
    ++job.slices_launched;
    if (job.kind == pfJobOpaque) job.next_opaque_item += plan.items;
    job.bubble_time_us += plan.expected_us;
    job.granted_sm_us += plan.expected_us * plan.sms;
    job.last_config = plan.config_index;
    ++s.stats.slices_launched;
  }

  if (tails != nullptr) {
    // Inline mode: the tail comes from pfBubbleEnd, after the gate write (inline_fill.hpp).
    tails->items[tails->count++] = SliceTail{stream, job.cursor, slot, record.sequence, end_call};
    bubble.slices.push_back(std::move(record));
    return failed ? Launched::No : Launched::Yes;
  }
  r = enqueue_slice_end(fill, job.cursor, slot, end_call);
  if (r != pfSuccess) {
    record_async_error(s, r,
                       fmt::format("fill slice of job '{}' in bubble {}: its end cannot be "
                                   "tracked ({}); its resources stay taken until its fill stream "
                                   "has passed it",
                                   job.name, bubble.id, last_error_message()));
    s.quarantined.push_back(QuarantinedSlice{std::move(record), bubble.id});
    return failed ? Launched::No : Launched::Untracked;
  }
  bubble.slices.push_back(std::move(record));
  return failed ? Launched::No : Launched::Yes;
}

pfResult_t SliceLauncher::enqueue_slice_end(Stream fill, const uint64_t* cursor, size_t slot,
                                            void* observer_end_call) {
  pfResult_t r = device_.copy_word_to_host(fill, cursor, &resources_.host_words[slot]);
  // The observer's end call precedes the end event: the slot is reused only after it returned.
  if (r == pfSuccess && observer_end_call != nullptr) {
    r = device_.host_func(fill, &run_observer_call, observer_end_call);
  }
  // The end event follows the read-back, so a completed end event means the host word is valid.
  if (r == pfSuccess) r = device_.record_event(resources_.slice_end_events[slot], fill);
  return r;
}

std::vector<FailedTail> SliceLauncher::enqueue_tails(const SliceTails& tails) {
  std::vector<FailedTail> failed;
  for (size_t i = 0; i < tails.count; ++i) {
    const SliceTail& t = tails.items[i];
    const Stream fill = resources_.fill_streams[static_cast<size_t>(t.stream)];
    const pfResult_t r = enqueue_slice_end(fill, t.cursor, t.slot, t.observer_end_call);
    if (r != pfSuccess) failed.push_back(FailedTail{t.slot, last_error_message()});
  }
  return failed;
}

pfResult_t SliceLauncher::warm_up(const JobState& job) {
  const JobConfigModel& c = job.configs[static_cast<size_t>(std::max(0, job.setup_config))];
  pfSliceDesc_t slice{};
  slice.job = job.handle;
  slice.config_index = job.setup_config;
  slice.bubble_id = 0;  // the gate (>= 0) reads closed: even a kernel ignoring max_items stops
  slice.first_item_hint = 0;
  slice.max_items = 0;
  slice.total_items = job.item_count;
  slice.max_blocks = workers_of(c, resources_.partition.fill_sms);
  slice.time_budget_us = 0.0;
  slice.gate = resources_.gate();
  slice.cursor = job.cursor;
  slice.budget_counter = job.budget_counter;
  const size_t streams = resources_.fill_streams.size();
  pfResult_t result = pfSuccess;
  for (size_t i = 0; i < streams && result == pfSuccess; ++i) {
    std::string why;
    const int launched = launch_slice_work(job, slice, resources_.fill_streams[i], &why);
    if (launched != pfSuccess) {
      result = fail(pfErrorJobFailed,
                    "pfJobCreate: job '{}': its warm-up launch (an empty slice, max_items = 0) on "
                    "fill stream {} of {} returned {}{}{}",
                    job.name, i, streams, result_text(launched), why.empty() ? "" : ": ", why);
    }
  }
  // Every stream, also after a failure: what the earlier launches queued must have run before
  // the caller releases the job's memory, an asynchronous failure of the warm-up shows here, and
  // the job's cursor reset (queued on fill stream 0 by pfJobCreate) has landed before any slice
  // of the job, on whichever fill stream, can claim an item. On a driven clock (the simulator)
  // only stream 0, for the reset: its launches are checked when enqueued and load nothing, and
  // synchronizing a stream runs the caller's simulated world forward (usually not at all: a
  // fill stream is idle between runs).
  const bool driven = device_.driven_clock() != nullptr;
  const std::string failure = result != pfSuccess ? last_error_message() : std::string();
  for (size_t i = 0; i < (driven ? std::min<size_t>(streams, 1) : streams); ++i) {
    const pfResult_t r = device_.synchronize_stream(resources_.fill_streams[i]);
    if (r != pfSuccess && result == pfSuccess) {
      return fail(r, "pfJobCreate: job '{}': synchronizing fill stream {} of {} after its warm-up "
                  "launch failed: {}",
                  job.name, i, streams, last_error_message());
    }
  }
  if (result != pfSuccess) return set_error(result, failure);
  return pfSuccess;
}

}  // namespace pipefill::core
