#include "core/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/scheduler.hpp"

namespace pipefill::core {
namespace {

using Clock = std::chrono::steady_clock;

// How long the idle executor sleeps between completion polls, and how long it keeps spinning
// after activity before it sleeps (so back-to-back bubble instructions never pay a wake-up).
constexpr auto kIdlePoll = std::chrono::microseconds(200);
constexpr auto kSpinAfterWork = std::chrono::microseconds(50);

// Fixed host-side cost of starting one slice on the fill stream, used by the planner.
constexpr double kCudaLaunchOverheadUs = 5.0;
constexpr double kSimLaunchOverheadUs = 0.0;
// Default SMs kept for the main job's communication kernels on a GPU (NCCL CTAs).
constexpr size_t kSimDefaultArenaBytes = size_t{1} << 30;

bool is_terminal(pfJobStatus_t s) {
  return s == pfJobCompleted || s == pfJobFailed || s == pfJobCancelled;
}

const char* kind_name(int kind) {
  switch (kind) {
    case pfBubbleWarmup: return "warmup";
    case pfBubbleCooldown: return "cooldown";
    case pfBubbleDrain: return "drain";
    case pfBubbleOptimizer: return "optimizer";
    default: return "other";
  }
}

std::string json_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 2);
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

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
  const uintptr_t start = job.resident_block + job.resident_used;
  const uintptr_t aligned = (start + alignment - 1) & ~(static_cast<uintptr_t>(alignment) - 1);
  const size_t end_offset = (aligned - job.resident_block) + bytes;
  if (job.resident_block == 0 || end_offset > job.resident_reserved) {
    return fail(pfErrorOutOfMemory,
                "job '{}': allocating {} bytes exceeds its resident share ({} of {} bytes used)",
                job.name, bytes, job.resident_used, job.resident_reserved);
  }
  job.resident_used = end_offset;
  *device_ptr = reinterpret_cast<void*>(aligned);
  return pfSuccess;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation and shutdown
// ---------------------------------------------------------------------------------------------

pfResult_t Runtime::create(const pfConfig_t* config, std::unique_ptr<Runtime>* out) {
  RuntimeOptions options;
  PF_TRY(resolve_config(config, &options));
  return create(options, out);
}

pfResult_t Runtime::create(const RuntimeOptions& options, std::unique_ptr<Runtime>* out) {
  log::set_level(options.log_level);
  std::unique_ptr<Runtime> runtime(new Runtime());
  const pfResult_t result = runtime->init(options);
  if (result != pfSuccess) {
    const std::string message = last_error_message();
    runtime->release_resources();
    return set_error(result, message);
  }
  *out = std::move(runtime);
  return pfSuccess;
}

pfResult_t Runtime::init(const RuntimeOptions& requested) {
  options_ = requested;
  if (options_.backend == pfBackendAuto) {
    const int gpus = cuda_device_count();
    options_.backend = gpus > 0 ? pfBackendCuda : pfBackendSim;
    log::info("backend auto: {} ({} CUDA device(s) found)",
              options_.backend == pfBackendCuda ? "cuda" : "sim", gpus);
  }
  PF_TRY(make_device(options_, &device_));
  launch_overhead_us_ = options_.backend == pfBackendSim ? kSimLaunchOverheadUs
                                                         : kCudaLaunchOverheadUs;
  const int sms = device_->sm_count();
  // Unset on CUDA: the device derives R from the main job's NCCL settings (NCCL_MAX_CTAS /
  // NCCL_MAX_NCHANNELS) rounded to the partition granularity (docs/cuda-backend.md). Unset on
  // the simulator: nothing reserved unless asked.
  int reserved = options_.reserved_sms;
  if (reserved < 0 && options_.backend != pfBackendCuda) reserved = 0;
  if (reserved >= sms) {
    return fail(pfErrorInvalidArgument,
                "reserved_sms = {} leaves no SM for fill work (the device has {} SMs)", reserved,
                sms);
  }
  PF_TRY(device_->configure_partition(reserved, &partition_));
  options_.reserved_sms = partition_.reserved_sms;
  PF_TRY(device_->create_fill_stream(&fill_stream_));

  // Every device object the executor will ever use is made here, never inside a bubble.
  auto make_events = [&](std::vector<Event>* events, size_t count) -> pfResult_t {
    events->reserve(count);
    for (size_t i = 0; i < count; ++i) {
      Event e = nullptr;
      PF_TRY(device_->create_event(&e));
      events->push_back(e);
    }
    return pfSuccess;
  };
  PF_TRY(make_events(&bubble_begin_events_, kBubbleEventSlots));
  PF_TRY(make_events(&bubble_end_events_, kBubbleEventSlots));
  PF_TRY(make_events(&slice_start_events_, kSliceEventSlots));
  PF_TRY(make_events(&slice_end_events_, kSliceEventSlots));
  free_slice_slots_.reserve(kSliceEventSlots);
  for (size_t i = kSliceEventSlots; i-- > 0;) free_slice_slots_.push_back(i);
  PF_TRY(device_->allocate_words(1 + 2 * kMaxJobs, &words_));
  PF_TRY(device_->allocate_host_words(kSliceEventSlots, &host_words_));
  job_slot_used_.assign(kMaxJobs, false);

  size_t arena_bytes = options_.arena_bytes;
  if (arena_bytes == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    PF_TRY(device_->memory_info(&free_bytes, &total_bytes));
    if (options_.backend == pfBackendCuda) {
      // Leave the main job room to grow: 10% of the device or 1 GiB, whichever is larger.
      const size_t keep = std::max(total_bytes / 10, size_t{1} << 30);
      arena_bytes = free_bytes > keep ? free_bytes - keep : 0;
    } else {
      arena_bytes = std::min(kSimDefaultArenaBytes, free_bytes);
    }
  }
  if (arena_bytes > 0) PF_TRY(device_->allocate_arena(arena_bytes, &arena_base_));
  options_.arena_bytes = arena_bytes;
  arena_.reset(reinterpret_cast<uintptr_t>(arena_base_), arena_bytes);

  predictor_ = BubblePredictor(options_.min_samples);
  ring_.resize(kQueueCapacity);

  {
    DrivenClock* driven = device_->driven_clock();
    if (driven != nullptr) {
      sim_world_ = driven->world_handle();
      // Before the world runs, the executor must have enqueued the fill work of every bubble
      // already begun, or the simulated run would not see it (and would not be deterministic).
      //
      // The messages are handled right here, on the thread that runs the world, rather than by
      // the executor thread: the simulator breaks ties between operations at the same virtual
      // time by enqueue order across all streams, so fill work enqueued by another thread at
      // an arbitrary moment would make runs differ. Enqueued at this fixed point (after the
      // main job's operations of this run, in hook registration order), same-seed runs are
      // byte-identical.
      inline_processing_ = options_.sim_messages_in_hook;
      driven->add_pre_run_hook(this, [this] { wait_for_executor(); });
      hook_registered_ = true;
    }
  }

  executor_ = std::thread([this] { executor_main(); });
  log::info("runtime created: backend {}, device {} ({}), stage {}/{}, {} fill SMs of {} ({}), "
            "arena {} bytes",
            backend_name(options_.backend), options_.device, device_->name(),
            options_.stage_id, options_.stage_count, partition_.fill_sms, partition_.total_sms,
            partition_.mode, arena_bytes);
  return pfSuccess;
}

Runtime::~Runtime() {
  // shutdown() normally ran already; this is the path for a failed create or a forced cleanup.
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  processed_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  release_resources();
}

pfResult_t Runtime::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!jobs_.empty()) {
      std::string names;
      for (const auto& job : jobs_) {
        if (!names.empty()) names += ", ";
        names += "'" + job->name + "'";
      }
      return fail(pfErrorBusy, "the runtime still has {} attached job(s) ({}); destroy them first",
                  jobs_.size(), names);
    }
  }
  if (in_bubble_) {
    return fail(pfErrorInvalidState,
                "bubble {} is still open (pfBubbleBegin without pfBubbleEnd); end it first",
                next_bubble_id_ - 1);
  }
  if (hook_registered_) {
    if (DrivenClock* driven = device_->driven_clock()) driven->remove_pre_run_hook(this);
    hook_registered_ = false;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  processed_cv_.notify_all();
  release_resources();
  return pfSuccess;
}

