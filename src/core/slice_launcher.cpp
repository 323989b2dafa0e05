#include "core/slice_launcher.hpp"

#include <algorithm>

#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "core/graph_job.hpp"
#include "core/job_registry.hpp"
#include "core/scheduler.hpp"

namespace pipefill::core {

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

void SliceLauncher::fill(RuntimeState& s, BubbleRecord& bubble, const FillRequest& in) {
  const auto usable = [&](double predicted) {
    return predicted * (1.0 - options_.safety_margin_fraction) - options_.safety_margin_us;
  };
  // Every launched slice's expected time comes off both budgets.
  double gated_budget = usable(in.gated_predicted_us);
  double ungated_budget = in.ungated_predicted_us > 0 ? usable(in.ungated_predicted_us) : 0.0;
  if (observe(s, bubble, /*elapsed=*/false).ended) {
    bubble.skip_reason = "the bubble had ended before the executor handled it";
    return;
  }
  const size_t job_count = s.jobs.size();
  std::vector<bool> tried(job_count, false);
  std::vector<JobSchedView> views(job_count);
  const int fill_sms = resources_.partition.fill_sms;
  while (gated_budget > 0) {
    for (size_t i = 0; i < job_count; ++i) {
      const JobState& job = *s.jobs[i];
      JobSchedView& v = views[i];
      v.sequence = job.sequence;
      v.priority = job.priority;
      const uint64_t remaining = remaining_items(job);
      const JobConfigModel& c = job.configs[static_cast<size_t>(std::max(0, job.setup_config))];
      const int workers =
          std::max(1, c.parallelism > 0 ? std::min(c.parallelism, fill_sms) : fill_sms);
      v.remaining_work_us = static_cast<double>(remaining) * c.item_cost_us / workers;
      v.received_bubble_us = job.bubble_time_us;
      v.runnable = !tried[i] && !is_terminal(job.status) && remaining > 0;
    }
    const std::vector<size_t> order = schedule_order(options_.policy, views);
    bool launched = false;
    for (const size_t index : order) {
      tried[index] = true;
      const std::shared_ptr<JobState> job = s.jobs[index];
      PlanRequest request;
      request.predicted_us = gated_budget;
      if (job->kind == pfJobOpaque) {
        // Nothing stops opaque work: only a measured prediction, and only the time left of it.
        if (!(ungated_budget > 0)) {
          if (bubble.skip_reason.empty()) {
            bubble.skip_reason = fmt::format(
                "job '{}': opaque work waits for a measured history of class {}", job->name,
                bubble.class_key);
          }
          continue;
        }
        const Observed now = observe(s, bubble, /*elapsed=*/true);
        if (now.ended) {
          if (bubble.skip_reason.empty()) {
            bubble.skip_reason = fmt::format("job '{}': the bubble ended before its opaque slice "
                                             "could be launched",
                                             job->name);
          }
          continue;
        }
        request.predicted_us = std::min(gated_budget, ungated_budget) - now.elapsed_us;
      }
      request.launch_overhead_us = resources_.launch_overhead_us;
      request.free_bytes = s.arena.largest_free_block();
      request.fill_sms = fill_sms;
      request.remaining_items = remaining_items(*job);
      request.gated = is_gated(job->kind);
      request.resident_limit = job->resident_reserved;
      const SlicePlan plan = plan_slice(request, job->configs);
      if (!plan.fill) {
        if (bubble.skip_reason.empty()) {
          bubble.skip_reason = fmt::format("job '{}': {}", job->name, plan.reason);
        }
        continue;
      }
      if (s.free_slice_slots.empty()) {
        bubble.skip_reason = "slice event pool exhausted";
        return;
      }
      uintptr_t workspace_block = 0;
      if (plan.workspace_bytes > 0 &&
          !s.arena.allocate(plan.workspace_bytes, 0, &workspace_block)) {
        continue;
      }
      const Launched result = launch(s, bubble, job, plan, workspace_block);
      if (result != Launched::No) {
        // Queued, tracked or not: its time is spent.
        gated_budget -= plan.expected_us + resources_.launch_overhead_us;
        ungated_budget -= plan.expected_us + resources_.launch_overhead_us;
        launched = true;
        break;
      }
    }
    if (!launched) break;
  }
}

SliceLauncher::Launched SliceLauncher::launch(RuntimeState& s, BubbleRecord& bubble,
                                              const std::shared_ptr<JobState>& job_ptr,
                                              const SlicePlan& plan, uintptr_t workspace_block) {
  JobState& job = *job_ptr;
  const size_t slot = s.free_slice_slots.back();
  const Stream fill = resources_.fill_stream;
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
  pfResult_t r = device_.write_word(fill, job.budget_counter, 0);
  if (r != pfSuccess) return not_queued(r, "zeroing the budget counter");
  r = device_.stream_wait_event(fill, resources_.begin_event(bubble.id));
  if (r != pfSuccess) return not_queued(r, "waiting for the begin event");
  r = device_.record_event(resources_.slice_start_events[slot], fill);
  if (r != pfSuccess) return not_queued(r, "recording the slice start");

  pfSliceDesc_t slice{};
  slice.job = job.handle;
  slice.config_index = plan.config_index;
  slice.bubble_id = bubble.id;
  slice.first_item_hint =
      job.kind == pfJobOpaque ? job.next_opaque_item : job.items_completed + job.items_in_flight;
  slice.max_items = plan.items;
  slice.total_items = job.item_count;
  slice.max_blocks = plan.workers;
  slice.time_budget_us = plan.expected_us;
  slice.gate = resources_.gate();
  slice.cursor = job.cursor;
  slice.budget_counter = job.budget_counter;
  slice.workspace = reinterpret_cast<void*>(workspace_block);
  slice.workspace_bytes = workspace_block != 0 ? plan.workspace_bytes : 0;

  clear_last_error();
  // Held as an int: a callback may return a value outside the enum (reading such a value
  // through the enum type is undefined behaviour).
  int launched = pfErrorInternal;
  std::string why;
  try {
    if (job.kind == pfJobGraph) {
      // The graph kind has no launch callback: the runtime enqueues the gated graph itself.
      launched = static_cast<int>(launch_graph_slice(device_, job, slice, fill));
    } else {
      CallbackScope scope("launch");
      launched = static_cast<int>(job.launch(job.user, &slice, fill));
    }
    if (launched != pfSuccess) why = last_error_message();
  } catch (const std::exception& e) {
    launched = pfErrorJobFailed;
    why = fmt::format("launch threw: {}", e.what());
  } catch (...) {
    launched = pfErrorJobFailed;
    why = "launch threw an unknown exception";
  }
  const bool failed = launched != pfSuccess;
  if (failed) {
    const bool known = launched > pfSuccess && launched < pfResultCount;
    const pfResult_t code = known ? static_cast<pfResult_t>(launched) : pfErrorJobFailed;
    const std::string code_text = known ? std::string(result_name(code))
                                        : fmt::format("{} (not a pfResult_t)", launched);
    const std::string message =
        fmt::format("job '{}': {} returned {} in bubble {}{}{}", job.name,
                    job.kind == pfJobGraph ? "the graph launch" : "launch callback", code_text,
                    bubble.id, why.empty() ? "" : ": ", why);
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
  record.launch_failed = failed;
  record.enqueued_after_end = !failed && observe(s, bubble, /*elapsed=*/false).ended;
  ++job.slices_in_flight;
  job.items_in_flight += record.planned_items;
  if (!failed) {
    ++job.slices_launched;
    if (job.kind == pfJobOpaque) job.next_opaque_item += plan.items;
    job.bubble_time_us += plan.expected_us;
    job.last_config = plan.config_index;
    ++s.stats.slices_launched;
  }

  r = device_.copy_word_to_host(fill, job.cursor, &resources_.host_words[slot]);
  // The end event follows the read-back, so a completed end event means the host word is valid.
  if (r == pfSuccess) r = device_.record_event(resources_.slice_end_events[slot], fill);
  if (r != pfSuccess) {
    record_async_error(s, r,
                       fmt::format("fill slice of job '{}' in bubble {}: its end cannot be "
                                   "tracked ({}); its resources stay taken until the fill stream "
                                   "has passed it",
                                   job.name, bubble.id, last_error_message()));
    s.quarantined.push_back(QuarantinedSlice{std::move(record), bubble.id});
    return failed ? Launched::No : Launched::Untracked;
  }
  bubble.slices.push_back(std::move(record));
  return failed ? Launched::No : Launched::Yes;
}

}  // namespace pipefill::core
