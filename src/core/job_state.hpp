// A fill job: the object behind pfJob_t. Created by the job registry (job_registry.cpp),
// planned by the slice launcher, updated by the harvest.
//
// The description part is written once in pfJobCreate and read-only afterwards. The progress
// part is guarded by the owning runtime's state lock (RuntimeState::mu); clang's analysis cannot
// see that alias through a job reference, so every function touching it declares
// REQUIRES(s.mu) on the RuntimeState it is given instead.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cost_model.hpp"
#include "core/handles.hpp"
#include "core/planner.hpp"
#include "device/device.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::core {

class Runtime;

struct JobState {
  JobState() = default;
  JobState(const JobState&) = delete;
  JobState& operator=(const JobState&) = delete;
  ~JobState() { magic = 0; }

  uint64_t magic = kJobMagic;          // checked on every call through the handle
  pfJob_t handle = nullptr;            // the C handle (core/handles.hpp), set before attaching

  // ---- Description (immutable after creation) ----------------------------------------------
  Runtime* runtime = nullptr;
  uint64_t sequence = 0;
  std::string name;
  pfJobKind_t kind = pfJobTicket;
  int priority = 0;
  uint64_t item_count = 0;
  std::vector<JobConfigModel> configs;
  void* user = nullptr;
  pfResult_t (*setup)(void*, const pfArenaAllocator_t*, int) = nullptr;
  pfResult_t (*launch)(void*, const pfSliceDesc_t*, void*) = nullptr;
  void (*teardown)(void*) = nullptr;

  int setup_config = -1;
  size_t resident_reserved = 0;        // bytes reserved in the arena for setup
  uintptr_t resident_block = 0;        // arena block holding them (0: none)
  size_t resident_used = 0;            // bytes setup has sub-allocated so far
  int slot = -1;                       // index of the job's device words
  uint64_t* cursor = nullptr;          // device word: next unclaimed item
  uint64_t* budget_counter = nullptr;  // device word: claims of the current slice
  // Graph jobs (pfJobGraph): what the device prepared at creation, launched per slice instead of
  // a launch callback (core/graph_job.hpp); released by the teardown, after the last slice.
  std::unique_ptr<GraphItems> graph_items;

  // ---- Progress (guarded by the runtime's state lock) --------------------------------------
  pfJobStatus_t status = pfJobPending;
  pfResult_t error = pfSuccess;
  std::string error_message;
  uint64_t items_completed = 0;
  // What the planner is given: `configs` with each item_cost_us replaced by the learned estimate
  // (cost_model.hpp) once its configuration has a measured sample. Made at attach, same size as
  // `configs`; only item_cost_us changes afterwards (at harvest), so planning allocates nothing.
  std::vector<JobConfigModel> planned_configs;
  JobCostModel cost;
  // Streaming jobs (pfJobSetAvailable): items >= available are not claimed yet (UINT64_MAX: no
  // bound). pfJobEndInput lowers item_count to it, so item_count changes under the lock too.
  uint64_t available = UINT64_MAX;
  uint64_t items_in_flight = 0;        // planned in slices not yet harvested
  uint64_t next_opaque_item = 0;
  uint64_t slices_launched = 0;
  uint64_t slices_in_flight = 0;
  double bubble_time_us = 0.0;
  double granted_sm_us = 0.0;          // sum of planned time x SMs of its slices (fair share)
  double busy_time_us = 0.0;
  // The fill stream and slice slot of its latest slice while that slice is unharvested (a
  // slice on another stream first waits for its end: one slice of a job runs at a time, so the
  // cursor read-back after a slice counts only that slice's claims). -1 / SIZE_MAX: none.
  int last_stream = -1;
  size_t last_slice_slot = SIZE_MAX;
  int last_config = -1;
  // Ticket slices in a row that ran while their bubble was open and completed no item: a launch
  // callback that enqueues nothing. The job fails when this reaches kMaxSlicesWithoutProgress.
  uint32_t slices_without_progress = 0;
  // Gated slices in a row that started only after their bubble had ended (the gate was closed,
  // so they ran no item) - e.g. the fill stream reached them behind the main stream's work on one
  // hardware queue. The job fails when this reaches kMaxLateSlicesWithoutProgress instead of
  // taking a slice of every bubble forever without progress. Reset by any slice completing an item.
  uint32_t late_slices_without_progress = 0;
  uint32_t late_slices_enqueued_after_end = 0;  // of those, enqueued after the bubble had ended
  // Backoff after kMaxLateSlicesWithoutProgress late slices in a row (executor.cpp): the job is
  // not planned into bubbles predicted no longer than late_hold_us (the longest start delay and
  // prediction of its late slices' bubbles) - except one retry after late_hold_retry_after such
  // bubbles, which doubles on every late retry (at most kMaxLateHoldRetryAfter). A slice that
  // completes an item ends the hold. 0: not held.
  double late_hold_us = 0.0;
  uint32_t late_hold_skipped = 0;       // bubbles it was held out of since the hold or last retry
  uint32_t late_hold_retry_after = 0;
  uint64_t late_holds = 0;              // holds of the job's life (the first one is warned)
  bool torn_down = false;              // teardown taken (queued or run): it runs exactly once
  // pfJobCancel from the job's own launch callback, which runs with the state lock held: the
  // request is only noted here (no lock), and the launcher ends the job Cancelled once the
  // callback returned (slice_launcher.cpp). Atomic: written without the lock.
  std::atomic<bool> cancel_requested{false};
  bool detached = false;               // pfJobDestroy ran: harvest only updates stats
};

inline constexpr uint32_t kMaxSlicesWithoutProgress = 8;
// Larger than kMaxSlicesWithoutProgress: an occasional late slice (a bubble shorter than the
// executor's reaction, a late begin) is normal; a run of this many with no item in between is not.
inline constexpr uint32_t kMaxLateSlicesWithoutProgress = 16;
// Held bubbles between two retries of a job held out by late slices: from 16, doubling, at most.
inline constexpr uint32_t kFirstLateHoldRetryAfter = 16;
inline constexpr uint32_t kMaxLateHoldRetryAfter = 1024;

// Whether the planner leaves `job` out of a bubble predicted at `predicted_us` because its slices
// kept starting after their bubbles had ended (the late-slice backoff above). Read under the
// state lock.
inline bool held_out_by_late_slices(const JobState& job, double predicted_us) {
  return job.late_hold_us > 0 && predicted_us <= job.late_hold_us &&
         job.late_hold_skipped < job.late_hold_retry_after;
}

// Ticket and graph jobs are gated and report their progress through the cursor; opaque jobs are
// neither (their planned items count as done).
inline bool is_gated(pfJobKind_t kind) { return kind != pfJobOpaque; }

// The configuration a job runs with now: its latest slice's, else the one chosen at setup (0
// when neither is known yet). Read under the state lock, like last_config.
inline int current_config(const JobState& job) {
  return std::max(0, job.last_config >= 0 ? job.last_config : job.setup_config);
}

inline bool is_terminal(pfJobStatus_t s) {
  return s == pfJobCompleted || s == pfJobFailed || s == pfJobCancelled;
}

}  // namespace pipefill::core
