#include "core/job_registry.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "core/graph_job.hpp"
#include "core/handles.hpp"
#include "pipefill/item_protocol.hpp"

namespace pipefill::core {
namespace {

// The arena allocator handed to a job's setup: bump allocation inside the job's reserved share.
struct SetupAllocatorContext {
  JobState* job;
};

pfResult_t setup_allocate(void* context, size_t bytes, size_t alignment, void** device_ptr) {
  auto* ctx = static_cast<SetupAllocatorContext*>(context);
  if (ctx == nullptr || device_ptr == nullptr) {
    return fail(pfErrorInvalidArgument, "arena allocate: context or device_ptr is NULL");
  }
  if (alignment == 0) alignment = ArenaAllocator::kDefaultAlignment;
  if ((alignment & (alignment - 1)) != 0) {
    return fail(pfErrorInvalidArgument, "arena allocate: alignment {} is not a power of two",
                alignment);
  }
  JobState& job = *ctx->job;
  auto exceeds = [&] {
    return fail(pfErrorOutOfMemory,
                "job '{}': allocating {} bytes aligned to {} exceeds its resident share ({} of {} "
                "bytes used)",
                job.name, bytes, alignment, job.resident_used, job.resident_reserved);
  };
  // Offsets within the share, compared by subtraction so no sum can wrap around.
  if (job.resident_block == 0 || alignment > job.resident_reserved) return exceeds();
  const uintptr_t start = job.resident_block + job.resident_used;
  const uintptr_t padding = (alignment - start % alignment) % alignment;
  const size_t left = job.resident_reserved - job.resident_used;
  if (padding > left || bytes > left - padding) return exceeds();
  job.resident_used += padding + bytes;
  *device_ptr = reinterpret_cast<void*>(start + padding);
  return pfSuccess;
}

// The job's configurations from its description; the message names the bad field.
pfResult_t configs_from_desc(const pfJobDesc_t& desc, const std::string& name,
                             std::vector<JobConfigModel>* out) {
  if (desc.config_count == 0) {
    if (!(desc.item_cost_hint_us > 0)) {
      return fail(pfErrorInvalidArgument,
                  "pfJobCreate: job '{}': desc->item_cost_hint_us = {} must be > 0 when no "
                  "configs are given",
                  name, desc.item_cost_hint_us);
    }
    JobConfigModel c;
    c.item_cost_us = desc.item_cost_hint_us;
    c.resident_bytes = desc.resident_bytes;
    c.workspace_bytes_per_item = desc.workspace_bytes_per_item;
    out->push_back(c);
    return pfSuccess;
  }
  for (int i = 0; i < desc.config_count; ++i) {
    const pfJobConfig_t& in = desc.configs[i];
    JobConfigModel c;
    // 0 takes the description's hint; anything else must be a real cost.
    if (in.item_cost_us != 0.0 && !(in.item_cost_us > 0 && std::isfinite(in.item_cost_us))) {
      return fail(pfErrorInvalidArgument,
                  "pfJobCreate: job '{}': configs[{}].item_cost_us = {} must be > 0 and finite (or "
                  "0 to use item_cost_hint_us)",
                  name, i, in.item_cost_us);
    }
    c.item_cost_us = in.item_cost_us > 0 ? in.item_cost_us : desc.item_cost_hint_us;
    if (!(c.item_cost_us > 0) || !std::isfinite(c.item_cost_us)) {
      return fail(pfErrorInvalidArgument,
                  "pfJobCreate: job '{}': configs[{}].item_cost_us = {} and "
                  "item_cost_hint_us = {}: one must be > 0",
                  name, i, in.item_cost_us, desc.item_cost_hint_us);
    }
    if (in.parallelism < 0) {
      return fail(pfErrorInvalidArgument,
                  "pfJobCreate: job '{}': configs[{}].parallelism = {} is negative", name, i,
                  in.parallelism);
    }
    if (in.items_per_item < 0 || !std::isfinite(in.items_per_item)) {
      return fail(pfErrorInvalidArgument,
                  "pfJobCreate: job '{}': configs[{}].items_per_item = {} is negative", name, i,
                  in.items_per_item);
    }
    c.parallelism = in.parallelism;
    c.resident_bytes = in.resident_bytes > 0 ? in.resident_bytes : desc.resident_bytes;
    c.workspace_bytes_per_item =
        in.workspace_bytes_per_item > 0 ? in.workspace_bytes_per_item
                                        : desc.workspace_bytes_per_item;
    c.work_per_item = in.items_per_item > 0 ? in.items_per_item : 1.0;
    out->push_back(c);
  }
  return pfSuccess;
}

void run_teardown(JobState& job) {
  if (job.teardown != nullptr) {
    try {
      CallbackScope scope("teardown", &job);  // its pfJobCancel is a no-op, not refused
      job.teardown(job.user);
    } catch (...) {
      log::warn("job '{}': teardown threw; ignored", job.name);
    }
  }
  // A graph job's prepared graph goes with its teardown: no slice of it is in flight any more,
  // and nothing launches a slice of an ended job.
  job.graph_items.reset();
}

}  // namespace

uint64_t remaining_items(const JobState& job) {
  const uint64_t done_or_planned =
      !is_gated(job.kind) ? job.next_opaque_item : job.items_completed + job.items_in_flight;
  // The streaming bound, by the protocol's rule (the budget keeps the cursor below it).
  return protocol::claimable_items(job.item_count, job.available, done_or_planned);
}

void end_job(RuntimeState& s, JobState& job, pfJobStatus_t status, pfResult_t error,
             std::string message) {
  if (is_terminal(job.status)) return;
  job.status = status;
  job.error = error;
  job.error_message = std::move(message);
  if (status == pfJobCompleted) ++s.stats.jobs_completed;
  if (status == pfJobFailed) ++s.stats.jobs_failed;
  log::debug("job '{}' ended: status {}, {} of {} items", job.name, static_cast<int>(status),
             job.items_completed, job.item_count);
  maybe_teardown(s, job);
  s.job_changed.notify_all();
}

void maybe_teardown(RuntimeState& s, JobState& job) {
  if (job.torn_down || !is_terminal(job.status) || job.slices_in_flight > 0) return;
  job.torn_down = true;
  // Not here: this may be the executor thread, inside the simulated world's run or while the
  // user thread is inside a bubble, with the state lock held. run_pending_teardowns runs it.
  for (const auto& attached : s.jobs) {
    if (attached.get() == &job) {
      s.teardowns.push_back(attached);
      s.teardowns_pending.store(true, std::memory_order_release);
      return;
    }
  }
}

void JobRegistry::run_pending_teardowns(RuntimeState& s) {
  if (!s.teardowns_pending.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<JobState>> due;
  {
    MutexLock lock(s.mu);
    due.swap(s.teardowns);
    s.teardowns_pending.store(false, std::memory_order_release);
  }
  for (const auto& job : due) run_teardown(*job);
}

std::string JobRegistry::attached_names(const RuntimeState& s) {
  std::string names;
  for (const auto& job : s.jobs) {
    if (!names.empty()) names += ", ";
    names += "'" + job->name + "'";
  }
  return names;
}

pfResult_t JobRegistry::create(RuntimeState& s, Runtime* owner, const pfJobDesc_t* desc,
                               JobState** out) {
  if (desc->launch == nullptr) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->launch is NULL (required)");
  }
  if (desc->item_count == 0) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->item_count = 0 (must be > 0)");
  }
  if (desc->kind == pfJobGraph) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreate: desc->kind = pfJobGraph: graph jobs are made by pfJobCreateGraph "
                "(a pfGraphJobDesc_t carries the graph and its index word)");
  }
  if (desc->kind != pfJobTicket && desc->kind != pfJobOpaque) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->kind = {} is not a pfJobKind_t",
                desc->kind);
  }
  if (desc->config_count < 0) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->config_count = {} is negative",
                desc->config_count);
  }
  if (desc->config_count > 0 && desc->configs == nullptr) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->config_count = {} but configs is NULL",
                desc->config_count);
  }
  if (!std::isfinite(desc->item_cost_hint_us)) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->item_cost_hint_us = {} is not finite",
                desc->item_cost_hint_us);
  }
  auto job = std::make_shared<JobState>();
  job->runtime = owner;
  job->name = desc->name != nullptr ? desc->name : "job";
  job->kind = static_cast<pfJobKind_t>(desc->kind);
  job->priority = desc->priority;
  job->item_count = desc->item_count;
  job->user = desc->user;
  job->setup = desc->setup;
  job->launch = desc->launch;
  job->teardown = desc->teardown;
  PF_TRY(configs_from_desc(*desc, job->name, &job->configs));

  PF_TRY(reserve(s, *job, "pfJobCreate"));
  auto release_reservation = [&] { release(s, *job); };
  PF_TRY(reset_cursor(s, *job));
  if (job->setup != nullptr) {
    SetupAllocatorContext context{job.get()};
    const pfArenaAllocator_t allocator{&context, &setup_allocate};
    clear_last_error();
    int setup_result = pfErrorInternal;  // an int: the callback may return a non-enum value
    std::string why;
    try {
      CallbackScope scope("setup");
      LaunchContextScope device_context(device_);  // setup allocates and loads kernels on the device
      setup_result = static_cast<int>(job->setup(job->user, &allocator, job->setup_config));
      if (setup_result != pfSuccess) why = last_error_message();
    } catch (const std::exception& e) {
      setup_result = pfErrorJobFailed;
      why = e.what();
    } catch (...) {
      setup_result = pfErrorJobFailed;
      why = "unknown exception";
    }
    if (setup_result != pfSuccess) {
      release_reservation();
      if (setup_result == pfErrorOutOfMemory) {
        return fail(pfErrorOutOfMemory, "pfJobCreate: job '{}': setup ran out of memory: {}",
                    job->name, why);
      }
      const bool known = setup_result > pfSuccess && setup_result < pfResultCount;
      return fail(pfErrorJobFailed, "pfJobCreate: job '{}': setup returned {}{}{}", job->name,
                  known ? std::string(result_name(static_cast<pfResult_t>(setup_result)))
                        : fmt::format("{} (not a pfResult_t)", setup_result),
                  why.empty() ? "" : ": ", why);
    }
  }
  PF_TRY(attach(s, job));
  *out = job.get();
  return pfSuccess;
}