void Runtime::release_resources() {
  if (!device_) return;
  if (hook_registered_) {
    if (DrivenClock* driven = device_->driven_clock()) driven->remove_pre_run_hook(this);
    hook_registered_ = false;
  }
  const std::string saved = last_error_message();
  auto check = [](pfResult_t r, const char* what) {
    if (r != pfSuccess) log::warn("runtime teardown: {} failed: {}", what, last_error_message());
  };
  // Fill work still queued may reference the words and the arena: drain it first.
  if (fill_stream_ != nullptr) check(device_->synchronize_stream(fill_stream_), "fill sync");
  for (auto* events : {&bubble_begin_events_, &bubble_end_events_, &slice_start_events_,
                       &slice_end_events_}) {
    for (Event e : *events) check(device_->destroy_event(e), "destroy_event");
    events->clear();
  }
  if (words_ != nullptr) check(device_->free_words(words_), "free_words");
  if (host_words_ != nullptr) check(device_->free_host_words(host_words_), "free_host_words");
  if (arena_base_ != nullptr) check(device_->free_arena(arena_base_), "free_arena");
  if (fill_stream_ != nullptr) check(device_->destroy_stream(fill_stream_), "destroy fill stream");
  words_ = nullptr;
  host_words_ = nullptr;
  arena_base_ = nullptr;
  fill_stream_ = nullptr;
  device_.reset();
  if (!saved.empty()) set_error(pfErrorInternal, saved);  // keep the caller's message
}

// ---------------------------------------------------------------------------------------------
// Bubble instructions (user thread)
// ---------------------------------------------------------------------------------------------

