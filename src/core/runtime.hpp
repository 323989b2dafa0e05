// The runtime behind pfRuntime_t: a facade that creates the parts of a runtime, wires them
// together and shuts them down. Each stage of a bubble's journey is its own file:
//
//   bubble_tracker   user thread: pfBubbleBegin/End/IterationEnd -> stream ops + a message
//   message_ring     the bounded ring carrying those messages
//   message_pump     who handles them: the executor thread, or the simulator's pre-run hook
//   executor         per message: harvest, predict, fill; the harvest driver
//   slice_launcher   planning and enqueueing a bubble's slices on the fill stream
//   harvester        pure accounting of a completed bubble (event times, read-backs)
//   job_registry     the life of a fill job (create, status, cancel, wait, destroy, teardown)
//   trace_writer     Chrome-trace JSON of the harvested bubbles and slices
//   fill_resources   every device object, made once at creation
//
// Lock order and thread affinity: docs/architecture.md.
#pragma once

#include <array>
#include <memory>

#include "core/bubble_tracker.hpp"
#include "core/config.hpp"
#include "core/executor.hpp"
#include "core/fill_resources.hpp"
#include "core/handles.hpp"
#include "core/job_registry.hpp"
#include "core/message_pump.hpp"
#include "core/message_ring.hpp"
#include "core/runtime_state.hpp"
#include "device/device.hpp"
#include "pipefill/pipefill.h"

// Internal classes live in pipefill::core so they can never clash with the public C++ layer
// (include/pipefill/pipefill.hpp defines pipefill::Runtime and pipefill::Job).
namespace pipefill::core {

class Runtime {
 public:
  static pfResult_t create(const pfConfig_t* config, std::unique_ptr<Runtime>* out);
  // From already resolved options (C++ callers and tests).
  static pfResult_t create(const RuntimeOptions& options, std::unique_ptr<Runtime>* out);
  // On a device made by the caller (tests: a device with injected faults or latches).
  static pfResult_t create(const RuntimeOptions& options, std::unique_ptr<Device> device,
                           std::unique_ptr<Runtime>* out);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  // pfErrorBusy while jobs are attached, pfErrorInvalidState inside a live bubble; changes
  // nothing then.
  pfResult_t check_can_shut_down();
  // check_can_shut_down(), then stops the executor and frees everything.
  pfResult_t shutdown();

  // Handle bookkeeping (core/handles.hpp).
  uint64_t magic() const { return magic_; }
  std::atomic<int>& calls_in_flight() { return calls_in_flight_; }

  const RuntimeOptions& options() const { return options_; }
  Device& device() { return *device_; }
  const FillPartition& partition() const { return resources_.partition; }
  pfSimWorld_t sim_world() const { return sim_world_; }

  // ---- user thread ------------------------------------------------------------------------
  pfResult_t bubble_begin(void* stream, const pfBubbleHint_t* hint) {
    return tracker_->begin(stream, hint);
  }
  pfResult_t bubble_end(void* stream) { return tracker_->end(stream); }
  pfResult_t bubble_close_fill(void* stream) { return tracker_->close_fill(stream); }
  // Also runs the teardowns that came due (it is outside any bubble by definition).
  pfResult_t iteration_end();

  // ---- any thread -------------------------------------------------------------------------
  pfResult_t synchronize();
  pfResult_t get_stats(pfStats_t* stats);
  // Skipped bubbles by pfSkipCause_t (PF_SKIP_CAUSE_COUNT entries).
  std::array<uint64_t, PF_SKIP_CAUSE_COUNT> skip_counts();
  size_t class_count();
  // The fill streams made at init (fixed for the runtime's life).
  const std::vector<Stream>& fill_streams() const { return resources_.fill_streams; }
  // False when index is out of range; `out` is this layout's struct (size set).
  bool class_stats(size_t index, pfClassStats_t* out);
  // The arena's use and the device's memory measured now (`out` is this layout's struct, size
  // set). pfErrorInvalidState on a thread with a bubble open: the device query may block.
  pfResult_t memory_info(pfMemoryInfo_t* out);
  pfResult_t write_trace(const char* path);
  // pfRuntimeSetSliceObserver (host backend only; fn nullptr removes).
  pfResult_t set_slice_observer(pfSliceObserverFn fn, void* user);
  // pfRuntimeSetClassMargin: margin_us >= 0 replaces safety_margin_us for the class, < 0 removes it.
  void set_class_margin(const std::string& class_key, double margin_us);
  pfResult_t async_error() const { return state_.async_error.load(); }
  pfResult_t create_high_priority_stream(void** stream);
  pfResult_t destroy_stream(void* stream);

  pfResult_t create_job(const pfJobDesc_t* desc, JobState** out);
  pfResult_t create_graph_job(const pfGraphJobDesc_t* desc, JobState** out);
  // pfGraphCaptureStreamCreate: a stream on the fill partition's context (Device docs).
  pfResult_t create_capture_stream(void** stream);
  pfResult_t push_capture_context(void* stream);
  pfResult_t pop_capture_context();
  pfResult_t job_info(JobState* job, pfJobInfo_t* info);
  pfResult_t job_cost_info(JobState* job, pfJobCostInfo_t* info);
  pfResult_t set_job_cost_policy(JobState* job, int policy);
  pfResult_t cancel_job(JobState* job);
  pfResult_t set_job_available(JobState* job, uint64_t available);
  pfResult_t end_job_input(JobState* job);
  pfResult_t wait_job(JobState* job, double timeout_us);
  pfResult_t destroy_job(JobState* job);

  // Blocks until every message pushed so far is handled (the sim pre-run hook and synchronize
  // use it). Never call it from the executor thread.
  void wait_for_executor();

  // Tests only: the state the executor shares (e.g. to hold its lock as a harvest would).
  RuntimeState& state_for_tests() { return state_; }

 private:
  Runtime() = default;
  pfResult_t init(const RuntimeOptions& options, std::unique_ptr<Device> device);
  void stop_and_release();
  // Runs due teardowns on this thread unless the user thread is inside a bubble (then the next
  // pfIterationEnd, pfJobWait, pfRuntimeSynchronize or pfJobDestroy runs them).
  void run_teardowns_outside_bubbles();
  // Why a pfJobWait of `timeout_us` on the calling thread could never see its job end (inside
  // the caller's own bubble; a forever wait on the thread that drives a simulated world), or
  // empty when it may block.
  std::string why_a_wait_never_returns(double timeout_us) const;
  // pfErrorInvalidState naming `function` when the calling thread has a bubble open.
  pfResult_t refuse_inside_bubble(const char* function) const;

  uint64_t magic_ = kRuntimeMagic;
  std::atomic<int> calls_in_flight_{0};
  RuntimeOptions options_;
  std::unique_ptr<Device> device_;
  FillResources resources_;
  pfSimWorld_t sim_world_ = nullptr;
  bool hook_registered_ = false;
  RuntimeState state_;
  std::unique_ptr<MessageRing> ring_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<MessagePump> pump_;
  std::unique_ptr<BubbleTracker> tracker_;
  std::unique_ptr<JobRegistry> jobs_;
};

}  // namespace pipefill::core

// The C handles (pfRuntime_t, pfJob_t) are keys of core/handles.hpp's tables; the handle
// structs themselves are never defined.