pfResult_t JobRegistry::reserve(RuntimeState& s, JobState& job, const char* function) {
  MutexLock lock(s.mu);
  const auto free_slot = std::find(s.job_slot_used.begin(), s.job_slot_used.end(), false);
  if (free_slot == s.job_slot_used.end()) {
    return fail(pfErrorBusy, "{}: job '{}': {} jobs are attached (the maximum)", function,
                job.name, kMaxJobs);
  }
  const size_t largest = s.arena.largest_free_block();
  job.setup_config = choose_setup_config(job.configs, largest, resources_.partition.fill_sms);
  if (job.setup_config < 0) {
    size_t needed = SIZE_MAX;
    for (const JobConfigModel& c : job.configs) needed = std::min(needed, c.resident_bytes);
    return fail(pfErrorOutOfMemory,
                "{}: job '{}' needs {} resident bytes but the fill arena has {} free "
                "bytes (largest block {}) of {}",
                function, job.name, needed, s.arena.free_bytes(), largest, s.arena.capacity());
  }
  job.resident_reserved = job.configs[static_cast<size_t>(job.setup_config)].resident_bytes;
  if (job.resident_reserved > 0 &&
      !s.arena.allocate(job.resident_reserved, 0, &job.resident_block)) {
    return fail(pfErrorOutOfMemory,
                "{}: job '{}' needs {} resident bytes but the fill arena has {} free", function,
                job.name, job.resident_reserved, s.arena.free_bytes());
  }
  job.slot = static_cast<int>(free_slot - s.job_slot_used.begin());
  *free_slot = true;
  job.cursor = resources_.cursor_word(job.slot);
  job.budget_counter = resources_.budget_word(job.slot);
  job.sequence = s.next_job_sequence++;
  job.last_config = job.setup_config;
  return pfSuccess;
}