pfResult_t Runtime::bubble_begin(void* stream, const pfBubbleHint_t* hint) {
  // The clock read costs as much as the rest of the call on some machines (no vDSO TSC), so
  // only one pair in kTimingSample is timed; the mean is over the sampled pairs.
  const bool timed = (timing_counter_++ % kTimingSample) == 0;
  const auto t0 = timed ? Clock::now() : Clock::time_point{};
  // NULL is CUDA's legacy default stream, a valid main stream there; the simulator has none.
  if (stream == nullptr && options_.backend != pfBackendCuda) {
    return fail(pfErrorInvalidArgument,
                "pfBubbleBegin: stream is NULL (the simulated device has no default stream)");
  }
  if (in_bubble_) {
    return fail(pfErrorInvalidState,
                "pfBubbleBegin: bubble {} is still open on stream {}; nested bubbles are not "
                "allowed (call pfBubbleEnd first)",
                next_bubble_id_ - 1, bubble_stream_);
  }
  BubbleMessage m;
  m.type = BubbleMessage::Type::Begin;
  if (hint != nullptr) {
    if (hint->kind < 0 || hint->kind >= pfBubbleKindCount) {
      return fail(pfErrorInvalidArgument, "pfBubbleBegin: hint->kind = {} is not a pfBubbleKind_t",
                  hint->kind);
    }
    if (!std::isfinite(hint->expected_duration_us)) {
      return fail(pfErrorInvalidArgument,
                  "pfBubbleBegin: hint->expected_duration_us = {} is not finite",
                  hint->expected_duration_us);
    }
    if (hint->lent_bytes > 0 && hint->lent_memory == nullptr) {
      return fail(pfErrorInvalidArgument,
                  "pfBubbleBegin: hint->lent_bytes = {} but hint->lent_memory is NULL",
                  hint->lent_bytes);
    }
    if (hint->label != nullptr) {
      const size_t length = std::strlen(hint->label);
      if (length >= sizeof(m.label)) {
        return fail(pfErrorInvalidArgument,
                    "pfBubbleBegin: hint->label '{}' is {} characters (at most {})", hint->label,
                    length, sizeof(m.label) - 1);
      }
      std::memcpy(m.label, hint->label, length + 1);
    }
    m.kind = hint->kind;
    m.expected_us = hint->expected_duration_us;
    m.lent_bytes = hint->lent_bytes;
    m.lent_memory = hint->lent_memory;
  }
  if (!device_->is_valid_main_stream(stream)) {
    return fail(pfErrorInvalidArgument,
                "pfBubbleBegin: stream {} is not a main-job stream of this runtime's device",
                stream);
  }
  const uint64_t id = next_bubble_id_;
  // The event pair of bubble `id` is reused from bubble id - kBubbleEventSlots, which must be
  // harvested. If the executor fell that far behind, the bubble is simply not tracked.
  m.tracked = id <= harvested_upto_.load(std::memory_order_acquire) + kBubbleEventSlots;
  if (m.tracked) {
    PF_TRY(device_->record_event(bubble_begin_events_[id % kBubbleEventSlots], stream));
  }
  m.bubble_id = id;
  m.iteration = iterations_.load(std::memory_order_relaxed);
  m.index_in_iteration = index_in_iteration_;
  push_message(m);
  in_bubble_ = true;
  current_tracked_ = m.tracked;
  bubble_stream_ = stream;
  ++next_bubble_id_;
  ++index_in_iteration_;
  current_timed_ = timed;
  if (timed) {
    begin_ns_pending_ = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  return pfSuccess;
}

pfResult_t Runtime::bubble_end(void* stream) {
  const auto t0 = current_timed_ ? Clock::now() : Clock::time_point{};
  if (stream == nullptr && options_.backend != pfBackendCuda) {
    return fail(pfErrorInvalidArgument,
                "pfBubbleEnd: stream is NULL (the simulated device has no default stream)");
  }
  if (!in_bubble_) {
    return fail(pfErrorInvalidState, "pfBubbleEnd: no bubble is open (pfBubbleBegin not called)");
  }
  if (stream != bubble_stream_) {
    return fail(pfErrorInvalidState,
                "pfBubbleEnd: stream {} is not the stream {} bubble {} began on", stream,
                bubble_stream_, next_bubble_id_ - 1);
  }
  const uint64_t id = next_bubble_id_ - 1;
  // Close the gate in stream order: ticket blocks of this bubble stop at their next check.
  PF_TRY(device_->write_word(stream, &words_[0], id));
  if (current_tracked_) {
    PF_TRY(device_->record_event(bubble_end_events_[id % kBubbleEventSlots], stream));
  }
  BubbleMessage m;
  m.type = BubbleMessage::Type::End;
  m.bubble_id = id;
  push_message(m);
  in_bubble_ = false;
  bubble_stream_ = nullptr;
  if (current_timed_) {
    const uint64_t end_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    host_ns_total_.fetch_add(begin_ns_pending_ + end_ns, std::memory_order_relaxed);
    host_pairs_.fetch_add(1, std::memory_order_relaxed);
  }
  return pfSuccess;
}

pfResult_t Runtime::iteration_end() {
  if (in_bubble_) {
    return fail(pfErrorInvalidState,
                "pfIterationEnd: bubble {} is still open (call pfBubbleEnd first)",
                next_bubble_id_ - 1);
  }
  index_in_iteration_ = 0;
  iterations_.fetch_add(1, std::memory_order_relaxed);
  return pfSuccess;
}

void Runtime::push_message(const BubbleMessage& m) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      if (ring_tail_ - ring_head_ < kQueueCapacity) {
        ring_[ring_tail_ % kQueueCapacity] = m;
        ring_tail_atomic_.store(++ring_tail_, std::memory_order_release);
        break;
      }
    }
    // The ring is full. On the simulator the messages wait for the world to run: handle them
    // here rather than block forever (a program enqueued kQueueCapacity messages without
    // running the world). Otherwise the executor is that far behind: let it catch up.
    if (inline_processing_) {
      process_messages_inline();
    } else {
      std::this_thread::yield();
    }
  }
  if (executor_sleeping_.load(std::memory_order_acquire)) queue_cv_.notify_one();
}

void Runtime::wait_for_executor() {
  if (inline_processing_) {
    process_messages_inline();
    return;
  }
  std::unique_lock<std::mutex> lock(queue_mutex_);
  const uint64_t target = ring_tail_;
  processed_cv_.wait(lock, [&] { return processed_ >= target || stop_; });
}

void Runtime::process_messages_inline() {
  std::lock_guard<std::mutex> work(mutex_);
  std::vector<BubbleMessage> batch;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    while (ring_head_ != ring_tail_) {
      batch.push_back(ring_[ring_head_ % kQueueCapacity]);
      ++ring_head_;
    }
  }
  for (const BubbleMessage& m : batch) {
    if (m.type == BubbleMessage::Type::Begin) {
      handle_begin(m);
    } else {
      handle_end(m);
    }
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    processed_ += batch.size();
  }
  processed_cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Executor thread
// ---------------------------------------------------------------------------------------------

