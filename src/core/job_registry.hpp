// The job registry: the life of a fill job from pfJobCreate to pfJobDestroy. Validation of the
// description, the device-word slot and the arena share, setup, status, cancel, wait, the end of
// a job and its teardown. Planning and harvesting a job's slices are the slice launcher's and the
// executor's; they end jobs through end_job() below.
#pragma once

#include "core/config.hpp"
#include "core/fill_resources.hpp"
#include "core/runtime_state.hpp"
#include "device/device.hpp"

namespace pipefill::core {

class JobRegistry {
 public:
  JobRegistry(const RuntimeOptions& options, Device& device, const FillResources& resources)
      : options_(options), device_(device), resources_(resources) {}

  // Validates `desc`, reserves a slot and the resident share, runs setup; on success the job is
  // attached (visible to the executor) and *out points at it. A failure changes nothing.
  pfResult_t create(RuntimeState& s, Runtime* owner, const pfJobDesc_t* desc, JobState** out)
      EXCLUDES(s.mu);
  pfResult_t info(RuntimeState& s, JobState& job, pfJobInfo_t* out) EXCLUDES(s.mu);
  pfResult_t cancel(RuntimeState& s, JobState& job) EXCLUDES(s.mu);
  pfResult_t wait(RuntimeState& s, JobState& job, double timeout_us) EXCLUDES(s.mu);
  // pfJobDestroy, first half: cancels the job; true when slices of it are still in flight (the
  // caller then drains the executor and the fill stream, and harvests).
  bool begin_destroy(RuntimeState& s, JobState& job) EXCLUDES(s.mu);
  // Second half, after the harvest: tears down, returns the arena share and the slot, detaches.
  void finish_destroy(RuntimeState& s, JobState& job) REQUIRES(s.mu);
  // "'a', 'b'" for messages; empty when no job is attached.
  static std::string attached_names(const RuntimeState& s) REQUIRES(s.mu);

 private:
  const RuntimeOptions& options_;
  Device& device_;
  const FillResources& resources_;
};

// Ends a job (completed, failed, cancelled) unless it already ended; tears it down once no
// slice of it is in flight.
void end_job(RuntimeState& s, JobState& job, pfJobStatus_t status, pfResult_t error,
             std::string message) REQUIRES(s.mu);
// Teardown frees what the job's kernels use: only once none of its slices is in flight.
void maybe_teardown(RuntimeState& s, JobState& job) REQUIRES(s.mu);
// Items neither completed nor planned in a slice in flight.
uint64_t remaining_items(const JobState& job);

}  // namespace pipefill::core