void JobRegistry::release(RuntimeState& s, JobState& job) {
  MutexLock lock(s.mu);
  if (job.resident_block != 0) s.arena.release(job.resident_block);
  job.resident_block = 0;
  s.job_slot_used[static_cast<size_t>(job.slot)] = false;
}

pfResult_t JobRegistry::reset_cursor(RuntimeState& s, JobState& job) {
  // A reused slot may hold an old cursor: reset it in fill-stream order, before any slice.
  // (On fill stream 0: the warm-up synchronizes that stream before the job is attached, so the
  // reset has landed before a slice of the job on any fill stream claims an item.)
  const pfResult_t reset = device_.write_word(resources_.fill_streams[0], job.cursor, 0);
  if (reset != pfSuccess) release(s, job);
  return reset;
}

pfResult_t JobRegistry::attach(RuntimeState& s, const std::shared_ptr<JobState>& job) {
  // The planner's copy of the configurations, whose costs the harvest replaces by measured ones;
  // made here, once the configurations are final (a graph job's SM charge is set above).
  job->planned_configs = job->configs;
  job->cost.init(is_gated(job->kind));
  // The handle exists before the executor can see the job (its slices carry it), and before
  // the warm-up (its empty slices carry it too).
  publish_job(job);
  if (warm_up_) {
    // Outside any bubble: kernels and library handles load now, not in the first bubble.
    const pfResult_t warmed = warm_up_(*job);
    if (warmed != pfSuccess) {
      const std::string message = last_error_message();
      unpublish_job(*job);
      run_teardown(*job);  // setup succeeded: the job frees what it made
      release(s, *job);
      job->graph_items.reset();
      log::warn("{}", message);
      return set_error(warmed, message);
    }
  }
  {
    MutexLock lock(s.mu);
    s.jobs.push_back(job);
  }
  static constexpr const char* kKindNames[] = {"ticket", "opaque", "graph"};
  log::info("job '{}' created: {} items, kind {}, config {} of {}, {} resident bytes", job->name,
            job->item_count, kKindNames[job->kind], job->setup_config, job->configs.size(),
            job->resident_reserved);
  return pfSuccess;
}