void Runtime::executor_main() {
  std::vector<BubbleMessage> batch;
  batch.reserve(kQueueCapacity);
  auto last_work = Clock::now();
  for (;;) {
    batch.clear();
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      if (inline_processing_) {
        // Simulated backend: messages are handled by the thread that runs the world (see
        // process_messages_inline); this thread only polls completions.
        if (!stop_) queue_cv_.wait_for(lock, kIdlePoll, [&] { return stop_; });
        if (stop_) break;
      } else if (ring_head_ == ring_tail_ && !stop_) {
        if (Clock::now() - last_work < kSpinAfterWork) {
          lock.unlock();
          while (ring_tail_atomic_.load(std::memory_order_acquire) == ring_head_ &&
                 Clock::now() - last_work < kSpinAfterWork) {
            std::this_thread::yield();
          }
          lock.lock();
        }
        if (ring_head_ == ring_tail_ && !stop_) {
          executor_sleeping_.store(true, std::memory_order_release);
          queue_cv_.wait_for(lock, kIdlePoll, [&] { return ring_head_ != ring_tail_ || stop_; });
          executor_sleeping_.store(false, std::memory_order_release);
        }
      }
      if (stop_ && (inline_processing_ || ring_head_ == ring_tail_)) break;
      while (!inline_processing_ && ring_head_ != ring_tail_) {
        batch.push_back(ring_[ring_head_ % kQueueCapacity]);
        ++ring_head_;
      }
    }
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (batch.empty()) {
        harvest_locked();
      } else {
        for (const BubbleMessage& m : batch) {
          if (m.type == BubbleMessage::Type::Begin) {
            handle_begin(m);
          } else {
            handle_end(m);
          }
        }
      }
    } catch (const std::exception& e) {
      record_async_error(pfErrorInternal, fmt::format("executor: {}", e.what()));
    } catch (...) {
      record_async_error(pfErrorInternal, "executor: unknown exception");
    }
    if (!batch.empty()) {
      last_work = Clock::now();
      {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        processed_ += batch.size();
      }
      processed_cv_.notify_all();
    }
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    processed_ = ring_tail_;
  }
  processed_cv_.notify_all();
}

void Runtime::handle_begin(const BubbleMessage& m) {
  // Harvest first: on the simulated device this makes the prediction for this bubble depend
  // only on what completed before it was begun, hence deterministic.
  harvest_locked();
  pending_.emplace_back();
  BubbleRecord& bubble = pending_.back();
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
      predictor_.predict(bubble.class_key, options_.prediction_quantile);
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
  fill_bubble(bubble, predicted, m);
}

void Runtime::handle_end(const BubbleMessage& m) {
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    if (it->id == m.bubble_id) {
      it->ended = true;
      return;
    }
  }
}

uint64_t Runtime::remaining_items(const JobState& job) const {
  const uint64_t done_or_planned =
      job.kind == pfJobOpaque ? job.next_opaque_item : job.items_completed + job.items_in_flight;
  return done_or_planned >= job.item_count ? 0 : job.item_count - done_or_planned;
}

void Runtime::fill_bubble(BubbleRecord& bubble, double predicted_us, const BubbleMessage& m) {
  double usable = predicted_us * (1.0 - options_.safety_margin_fraction) - options_.safety_margin_us;
  size_t lent_left = m.lent_memory != nullptr ? m.lent_bytes : 0;
  std::vector<bool> tried(jobs_.size(), false);
  std::vector<JobSchedView> views(jobs_.size());
  while (usable > 0) {
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const JobState& job = *jobs_[i];
      JobSchedView& v = views[i];
      v.sequence = job.sequence;
      v.priority = job.priority;
      const uint64_t remaining = remaining_items(job);
      const JobConfigModel& c = job.configs[static_cast<size_t>(std::max(0, job.setup_config))];
      const int workers = std::max(1, c.parallelism > 0 ? std::min(c.parallelism, partition_.fill_sms)
                                                        : partition_.fill_sms);
      v.remaining_work_us = static_cast<double>(remaining) * c.item_cost_us / workers;
      v.received_bubble_us = job.bubble_time_us;
      v.runnable = !tried[i] && !is_terminal(job.status) && remaining > 0;
    }
    const std::vector<size_t> order = schedule_order(options_.policy, views);
    bool launched = false;
    for (const size_t index : order) {
      tried[index] = true;
      const std::shared_ptr<JobState>& job = jobs_[index];
      PlanRequest request;
      request.predicted_us = usable;
      request.launch_overhead_us = launch_overhead_us_;
      request.free_bytes = std::max(arena_.largest_free_block(), lent_left);
      request.fill_sms = partition_.fill_sms;
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
      if (free_slice_slots_.empty()) {
        bubble.skip_reason = "slice event pool exhausted";
        return;
      }
      void* workspace = nullptr;
      uintptr_t workspace_block = 0;
      if (plan.workspace_bytes > 0) {
        if (lent_left >= plan.workspace_bytes) {
          workspace = m.lent_memory;  // the engine's memory, for this bubble only
          lent_left = 0;
        } else if (arena_.allocate(plan.workspace_bytes, 0, &workspace_block)) {
          workspace = reinterpret_cast<void*>(workspace_block);
        } else {
          continue;
        }
      }
      if (launch_slice(bubble, job, plan, workspace, workspace_block, plan.workspace_bytes)) {
        usable -= plan.expected_us + launch_overhead_us_;
        launched = true;
        break;
      }
      if (workspace_block != 0) arena_.release(workspace_block);
    }
    if (!launched) break;
  }
}

