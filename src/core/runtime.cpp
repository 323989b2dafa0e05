#include "core/runtime.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/env_check.hpp"

namespace pipefill::core {

pfResult_t Runtime::create(const pfConfig_t* config, std::unique_ptr<Runtime>* out) {
  RuntimeOptions options;
  PF_TRY(resolve_config(config, &options));
  return create(options, out);
}

pfResult_t Runtime::create(const RuntimeOptions& options, std::unique_ptr<Runtime>* out) {
  return create(options, nullptr, out);
}

pfResult_t Runtime::create(const RuntimeOptions& options, std::unique_ptr<Device> device,
                           std::unique_ptr<Runtime>* out) {
  log::set_level(options.log_level);
  std::unique_ptr<Runtime> runtime(new Runtime());
  const pfResult_t result = runtime->init(options, std::move(device));
  if (result != pfSuccess) {
    const std::string message = last_error_message();
    runtime->stop_and_release();
    return set_error(result, message);
  }
  *out = std::move(runtime);
  return pfSuccess;
}

pfResult_t Runtime::init(const RuntimeOptions& requested, std::unique_ptr<Device> device) {
  options_ = requested;
  warn_unknown_environment_once();
  const bool backend_was_auto = options_.backend == pfBackendAuto;
  // A simulated world given: auto means that world's simulator.
  if (backend_was_auto && options_.sim_world != nullptr) options_.backend = pfBackendSim;
  if (options_.backend == pfBackendAuto) {
    const int gpus = cuda_device_count();
    options_.backend = gpus > 0 ? pfBackendCuda : pfBackendSim;
    if (options_.backend == pfBackendCuda) {
      log::info("backend auto: cuda ({} CUDA device(s) found)", gpus);
    } else {
      // A fallback the user may not expect: the simulator's virtual time ignores real waits.
      log::warn("backend auto: no usable CUDA device (or built without CUDA), so the simulated "
                "device (virtual time: real waits take no simulated time); set backend "
                "sim|host (PIPEFILL_BACKEND) to choose explicitly");
    }
  }
  PF_TRY(check_backend_options(options_, backend_was_auto));
  if (device != nullptr) {
    device_ = std::move(device);
  } else {
    PF_TRY(make_device(options_, &device_));
  }
  // The device the backend chose (CUDA without config.device: the caller's current one), so that
  // pfRuntimeGetConfig reports it.
  if (const int ordinal = device_->ordinal(); ordinal >= 0) options_.device = ordinal;
  // Every device object the executor will ever use is made here, never inside a bubble.
  PF_TRY(create_fill_resources(*device_, &options_, &resources_));
  {
    MutexLock lock(state_.mu);
    state_.free_slice_slots.reserve(options_.slice_slots);
    for (size_t i = options_.slice_slots; i-- > 0;) state_.free_slice_slots.push_back(i);
    state_.job_slot_used.assign(kMaxJobs, false);
    state_.arena.reset(reinterpret_cast<uintptr_t>(resources_.arena_base),
                       resources_.arena_bytes);
    state_.predictor = BubblePredictor(options_.min_samples);
  }

  if (options_.launch_mode == pfLaunchAuto) {
    // One in-order hardware queue for every stream: a slice enqueued after the main stream's
    // wait would start only after the gate closed, so pfBubbleBegin enqueues it (inline).
    options_.launch_mode =
        device_->single_hardware_queue() ? pfLaunchInline : pfLaunchExecutor;
  }
  ring_ = std::make_unique<MessageRing>(kQueueCapacity);
  executor_ = std::make_unique<Executor>(options_, *device_, resources_, state_);
  jobs_ = std::make_unique<JobRegistry>(*device_, resources_);
  tracker_ = std::make_unique<BubbleTracker>(options_, *device_, resources_, *ring_,
                                             state_.harvested_upto, state_.ended_upto);
  DrivenClock* driven = device_->driven_clock();
  // On a device whose clock the caller drives (the simulator) the messages are handled in its
  // pre-run hook, on the thread that runs it, rather than by the executor thread: the simulator
  // breaks ties between operations at the same virtual time by enqueue order across all
  // streams, so fill work enqueued by another thread at an arbitrary moment would make runs
  // differ. Enqueued at this fixed point (after the main job's operations of this run, in hook
  // registration order), same-seed runs are byte-identical.
  const bool in_hook = driven != nullptr && options_.sim_messages_in_hook;
  pump_ = in_hook ? make_pre_run_hook_pump(*ring_, *executor_)
                  : make_executor_thread_pump(*ring_, *executor_);
  tracker_->set_pump(pump_.get());
  if (options_.launch_mode == pfLaunchInline) tracker_->set_inline_fill(executor_.get());
  jobs_->set_warm_up([this](const JobState& job) { return executor_->warm_up(job); });
  if (driven != nullptr) {
    sim_world_ = driven->world_handle();
    // Before the world runs, the fill work of every bubble already begun must be enqueued, or
    // the simulated run would not see it (and would not be deterministic).
    driven->add_pre_run_hook(this, [this] { wait_for_executor(); });
    hook_registered_ = true;
  }
  pump_->start();
  log::info("runtime created: backend {}, device {} ({}), stage {}/{}, {} fill SMs of {} ({}), "
            "arena {} bytes, {} fill stream(s), launch mode {}",
            backend_name(options_.backend), options_.device, device_->name(),
            options_.stage_id, options_.stage_count, resources_.partition.fill_sms,
            resources_.partition.total_sms, resources_.partition.mode, resources_.arena_bytes,
            resources_.fill_streams.size(), launch_mode_name(options_.launch_mode));
  return pfSuccess;
}

Runtime::~Runtime() {
  // shutdown() normally ran already; this is the path for a failed create or a forced cleanup.
  stop_and_release();
  magic_ = 0;
}

pfResult_t Runtime::check_can_shut_down() {
  {
    MutexLock lock(state_.mu);
    if (!state_.jobs.empty()) {
      return fail(pfErrorBusy, "the runtime still has {} attached job(s) ({}); destroy them first",
                  state_.jobs.size(), JobRegistry::attached_names(state_));
    }
  }
  // A bubble whose stream died meanwhile is abandoned rather than wedging the runtime.
  if (tracker_ && tracker_->in_bubble() && !tracker_->abandon_if_stream_died()) {
    return fail(pfErrorInvalidState,
                "bubble {} is still open (pfBubbleBegin without pfBubbleEnd); end it first",
                tracker_->open_bubble_id());
  }
  return pfSuccess;
}

pfResult_t Runtime::shutdown() {
  PF_TRY(check_can_shut_down());
  stop_and_release();
  return pfSuccess;
}

pfResult_t Runtime::iteration_end() {
  PF_TRY(tracker_->iteration_end());
  JobRegistry::run_pending_teardowns(state_);
  return pfSuccess;
}

void Runtime::run_teardowns_outside_bubbles() {
  if (!tracker_->in_bubble()) JobRegistry::run_pending_teardowns(state_);
}

void Runtime::stop_and_release() {
  if (!device_) return;
  if (hook_registered_) {
    if (DrivenClock* driven = device_->driven_clock()) driven->remove_pre_run_hook(this);
    hook_registered_ = false;
  }
  if (pump_) pump_->stop();
  release_fill_resources(*device_, &resources_);
  device_.reset();
}

void Runtime::wait_for_executor() { pump_->drain(); }

pfResult_t Runtime::synchronize() {
  PF_TRY(refuse_inside_bubble("pfRuntimeSynchronize"));
  wait_for_executor();
  PF_TRY(executor_->synchronize(state_));
  run_teardowns_outside_bubbles();
  return pfSuccess;
}

pfResult_t Runtime::get_stats(pfStats_t* stats) {
  MutexLock lock(state_.mu);
  *stats = state_.stats;
  stats->iterations = tracker_->iterations();
  stats->host_begin_end_ns = tracker_->host_ns_per_pair();
  return pfSuccess;
}

std::array<uint64_t, PF_SKIP_CAUSE_COUNT> Runtime::skip_counts() {
  MutexLock lock(state_.mu);
  return state_.skip_counts;
}

size_t Runtime::class_count() {
  MutexLock lock(state_.mu);
  return state_.classes.size();
}

bool Runtime::class_stats(size_t index, pfClassStats_t* out) {
  MutexLock lock(state_.mu);
  if (index >= state_.classes.size()) return false;
  const ClassCounters& c = state_.classes[index];
  *out = pfClassStats_t{};
  out->size = sizeof(pfClassStats_t);
  const size_t key_bytes = std::min(c.key.size(), sizeof(out->key) - 1);
  std::memcpy(out->key, c.key.data(), key_bytes);
  out->kind = c.kind;
  out->bubbles = c.bubbles;
  out->bubbles_filled = c.bubbles_filled;
  out->bubbles_timed = c.bubbles_timed;
  out->bubble_time_us = c.bubble_time_us;
  out->p10_us = state_.predictor.predict(c.key, 0.1).quantile_us;
  // The planner's view (executor.cpp, request_for): gated work to the gated quantile, opaque
  // work to the conservative one, both only once the class has min_samples samples.
  const BubblePrediction median = state_.predictor.predict(c.key, 0.5);
  out->p50_us = median.quantile_us;
  out->samples = median.count;
  if (median.ready && median.count > 0) {
    out->gated_predicted_us =
        state_.predictor.predict(c.key, options_.gated_prediction_quantile).quantile_us;
    out->ungated_predicted_us =
        state_.predictor.predict(c.key, options_.prediction_quantile).quantile_us;
  }
  out->late_backoffs = c.late_backoffs;
  out->filled_time_us = c.filled_time_us;
  out->items_completed = c.items_completed;
  static_assert(PF_SKIP_CAUSE_COUNT <= PF_CLASS_SKIP_CAPACITY);
  std::copy(c.skips.begin(), c.skips.end(), out->skips);
  return true;
}

pfResult_t Runtime::memory_info(pfMemoryInfo_t* out) {
  PF_TRY(refuse_inside_bubble("pfRuntimeGetMemoryInfo"));
  size_t device_free = 0, device_total = 0;
  PF_TRY(device_->memory_info(&device_free, &device_total));
  *out = pfMemoryInfo_t{};
  out->size = sizeof(pfMemoryInfo_t);
  out->device_free_bytes = device_free;
  out->device_total_bytes = device_total;
  MutexLock lock(state_.mu);
  out->arena_bytes = state_.arena.capacity();
  out->arena_used_bytes = state_.arena.used_bytes();
  out->arena_largest_free_bytes = state_.arena.largest_free_block();
  return pfSuccess;
}

pfResult_t Runtime::write_trace(const char* path) {
  std::string text;
  {
    MutexLock lock(state_.mu);
    executor_->collect_calibration(state_);
    text = render_chrome_trace(state_.trace, options_.stage_id);
  }
  return write_text_file(path, text);
}

void Runtime::set_class_margin(const std::string& class_key, double margin_us) {
  MutexLock lock(state_.mu);
  if (margin_us < 0) {
    state_.class_margins.erase(class_key);
  } else {
    state_.class_margins[class_key] = margin_us;
  }
  state_.plans_dirty = true;  // prepared plans carry the old margin
}

pfResult_t Runtime::set_slice_observer(pfSliceObserverFn fn, void* user) {
  // Other backends have no thread a slice runs on in real time that an observer could annotate:
  // CUDA's fill kernels reach profilers through CUPTI, the simulator's run in virtual time.
  if (device_->backend() != pfBackendHost) {
    return fail(pfErrorNotSupported,
                "pfRuntimeSetSliceObserver: the slice observer needs the host backend (the "
                "runtime's is the {}): CUDA fill kernels are in a profiler's GPU trace through "
                "CUPTI, simulated slices run in virtual time",
                device_->name());
  }
  MutexLock lock(state_.mu);
  // Made at the first observer, before any slice can use them (never resized afterwards).
  if (fn != nullptr && state_.observer_calls.empty()) {
    state_.observer_calls.resize(2 * options_.slice_slots);
  }
  state_.slice_observer = SliceObserver{fn, fn != nullptr ? user : nullptr};
  return pfSuccess;
}

pfResult_t Runtime::create_high_priority_stream(void** stream) {
  int lowest = 0, highest = 0;
  PF_TRY(device_->priority_range(&lowest, &highest));
  return device_->create_stream(highest, stream);
}

pfResult_t Runtime::destroy_stream(void* stream) {
  if (resources_.is_fill_stream(stream) || !device_->is_valid_main_stream(stream)) {
    return fail(pfErrorInvalidArgument,
                "pfStreamDestroy: stream {} is not a main-job stream of this runtime", stream);
  }
  return tracker_->destroy_stream_unless_open(
      stream, [&] { return device_->destroy_stream(stream); });
}

pfResult_t Runtime::create_job(const pfJobDesc_t* desc, JobState** out) {
  return jobs_->create(state_, this, desc, out);
}

pfResult_t Runtime::create_graph_job(const pfGraphJobDesc_t* desc, JobState** out) {
  return jobs_->create_graph(state_, this, desc, out);
}

pfResult_t Runtime::push_capture_context(void* stream) {
  return device_->push_capture_context(stream);
}

pfResult_t Runtime::pop_capture_context() {
  return device_->pop_capture_context();
}

pfResult_t Runtime::create_capture_stream(void** stream) {
  return device_->create_capture_stream(stream);
}

pfResult_t Runtime::job_info(JobState* job, pfJobInfo_t* info) {
  return jobs_->info(state_, *job, info);
}

pfResult_t Runtime::job_cost_info(JobState* job, pfJobCostInfo_t* info) {
  return jobs_->cost_info(state_, *job, info);
}

pfResult_t Runtime::set_job_cost_policy(JobState* job, int policy) {
  return jobs_->set_cost_policy(state_, *job, policy);
}

pfResult_t Runtime::cancel_job(JobState* job) { return jobs_->cancel(state_, *job); }

pfResult_t Runtime::set_job_available(JobState* job, uint64_t available) {
  return jobs_->set_available(state_, *job, available);
}

pfResult_t Runtime::end_job_input(JobState* job) {
  const pfResult_t result = jobs_->end_input(state_, *job);
  run_teardowns_outside_bubbles();  // a job it completed may have its teardown due
  return result;
}

std::string Runtime::why_a_wait_never_returns(double timeout_us) const {
  if (timeout_us != 0 && tracker_->bubble_open_on_calling_thread()) {
    return fmt::format("the calling thread has bubble {} open on stream {}, and no call may block "
                       "inside a bubble (call pfBubbleEnd first, or poll with timeout 0)",
                       tracker_->open_bubble_id(), tracker_->open_bubble_stream());
  }
  if (!JobRegistry::is_forever(timeout_us)) return {};
  if (const DrivenClock* driven = device_->driven_clock();
      driven != nullptr && driven->driven_by_calling_thread()) {
    return fmt::format("the calling thread is the one that runs simulated world {}, and virtual "
                       "time (hence the job) advances only inside its pfSimRunUntil* calls; run "
                       "the world, then wait with a finite timeout (0 polls)",
                       static_cast<const void*>(driven->world_handle()));
  }
  return {};
}

pfResult_t Runtime::refuse_inside_bubble(const char* function) const {
  if (!tracker_->bubble_open_on_calling_thread()) return pfSuccess;
  return fail(pfErrorInvalidState,
              "{}: the calling thread has bubble {} open on stream {}; this call blocks, and no "
              "call may block inside a bubble (call pfBubbleEnd first)",
              function, tracker_->open_bubble_id(), tracker_->open_bubble_stream());
}

pfResult_t Runtime::wait_job(JobState* job, double timeout_us) {
  const pfResult_t result =
      jobs_->wait(state_, *job, timeout_us, why_a_wait_never_returns(timeout_us));
  run_teardowns_outside_bubbles();
  return result;
}

pfResult_t Runtime::destroy_job(JobState* job) {
  PF_TRY(refuse_inside_bubble("pfJobDestroy"));
  std::shared_ptr<JobState> keep;
  {
    MutexLock lock(state_.mu);
    for (const auto& attached : state_.jobs) {
      if (attached.get() == job) keep = attached;
    }
  }
  if (jobs_->begin_destroy(state_, *job)) {
    // Its slices run on the fill streams: once they drained, nothing uses the job's memory.
    wait_for_executor();
    if (const pfResult_t r = executor_->drain_fill_streams(state_); r != pfSuccess) {
      if (keep) republish_job(keep);  // still attached: the handle stays valid
      return r;
    }
  }
  {
    MutexLock lock(state_.mu);
    executor_->harvest(state_);
    jobs_->finish_destroy(state_, *job);
  }
  // Its teardown (and any other that came due) on this thread, outside the lock.
  JobRegistry::run_pending_teardowns(state_);
  return pfSuccess;
}

}  // namespace pipefill::core
