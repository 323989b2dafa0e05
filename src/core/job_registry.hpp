// The job registry: the life of a fill job from pfJobCreate to pfJobDestroy. Validation of the
// description, the device-word slot and the arena share, setup, status, cancel, wait, the end of
// a job and its teardown. Planning and harvesting a job's slices are the slice launcher's and the
// executor's; they end jobs through end_job() below.
#pragma once

#include <functional>

#include "core/config.hpp"
#include "core/fill_resources.hpp"
#include "core/runtime_state.hpp"
#include "device/device.hpp"

namespace pipefill::core {

class JobRegistry {
 public:
  JobRegistry(Device& device, const FillResources& resources)
      : device_(device), resources_(resources) {}

  // The warm-up pfJobCreate runs after setup (Executor::warm_up: one empty slice per fill
  // stream, then the streams synchronized). Set once, before the first job.
  using WarmUp = std::function<pfResult_t(const JobState&)>;
  void set_warm_up(WarmUp warm_up) { warm_up_ = std::move(warm_up); }

  // Validates `desc`, reserves a slot and the resident share, runs setup and the warm-up; on
  // success the job is attached (visible to the executor) and *out points at it. A failure
  // changes nothing (a failed warm-up runs the job's teardown: its setup had succeeded).
  pfResult_t create(RuntimeState& s, Runtime* owner, const pfJobDesc_t* desc, JobState** out)
      EXCLUDES(s.mu);
  // pfJobCreateGraph: the same for a graph job (core/graph_job.hpp); the device prepares its
  // items (CUDA: builds and instantiates the gated graph) after the slot is reserved.
  pfResult_t create_graph(RuntimeState& s, Runtime* owner, const pfGraphJobDesc_t* desc,
                          JobState** out) EXCLUDES(s.mu);
  // pfJobGetStatus. Succeeds (and leaves the thread's message empty) for a failed job too: the
  // failure's message comes with pfJobWait's pfErrorJobFailed.
  pfResult_t info(RuntimeState& s, JobState& job, pfJobInfo_t* out) EXCLUDES(s.mu);
  // pfJobGetCostInfo: the item cost of the configuration in use, given and learned
  // (cost_model.hpp). Writes a whole pfJobCostInfo_t (the C API copies the caller's size of it).
  pfResult_t cost_info(RuntimeState& s, JobState& job, pfJobCostInfo_t* out) EXCLUDES(s.mu);
  // pfJobSetCostPolicy: how the planner estimates each configuration's item cost (0 median,
  // 1 fastest sample, 2 the stated cost kept; the caller checked the value). Every
  // configuration's planned cost is recomputed from its window under the new policy.
  pfResult_t set_cost_policy(RuntimeState& s, JobState& job, int policy) EXCLUDES(s.mu);
  pfResult_t cancel(RuntimeState& s, JobState& job) EXCLUDES(s.mu);
  // pfJobSetAvailable / pfJobEndInput (streaming jobs; the rules are in pipefill.h). A refused
  // call changes nothing.
  pfResult_t set_available(RuntimeState& s, JobState& job, uint64_t available) EXCLUDES(s.mu);
  pfResult_t end_input(RuntimeState& s, JobState& job) EXCLUDES(s.mu);
  // Negative, infinite or above kForeverUs: no limit. `never_returns` non-empty: the caller
  // found that this wait could never see the job end (why, for the message); an unfinished job
  // then fails at once with pfErrorInvalidState instead of blocking.
  pfResult_t wait(RuntimeState& s, JobState& job, double timeout_us,
                  const std::string& never_returns) EXCLUDES(s.mu);
  static bool is_forever(double timeout_us) {
    return timeout_us < 0 || !(timeout_us <= kForeverUs);  // also INFINITY
  }
  // pfJobDestroy, first half: unpublishes the handle and cancels the job; true when slices of it
  // are still in flight (the caller then drains the executor and the fill stream, and harvests).
  bool begin_destroy(RuntimeState& s, JobState& job) EXCLUDES(s.mu);
  // Second half, after the harvest: returns the arena share and the slot, detaches, and takes
  // the teardown if it was not taken yet (the caller runs it, outside the lock).
  void finish_destroy(RuntimeState& s, JobState& job) REQUIRES(s.mu);
  // Runs the teardowns that came due (end_job / harvest queue them) on the calling thread, with
  // no lock held, inside a CallbackScope. Each job's teardown runs exactly once.
  static void run_pending_teardowns(RuntimeState& s) EXCLUDES(s.mu);
  // "'a', 'b'" for messages; empty when no job is attached.
  static std::string attached_names(const RuntimeState& s) REQUIRES(s.mu);

  // Waits longer than this (31 years) are waits without a limit: converting them to the clock's
  // nanoseconds would overflow.
  static constexpr double kForeverUs = 1e15;

 private:
  // The steps every kind shares: a device-word slot and the resident share (`function` names the
  // C call in messages), their release on a later failure, the cursor reset on the fill stream
  // (releases on failure), and publishing + attaching the finished job.
  pfResult_t reserve(RuntimeState& s, JobState& job, const char* function) EXCLUDES(s.mu);
  void release(RuntimeState& s, JobState& job) EXCLUDES(s.mu);
  pfResult_t reset_cursor(RuntimeState& s, JobState& job) EXCLUDES(s.mu);
  pfResult_t attach(RuntimeState& s, const std::shared_ptr<JobState>& job) EXCLUDES(s.mu);

  Device& device_;
  const FillResources& resources_;
  WarmUp warm_up_;
};

// Ends a job (completed, failed, cancelled) unless it already ended; its teardown comes due once
// no slice of it is in flight.
void end_job(RuntimeState& s, JobState& job, pfJobStatus_t status, pfResult_t error,
             std::string message) REQUIRES(s.mu);
// Teardown frees what the job's kernels use: it comes due (is queued for
// run_pending_teardowns) only once the job ended and none of its slices is in flight.
void maybe_teardown(RuntimeState& s, JobState& job) REQUIRES(s.mu);
// Items neither completed nor planned in a slice in flight.
uint64_t remaining_items(const JobState& job);

}  // namespace pipefill::core