bool Runtime::launch_slice(BubbleRecord& bubble, const std::shared_ptr<JobState>& job_ptr,
                           const SlicePlan& plan, void* workspace, uintptr_t workspace_block,
                           size_t workspace_bytes) {
  JobState& job = *job_ptr;
  const size_t slot = free_slice_slots_.back();
  // A failing device call is an asynchronous error of the runtime (the slice is dropped).
  auto device_failed = [&](pfResult_t code, const char* what) {
    record_async_error(code, fmt::format("fill slice of job '{}' in bubble {}: {} failed: {}",
                                         job.name, bubble.id, what, last_error_message()));
    return false;
  };
  pfResult_t r = device_->write_word(fill_stream_, job.budget_counter, 0);
  if (r != pfSuccess) return device_failed(r, "zeroing the budget counter");
  r = device_->stream_wait_event(fill_stream_,
                                 bubble_begin_events_[bubble.id % kBubbleEventSlots]);
  if (r != pfSuccess) return device_failed(r, "waiting for the begin event");
  r = device_->record_event(slice_start_events_[slot], fill_stream_);
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
  slice.gate = words_;
  slice.cursor = job.cursor;
  slice.budget_counter = job.budget_counter;
  slice.workspace = workspace;
  slice.workspace_bytes = workspace_bytes;

  clear_last_error();
  pfResult_t launched = pfErrorInternal;
  std::string why;
  try {
    launched = job.launch(job.user, &slice, fill_stream_);
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
    end_job_locked(job, pfJobFailed, launched, message);
    record_async_error(pfErrorJobFailed, message);
    return false;
  }
  r = device_->copy_word_to_host(fill_stream_, job.cursor, &host_words_[slot]);
  if (r != pfSuccess) return device_failed(r, "reading back the cursor");
  // The end event follows the read-back, so a completed end event means the host word is valid.
  r = device_->record_event(slice_end_events_[slot], fill_stream_);
  if (r != pfSuccess) return device_failed(r, "recording the slice end");

  free_slice_slots_.pop_back();
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
  ++stats_.slices_launched;
  return true;
}

void Runtime::harvest_locked() {
  while (!pending_.empty()) {
    BubbleRecord& bubble = pending_.front();
    if (!bubble.ended) return;
    double begin_us = 0.0, end_us = 0.0;
    if (bubble.tracked) {
      auto completed = [&](Event e, double* t) {
        bool done = false;
        if (device_->query_event(e, &done, t) != pfSuccess) {
          record_async_error(pfErrorInternal,
                             fmt::format("query_event failed while harvesting bubble {}: {}",
                                         bubble.id, last_error_message()));
          *t = 0.0;
          return true;  // never block the harvest on a broken event
        }
        return done;
      };
      if (!completed(bubble_begin_events_[bubble.id % kBubbleEventSlots], &begin_us)) return;
      if (!completed(bubble_end_events_[bubble.id % kBubbleEventSlots], &end_us)) return;
      for (const SliceRecord& s : bubble.slices) {
        double t = 0.0;
        if (!completed(slice_start_events_[s.event_slot], &t)) return;
        if (!completed(slice_end_events_[s.event_slot], &t)) return;
      }
    }
    harvest_bubble(bubble, begin_us, end_us);
    harvested_upto_.store(bubble.id, std::memory_order_release);
    pending_.pop_front();
  }
}

void Runtime::harvest_bubble(BubbleRecord& bubble, double begin_us, double end_us) {
  if (!bubble.tracked) {
    ++stats_.bubbles_skipped;
    return;
  }
  const double duration = std::max(0.0, end_us - begin_us);
  predictor_.add_sample(bubble.class_key, duration);
  ++stats_.bubbles;
  stats_.bubble_time_us += duration;
  double filled = 0.0;
  double overrun = 0.0;
  for (SliceRecord& s : bubble.slices) {
    double start_us = 0.0, slice_end_us = 0.0;
    bool done = false;
    device_->query_event(slice_start_events_[s.event_slot], &done, &start_us);
    device_->query_event(slice_end_events_[s.event_slot], &done, &slice_end_us);
    JobState& job = *s.job;
    --job.slices_in_flight;
    job.items_in_flight -= std::min(job.items_in_flight, s.planned_items);
    uint64_t items_done_here = 0;
    if (job.kind == pfJobTicket) {
      // Claimed items always finish, so the cursor read back after the slice is exact.
      const uint64_t done_total = std::min(host_words_[s.event_slot], job.item_count);
      if (done_total > job.items_completed) {
        items_done_here = done_total - job.items_completed;
        job.items_completed = done_total;
      }
    } else {
      items_done_here = s.planned_items;
      job.items_completed = std::min(job.item_count, job.items_completed + s.planned_items);
    }
    // A ticket slice that completed no item had no block running an item: its blocks found the
    // gate closed (or the budget spent) when they got an SM, possibly long after the bubble
    // ended because the main job's kernels held every SM. Its completion event is late but no
    // fill work ran, so it counts neither as filled time nor as overrun. This holds for slices
    // of detached (destroyed) jobs too: their work ran on the device all the same.
    if (items_done_here > 0 || job.kind != pfJobTicket) {
      filled += std::max(0.0, std::min(slice_end_us, end_us) - std::max(start_us, begin_us));
      overrun = std::max(overrun, slice_end_us - end_us);
      job.busy_time_us += std::max(0.0, slice_end_us - start_us);
    }
    if (!job.detached) {
      stats_.items_completed += items_done_here;
      if (job.items_completed > 0 && job.status == pfJobPending) {
        job.status = pfJobRunning;
        job_cv_.notify_all();
      }
      if (job.items_completed >= job.item_count && !is_terminal(job.status)) {
        end_job_locked(job, pfJobCompleted, pfSuccess, "");
      }
      maybe_teardown_locked(job);
    }
    if (s.workspace != 0) arena_.release(s.workspace);
    free_slice_slots_.push_back(s.event_slot);
    if (trace_slices_.size() < kMaxTraceRecords) {
      trace_slices_.push_back(TraceSlice{bubble.id, job.name, start_us, slice_end_us,
                                         items_done_here, s.config_index});
    } else {
      trace_truncated_ = true;
    }
  }
  stats_.filled_time_us += filled;
  if (bubble.iteration > calibration_iteration_) {
    calibration_iteration_ = bubble.iteration;
    collect_calibration_locked();
  }
  if (overrun > 0) {
    stats_.overrun_time_us += overrun;
    stats_.max_overrun_us = std::max(stats_.max_overrun_us, overrun);
  }
  if (bubble.slices.empty()) {
    ++stats_.bubbles_skipped;
    log::trace("bubble {} ({}) not filled: {}", bubble.id, bubble.class_key, bubble.skip_reason);
  } else {
    ++stats_.bubbles_filled;
  }
  if (trace_bubbles_.size() < kMaxTraceRecords) {
    trace_bubbles_.push_back(TraceBubble{bubble.id, bubble.iteration, bubble.class_key,
                                         bubble.kind, begin_us, end_us, bubble.predicted_us,
                                         bubble.slices.size()});
  } else {
    trace_truncated_ = true;
  }
}