pfResult_t JobRegistry::create_graph(RuntimeState& s, Runtime* owner, const pfGraphJobDesc_t* desc,
                                     JobState** out) {
  auto job = std::make_shared<JobState>();
  job->runtime = owner;
  GraphJobSpec spec;
  PF_TRY(graph_job_from_desc(desc, job.get(), &spec));
  PF_TRY(reserve(s, *job, "pfJobCreateGraph"));
  PF_TRY(reset_cursor(s, *job));
  spec.gate = resources_.gate();
  spec.cursor = job->cursor;
  spec.budget_counter = job->budget_counter;
  spec.scratch_words = reinterpret_cast<uint64_t*>(job->resident_block);
  spec.fill_stream = resources_.fill_streams[0];
  // Once, here: on CUDA the gated graph is built and instantiated now, never inside a bubble.
  const pfResult_t prepared = device_.prepare_graph_items(spec, &job->graph_items);
  if (prepared != pfSuccess) {
    const std::string why = last_error_message();
    release(s, *job);
    job->graph_items.reset();
    return set_error(prepared, fmt::format("pfJobCreateGraph: job '{}': {}", job->name, why));
  }
  // One worker runs the graph's items one after another, holding the SMs its kernels use: that
  // is what the slice is charged in SM x us packing (the whole fill partition when unknown).
  const int fill_sms = resources_.partition.fill_sms;
  const int used = job->graph_items->sms_used();
  job->configs[0].sms_per_worker = used > 0 ? std::min(used, fill_sms) : fill_sms;
  log::info("graph job '{}': charged {} of {} fill SMs per slice ({})", job->name,
            job->configs[0].sms_per_worker, fill_sms,
            used > 0 ? "the SMs its graph uses" : "its SM use is unknown: the whole partition");
  PF_TRY(attach(s, job));
  *out = job.get();
  return pfSuccess;
}

pfResult_t JobRegistry::info(RuntimeState& s, JobState& job, pfJobInfo_t* out) {
  MutexLock lock(s.mu);
  out->status = job.status;
  out->items_completed = job.items_completed;
  out->item_count = job.item_count;
  out->slices_launched = job.slices_launched;
  out->bubble_time_us = job.bubble_time_us;
  out->busy_time_us = job.busy_time_us;
  out->config_index = job.last_config;
  out->error = job.error;
  return pfSuccess;
}

pfResult_t JobRegistry::cost_info(RuntimeState& s, JobState& job, pfJobCostInfo_t* out) {
  MutexLock lock(s.mu);
  const int config = current_config(job);
  const size_t index = static_cast<size_t>(config);
  *out = pfJobCostInfo_t{};
  out->size = sizeof(pfJobCostInfo_t);
  out->config_index = config;
  if (index < job.configs.size()) out->prior_cost_us = job.configs[index].item_cost_us;
  out->learned_cost_us = index < job.planned_configs.size()
                             ? job.planned_configs[index].item_cost_us
                             : out->prior_cost_us;
  out->samples = job.cost.samples(index);
  out->probes = job.cost.probes;
  out->too_short_streak = job.cost.too_short_streak;
  out->too_short_bubbles = job.cost.too_short_bubbles;
  out->warned = job.cost.warned ? 1 : 0;
  return pfSuccess;
}

pfResult_t JobRegistry::set_cost_policy(RuntimeState& s, JobState& job, int policy) {
  MutexLock lock(s.mu);
  job.cost.fixed = policy == 2;
  job.cost.fastest = policy != 0;
  const size_t n = std::min(job.configs.size(), job.planned_configs.size());
  for (size_t i = 0; i < n; ++i) {
    job.planned_configs[i].item_cost_us = job.cost.estimate(i, job.configs[i].item_cost_us);
  }
  return pfSuccess;
}

