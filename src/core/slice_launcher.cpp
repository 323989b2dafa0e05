#include "core/slice_launcher.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/job_registry.hpp"
#include "core/scheduler.hpp"

namespace pipefill::core {

void SliceLauncher::fill(RuntimeState& s, BubbleRecord& bubble, double predicted_us,
                         const BubbleMessage& m) {
  double usable =
      predicted_us * (1.0 - options_.safety_margin_fraction) - options_.safety_margin_us;
  size_t lent_left = m.lent_memory != nullptr ? m.lent_bytes : 0;
  const size_t job_count = s.jobs.size();
  std::vector<bool> tried(job_count, false);
  std::vector<JobSchedView> views(job_count);
  const int fill_sms = resources_.partition.fill_sms;
  while (usable > 0) {
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
      request.predicted_us = usable;
      request.launch_overhead_us = resources_.launch_overhead_us;
      request.free_bytes = std::max(s.arena.largest_free_block(), lent_left);
      request.fill_sms = fill_sms;
      request.remaining_items = remaining_items(*job);
      request.gated = job->kind == pfJobTicket;
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
      void* workspace = nullptr;
      uintptr_t workspace_block = 0;
      if (plan.workspace_bytes > 0) {
        if (lent_left >= plan.workspace_bytes) {
          workspace = m.lent_memory;  // the engine's memory, for this bubble only
          lent_left = 0;
        } else if (s.arena.allocate(plan.workspace_bytes, 0, &workspace_block)) {
          workspace = reinterpret_cast<void*>(workspace_block);
        } else {
          continue;
        }
      }
      if (launch(s, bubble, job, plan, workspace, workspace_block, plan.workspace_bytes)) {
        usable -= plan.expected_us + resources_.launch_overhead_us;
        launched = true;
        break;
      }
      if (workspace_block != 0) s.arena.release(workspace_block);
    }
    if (!launched) break;
  }
}

bool SliceLauncher::launch(RuntimeState& s, BubbleRecord& bubble,
                           const std::shared_ptr<JobState>& job_ptr, const SlicePlan& plan,
                           void* workspace, uintptr_t workspace_block, size_t workspace_bytes) {
  JobState& job = *job_ptr;
  const size_t slot = s.free_slice_slots.back();
  // A failing device call is an asynchronous error of the runtime (the slice is dropped).
  auto device_failed = [&](pfResult_t code, const char* what) {
    s.mu.assert_held();
    record_async_error(s, code,
                       fmt::format("fill slice of job '{}' in bubble {}: {} failed: {}", job.name,
                                   bubble.id, what, last_error_message()));
    return false;
  };
  const Stream fill = resources_.fill_stream;
  pfResult_t r = device_.write_word(fill, job.budget_counter, 0);
  if (r != pfSuccess) return device_failed(r, "zeroing the budget counter");
  r = device_.stream_wait_event(fill, resources_.begin_event(bubble.id));
  if (r != pfSuccess) return device_failed(r, "waiting for the begin event");
  r = device_.record_event(resources_.slice_start_events[slot], fill);
  if (r != pfSuccess) return device_failed(r, "recording the slice start");

  pfSliceDesc_t slice{};
  slice.job = reinterpret_cast<pfJob_t>(&job);
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
  slice.workspace = workspace;
  slice.workspace_bytes = workspace_bytes;

  clear_last_error();
  pfResult_t launched = pfErrorInternal;
  std::string why;
  try {
    launched = job.launch(job.user, &slice, fill);
    if (launched != pfSuccess) why = last_error_message();
  } catch (const std::exception& e) {
    launched = pfErrorJobFailed;
    why = fmt::format("launch threw: {}", e.what());
  } catch (...) {
    launched = pfErrorJobFailed;
    why = "launch threw an unknown exception";
  }
  if (launched != pfSuccess) {
    const std::string message =
        fmt::format("job '{}': launch callback returned {} in bubble {}{}{}", job.name,
                    result_name(launched), bubble.id, why.empty() ? "" : ": ", why);
    log::warn("{}", message);
    end_job(s, job, pfJobFailed, launched, message);
    record_async_error(s, pfErrorJobFailed, message);
    return false;
  }
  r = device_.copy_word_to_host(fill, job.cursor, &resources_.host_words[slot]);
  if (r != pfSuccess) return device_failed(r, "reading back the cursor");
  // The end event follows the read-back, so a completed end event means the host word is valid.
  r = device_.record_event(resources_.slice_end_events[slot], fill);
  if (r != pfSuccess) return device_failed(r, "recording the slice end");

  s.free_slice_slots.pop_back();
  SliceRecord record;
  record.job = job_ptr;
  record.event_slot = slot;
  record.planned_items = plan.items;
  record.first_item = slice.first_item_hint;
  record.config_index = plan.config_index;
  record.granted_us = plan.expected_us;
  record.workspace = workspace_block;
  bubble.slices.push_back(std::move(record));

  ++job.slices_launched;
  ++job.slices_in_flight;
  job.items_in_flight += plan.items;
  if (job.kind == pfJobOpaque) job.next_opaque_item += plan.items;
  job.bubble_time_us += plan.expected_us;
  job.last_config = plan.config_index;
  ++s.stats.slices_launched;
  return true;
}

}  // namespace pipefill::core