void Runtime::end_job_locked(JobState& job, pfJobStatus_t status, pfResult_t error,
                             std::string message) {
  if (is_terminal(job.status)) return;
  job.status = status;
  job.error = error;
  job.error_message = std::move(message);
  if (status == pfJobCompleted) ++stats_.jobs_completed;
  if (status == pfJobFailed) ++stats_.jobs_failed;
  log::debug("job '{}' ended: status {}, {} of {} items", job.name, static_cast<int>(status),
             job.items_completed, job.item_count);
  maybe_teardown_locked(job);
  job_cv_.notify_all();
}

void Runtime::maybe_teardown_locked(JobState& job) {
  // Teardown frees what the job's kernels use: only once none of its slices is in flight.
  if (job.torn_down || !is_terminal(job.status) || job.slices_in_flight > 0) return;
  job.torn_down = true;
  if (job.teardown != nullptr) {
    try {
      job.teardown(job.user);
    } catch (...) {
      log::warn("job '{}': teardown threw; ignored", job.name);
    }
  }
}

void Runtime::record_async_error(pfResult_t code, const std::string& message) {
  pfResult_t expected = pfSuccess;
  if (async_error_.compare_exchange_strong(expected, code)) async_message_ = message;
  log::warn("asynchronous error {}: {}", result_name(code), message);
}

// ---------------------------------------------------------------------------------------------
// Any-thread API
// ---------------------------------------------------------------------------------------------

pfResult_t Runtime::synchronize() {
  wait_for_executor();
  PF_TRY(device_->synchronize_stream(fill_stream_));
  std::lock_guard<std::mutex> lock(mutex_);
  for (const BubbleRecord& b : pending_) {
    if (b.ended && b.tracked) {
      PF_TRY(device_->synchronize_event(bubble_end_events_[b.id % kBubbleEventSlots]));
    }
  }
  harvest_locked();
  collect_calibration_locked();
  return pfSuccess;
}

void Runtime::collect_calibration_locked() {
  if (!options_.enable_cupti || !calibration_available_) return;
  std::vector<ActivityRecord> batch;
  const pfResult_t result = device_->collect_activity(&batch);
  if (result == pfErrorNotSupported) {
    calibration_available_ = false;  // the device said why (e.g. CUPTI held by a profiler)
    log::warn("calibration mode: the {} device collects no activity records ({}); continuing "
              "with bubble events only",
              device_->name(), last_error_message());
    return;
  }
  if (result != pfSuccess) {
    log::warn("calibration mode: collecting activity records failed: {}", last_error_message());
    return;
  }
  for (ActivityRecord& r : batch) {
    if (calibration_records_.size() >= kMaxTraceRecords) {
      trace_truncated_ = true;
      break;
    }
    calibration_records_.push_back(std::move(r));
  }
}

pfResult_t Runtime::get_stats(pfStats_t* stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  *stats = stats_;
  stats->iterations = iterations_.load(std::memory_order_relaxed);
  const uint64_t pairs = host_pairs_.load(std::memory_order_relaxed);
  stats->host_begin_end_ns =
      pairs == 0 ? 0.0
                 : static_cast<double>(host_ns_total_.load(std::memory_order_relaxed)) /
                       static_cast<double>(pairs);
  return pfSuccess;
}