pfResult_t JobRegistry::cancel(RuntimeState& s, JobState& job) {
  MutexLock lock(s.mu);
  end_job(s, job, pfJobCancelled, pfSuccess, "");
  return pfSuccess;
}

pfResult_t JobRegistry::set_available(RuntimeState& s, JobState& job, uint64_t available) {
  MutexLock lock(s.mu);
  if (is_terminal(job.status) || job.detached) {
    return fail(pfErrorInvalidState, "pfJobSetAvailable: job '{}' has ended (status {})",
                job.name, static_cast<int>(job.status));
  }
  // Items claimed or granted to slices in flight cannot be taken back.
  const uint64_t granted = job.items_completed + job.items_in_flight;
  if (available < granted) {
    return fail(pfErrorInvalidArgument,
                "pfJobSetAvailable: job '{}': available = {} is below the {} items already "
                "claimed or granted to slices in flight",
                job.name, available, granted);
  }
  job.available = available;
  s.plans_dirty = true;
  return pfSuccess;
}

pfResult_t JobRegistry::end_input(RuntimeState& s, JobState& job) {
  MutexLock lock(s.mu);
  if (is_terminal(job.status) || job.detached) {
    return fail(pfErrorInvalidState, "pfJobEndInput: job '{}' has ended (status {})", job.name,
                static_cast<int>(job.status));
  }
  if (job.available >= job.item_count) return pfSuccess;  // no bound below the item count
  if (job.available == 0) {
    return fail(pfErrorInvalidArgument,
                "pfJobEndInput: job '{}' has no item available (available = 0): a job has at "
                "least one item; cancel it instead",
                job.name);
  }
  job.item_count = job.available;
  s.plans_dirty = true;
  if (job.items_completed >= job.item_count) {
    end_job(s, job, pfJobCompleted, pfSuccess, "");
  }
  return pfSuccess;
}

pfResult_t JobRegistry::wait(RuntimeState& s, JobState& job, double timeout_us,
                             const std::string& never_returns) {
  MutexLock lock(s.mu);
  auto finished = [&] {
    s.mu.assert_held();
    return is_terminal(job.status);
  };
  if (!never_returns.empty() && !finished()) {
    return fail(pfErrorInvalidState,
                "pfJobWait: job '{}' is not finished ({} of {} items done) and this wait would "
                "never return: {}",
                job.name, job.items_completed, job.item_count, never_returns);
  }
  if (is_forever(timeout_us)) {
    s.job_changed.wait(s.mu, finished);
  } else if (!s.job_changed.wait_for(
                 s.mu, std::chrono::microseconds(static_cast<int64_t>(std::ceil(timeout_us))),
                 finished)) {
    return fail(pfErrorTimeout,
                "pfJobWait: job '{}' did not finish within {} us ({} of {} items done){}",
                job.name, timeout_us, job.items_completed, job.item_count,
                device_.driven_clock() != nullptr
                    ? "; on the simulated backend the job only advances while the world runs "
                      "(pfSimRunUntilIdle)"
                    : "");
  }
  switch (job.status) {
    case pfJobCompleted: return pfSuccess;
    case pfJobFailed:
      return fail(pfErrorJobFailed, "job '{}' failed: {}", job.name, job.error_message);
    default: return fail(pfErrorCancelled, "job '{}' was cancelled", job.name);
  }
}

bool JobRegistry::begin_destroy(RuntimeState& s, JobState& job) {
  unpublish_job(job);  // no new call can reach the job; calls in flight finish normally
  MutexLock lock(s.mu);
  end_job(s, job, pfJobCancelled, pfSuccess, "");
  return job.slices_in_flight > 0;
}

void JobRegistry::finish_destroy(RuntimeState& s, JobState& job) {
  if (!job.torn_down) {  // a slice of it is still in flight (its end could not be tracked)
    job.torn_down = true;
    for (const auto& attached : s.jobs) {
      if (attached.get() == &job) s.teardowns.push_back(attached);
    }
    s.teardowns_pending.store(true, std::memory_order_release);
  }
  job.detached = true;
  if (job.resident_block != 0) s.arena.release(job.resident_block);
  job.resident_block = 0;
  s.job_slot_used[static_cast<size_t>(job.slot)] = false;
  // Records of its unharvested slices keep the object alive until they are harvested.
  std::erase_if(s.jobs, [&](const std::shared_ptr<JobState>& j) { return j.get() == &job; });
  s.job_changed.notify_all();
}

}  // namespace pipefill::core