pfResult_t Runtime::write_trace(const char* path) {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collect_calibration_locked();
    const int pid = options_.stage_id;
    out.reserve(256 + 200 * (trace_bubbles_.size() + trace_slices_.size()));
    out += "{\"traceEvents\":[\n";
    out += fmt::format(
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":"
        "\"PipeFill stage {0}\"}}}},\n",
        pid);
    out += fmt::format(
        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":1,\"args\":{{\"name\":"
        "\"bubbles (main stream)\"}}}},\n",
        pid);
    out += fmt::format(
        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":2,\"args\":{{\"name\":"
        "\"fill slices\"}}}}",
        pid);
    for (const TraceBubble& b : trace_bubbles_) {
      out += fmt::format(
          ",\n{{\"name\":\"bubble {}\",\"cat\":\"bubble\",\"ph\":\"X\",\"pid\":{},\"tid\":1,"
          "\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{\"id\":{},\"iteration\":{},\"kind\":\"{}\","
          "\"predicted_us\":{:.3f},\"slices\":{}}}}}",
          json_escape(b.class_key), pid, b.begin_us, b.end_us - b.begin_us, b.id, b.iteration,
          kind_name(b.kind), b.predicted_us, b.slices);
      if (b.predicted_us > 0) {
        out += fmt::format(
            ",\n{{\"name\":\"predicted bubble us\",\"ph\":\"C\",\"pid\":{},\"tid\":1,"
            "\"ts\":{:.3f},\"args\":{{\"{}\":{:.3f}}}}}",
            pid, b.begin_us, json_escape(b.class_key), b.predicted_us);
      }
    }
    for (const TraceSlice& s : trace_slices_) {
      out += fmt::format(
          ",\n{{\"name\":\"{}\",\"cat\":\"fill\",\"ph\":\"X\",\"pid\":{},\"tid\":2,"
          "\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{\"bubble\":{},\"items\":{},\"config\":{}}}}}",
          json_escape(s.job_name), pid, s.start_us, s.end_us - s.start_us, s.bubble_id, s.items,
          s.config_index);
    }
    // Calibration records, in the categories PyTorch's profiler uses so pipefill-analyze (and
    // Perfetto) read them like any GPU trace; one track per device stream.
    for (const ActivityRecord& r : calibration_records_) {
      const uint64_t tid = kCalibrationTidBase + r.stream;
      switch (r.kind) {
        case ActivityKind::Kernel:
        case ActivityKind::Comm:
        case ActivityKind::Fill:
        case ActivityKind::Memcpy:
        case ActivityKind::Memset: {
          const char* cat = r.kind == ActivityKind::Memcpy   ? "gpu_memcpy"
                            : r.kind == ActivityKind::Memset ? "gpu_memset"
                            : r.kind == ActivityKind::Fill   ? "fill"
                                                             : "kernel";
          out += fmt::format(
              ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},"
              "\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{\"device\":{},\"stream\":{},"
              "\"gpu\":{},\"bytes\":{},\"correlation\":{},\"blocks\":{}}}}}",
              json_escape(r.name), cat, pid, tid, r.start_us, r.end_us - r.start_us, pid, tid,
              r.device, r.bytes, r.correlation, r.grid_blocks);
          break;
        }
        case ActivityKind::MemoryAlloc:
        case ActivityKind::MemoryFree:
          out += fmt::format(
              ",\n{{\"name\":\"[memory]\",\"ph\":\"i\",\"s\":\"t\",\"pid\":{},\"tid\":{},"
              "\"ts\":{:.3f},\"args\":{{\"Device Type\":1,\"Device Id\":{},\"Bytes\":{}{}}}}}",
              pid, tid, r.start_us, pid, r.kind == ActivityKind::MemoryFree ? "-" : "", r.bytes);
          break;
        case ActivityKind::Marker:
          break;
      }
    }
    out += fmt::format("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"truncated\":{}}}}}\n",
                       trace_truncated_ ? "true" : "false");
  }
  std::FILE* file = std::fopen(path, "wb");
  if (file == nullptr) {
    return fail(pfErrorIo, "cannot open trace file '{}' for writing: {}", path,
                std::strerror(errno));
  }
  const size_t written = std::fwrite(out.data(), 1, out.size(), file);
  const bool closed = std::fclose(file) == 0;
  if (written != out.size() || !closed) {
    return fail(pfErrorIo, "writing trace file '{}' failed: {}", path, std::strerror(errno));
  }
  return pfSuccess;
}

pfResult_t Runtime::create_high_priority_stream(void** stream) {
  int lowest = 0, highest = 0;
  PF_TRY(device_->priority_range(&lowest, &highest));
  return device_->create_stream(highest, stream);
}

pfResult_t Runtime::destroy_stream(void* stream) {
  if (stream == fill_stream_ || !device_->is_valid_main_stream(stream)) {
    return fail(pfErrorInvalidArgument,
                "pfStreamDestroy: stream {} is not a main-job stream of this runtime", stream);
  }
  return device_->destroy_stream(stream);
}

// ---------------------------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------------------------

pfResult_t Runtime::create_job(const pfJobDesc_t* desc, JobState** out) {
  if (desc->launch == nullptr) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->launch is NULL (required)");
  }
  if (desc->item_count == 0) {
    return fail(pfErrorInvalidArgument, "pfJobCreate: desc->item_count = 0 (must be > 0)");
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
  job->runtime = this;
  job->name = desc->name != nullptr ? desc->name : "job";
  job->kind = static_cast<pfJobKind_t>(desc->kind);
  job->priority = desc->priority;
  job->item_count = desc->item_count;
  job->user = desc->user;
  job->setup = desc->setup;
  job->launch = desc->launch;
  job->teardown = desc->teardown;
  if (desc->config_count == 0) {
    if (!(desc->item_cost_hint_us > 0)) {
      return fail(pfErrorInvalidArgument,
                  "pfJobCreate: job '{}': desc->item_cost_hint_us = {} must be > 0 when no "
                  "configs are given",
                  job->name, desc->item_cost_hint_us);
    }
    JobConfigModel c;
    c.item_cost_us = desc->item_cost_hint_us;
    c.resident_bytes = desc->resident_bytes;
    c.workspace_bytes_per_item = desc->workspace_bytes_per_item;
    job->configs.push_back(c);
  } else {
    for (int i = 0; i < desc->config_count; ++i) {
      const pfJobConfig_t& in = desc->configs[i];
      JobConfigModel c;
      c.item_cost_us = in.item_cost_us > 0 ? in.item_cost_us : desc->item_cost_hint_us;
      if (!(c.item_cost_us > 0) || !std::isfinite(c.item_cost_us)) {
        return fail(pfErrorInvalidArgument,
                    "pfJobCreate: job '{}': configs[{}].item_cost_us = {} and "
                    "item_cost_hint_us = {}: one must be > 0",
                    job->name, i, in.item_cost_us, desc->item_cost_hint_us);
      }
      if (in.parallelism < 0) {
        return fail(pfErrorInvalidArgument,
                    "pfJobCreate: job '{}': configs[{}].parallelism = {} is negative", job->name,
                    i, in.parallelism);
      }
      if (in.items_per_item < 0 || !std::isfinite(in.items_per_item)) {
        return fail(pfErrorInvalidArgument,
                    "pfJobCreate: job '{}': configs[{}].items_per_item = {} is negative",
                    job->name, i, in.items_per_item);
      }
      c.parallelism = in.parallelism;
      c.resident_bytes = in.resident_bytes > 0 ? in.resident_bytes : desc->resident_bytes;
      c.workspace_bytes_per_item =
          in.workspace_bytes_per_item > 0 ? in.workspace_bytes_per_item
                                          : desc->workspace_bytes_per_item;
      c.work_per_item = in.items_per_item > 0 ? in.items_per_item : 1.0;
      job->configs.push_back(c);
    }
  }

  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto free_slot = std::find(job_slot_used_.begin(), job_slot_used_.end(), false);
    if (free_slot == job_slot_used_.end()) {
      return fail(pfErrorBusy, "pfJobCreate: job '{}': {} jobs are attached (the maximum)",
                  job->name, kMaxJobs);
    }
    const size_t largest = arena_.largest_free_block();
    job->setup_config = choose_setup_config(job->configs, largest, partition_.fill_sms);
    if (job->setup_config < 0) {
      size_t needed = SIZE_MAX;
      for (const JobConfigModel& c : job->configs) needed = std::min(needed, c.resident_bytes);
      return fail(pfErrorOutOfMemory,
                  "pfJobCreate: job '{}' needs {} resident bytes but the fill arena has {} free "
                  "bytes (largest block {}) of {}",
                  job->name, needed, arena_.free_bytes(), largest, arena_.capacity());
    }
    job->resident_reserved = job->configs[static_cast<size_t>(job->setup_config)].resident_bytes;
    if (job->resident_reserved > 0 &&
        !arena_.allocate(job->resident_reserved, 0, &job->resident_block)) {
      return fail(pfErrorOutOfMemory,
                  "pfJobCreate: job '{}' needs {} resident bytes but the fill arena has {} free",
                  job->name, job->resident_reserved, arena_.free_bytes());
    }
    job->slot = static_cast<int>(free_slot - job_slot_used_.begin());
    *free_slot = true;
    job->cursor = &words_[1 + 2 * job->slot];
    job->budget_counter = &words_[2 + 2 * job->slot];
    job->sequence = next_job_sequence_++;
    job->last_config = job->setup_config;
  }
  auto release_reservation = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job->resident_block != 0) arena_.release(job->resident_block);
    job_slot_used_[static_cast<size_t>(job->slot)] = false;
  };
  // A reused slot may hold an old cursor: reset it in fill-stream order, before any slice.
  pfResult_t r = device_->write_word(fill_stream_, job->cursor, 0);
  if (r != pfSuccess) {
    release_reservation();
    return r;
  }
  if (job->setup != nullptr) {
    SetupAllocatorContext context{job.get()};
    const pfArenaAllocator_t allocator{&context, &setup_allocate};
    clear_last_error();
    pfResult_t setup_result = pfErrorInternal;
    std::string why;
    try {
      setup_result = job->setup(job->user, &allocator, job->setup_config);
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
      return fail(pfErrorJobFailed, "pfJobCreate: job '{}': setup returned {}{}{}", job->name,
                  result_name(setup_result), why.empty() ? "" : ": ", why);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(job);
  }
  log::info("job '{}' created: {} items, kind {}, config {} of {}, {} resident bytes", job->name,
            job->item_count, job->kind == pfJobTicket ? "ticket" : "opaque", job->setup_config,
            job->configs.size(), job->resident_reserved);
  *out = job.get();
  return pfSuccess;
}

pfResult_t Runtime::job_info(JobState* job, pfJobInfo_t* info) {
  std::lock_guard<std::mutex> lock(mutex_);
  info->status = job->status;
  info->items_completed = job->items_completed;
  info->item_count = job->item_count;
  info->slices_launched = job->slices_launched;
  info->bubble_time_us = job->bubble_time_us;
  info->busy_time_us = job->busy_time_us;
  info->config_index = job->last_config;
  info->error = job->error;
  if (job->status == pfJobFailed && !job->error_message.empty()) {
    set_error(job->error, job->error_message);  // the "message" pfJobGetStatus exposes
  }
  return pfSuccess;
}

pfResult_t Runtime::cancel_job(JobState* job) {
  std::lock_guard<std::mutex> lock(mutex_);
  end_job_locked(*job, pfJobCancelled, pfSuccess, "");
  return pfSuccess;
}

pfResult_t Runtime::wait_job(JobState* job, double timeout_us) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto finished = [&] { return is_terminal(job->status); };
  if (timeout_us < 0) {
    job_cv_.wait(lock, finished);
  } else if (!job_cv_.wait_for(lock, std::chrono::duration<double, std::micro>(timeout_us),
                               finished)) {
    return fail(pfErrorTimeout,
                "pfJobWait: job '{}' did not finish within {} us ({} of {} items done){}",
                job->name, timeout_us, job->items_completed, job->item_count,
                options_.backend == pfBackendSim
                    ? "; on the simulated backend the job only advances while the world runs "
                      "(pfSimRunUntilIdle)"
                    : "");
  }
  switch (job->status) {
    case pfJobCompleted: return pfSuccess;
    case pfJobFailed:
      return fail(pfErrorJobFailed, "job '{}' failed: {}", job->name, job->error_message);
    default: return fail(pfErrorCancelled, "job '{}' was cancelled", job->name);
  }
}

pfResult_t Runtime::destroy_job(JobState* job) {
  bool in_flight = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    end_job_locked(*job, pfJobCancelled, pfSuccess, "");
    in_flight = job->slices_in_flight > 0;
  }
  if (in_flight) {
    // Its slices run on the fill stream: once that drained, nothing uses the job's memory.
    wait_for_executor();
    PF_TRY(device_->synchronize_stream(fill_stream_));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  harvest_locked();
  job->detached = true;
  if (!job->torn_down) {
    job->torn_down = true;
    if (job->teardown != nullptr) {
      try {
        job->teardown(job->user);
      } catch (...) {
        log::warn("job '{}': teardown threw; ignored", job->name);
      }
    }
  }
  if (job->resident_block != 0) arena_.release(job->resident_block);
  job->resident_block = 0;
  job_slot_used_[static_cast<size_t>(job->slot)] = false;
  // Records of its unharvested slices keep the object alive until they are harvested.
  jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(),
                             [&](const std::shared_ptr<JobState>& j) { return j.get() == job; }),
              jobs_.end());
  job_cv_.notify_all();
  return pfSuccess;
}

}  // namespace pipefill::core
