// The state the executor side of a runtime shares: bubbles begun but not yet harvested, the
// attached jobs, the arena, statistics and trace records. All of it is guarded by one mutex,
// RuntimeState::mu (the runtime's *state lock*). The stages of a bubble's journey (executor.cpp,
// slice_launcher.cpp, the harvest in executor.cpp, job_registry.cpp) are functions that take a
// RuntimeState& and declare REQUIRES(s.mu) or EXCLUDES(s.mu), so clang's -Wthread-safety checks
// every access (docs/architecture.md, "Lock order and thread affinity").
#pragma once

#include <array>
#include <atomic>
#include <bitset>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "analysis/activity.hpp"
#include "common/mutex.hpp"
#include "core/arena.hpp"
#include "core/fill_resources.hpp"
#include "core/job_state.hpp"
#include "core/planner.hpp"
#include "core/predictor.hpp"
#include "core/trace_writer.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::core {

// One fill slice launched on the fill stream and not yet harvested.
struct SliceRecord {
  std::shared_ptr<JobState> job;
  size_t event_slot = 0;        // index into the slice event pools / host read-back words
  uint64_t planned_items = 0;
  uint64_t first_item = 0;
  int config_index = 0;
  double granted_us = 0.0;
  uintptr_t workspace = 0;      // arena block to release at harvest (0: none)
  uint64_t sequence = 0;        // enqueue order (over all fill streams)
  int stream = 0;               // index into FillResources::fill_streams
  int sms = 0;                  // SMs granted (the slice's max_blocks)
  int workers = 0;              // items in flight planned (the cost sample's rounds divide by it)
  bool probe = false;           // a one-item probe (cost_model.hpp)
  bool launch_failed = false;   // the callback failed: tracked only so its resources wait
  // The bubble's end event had completed when the launch callback returned: the gate was closed
  // before the slice's kernel was queued, so it ran nothing through no fault of the job (the
  // slice's start event, recorded before the callback, can still lie inside the bubble).
  bool enqueued_after_end = false;
};

// One slice of a bubble's plan: which job, how much, on which fill stream.
struct PackedSlice {
  std::shared_ptr<JobState> job;
  SlicePlan plan;
  int stream = 0;
  // Opaque slices: the usable time from the bubble's begin they were planned against. Nothing
  // stops opaque work, so the launcher re-checks the time left right before the launch (the
  // launches before it may have taken long: the bubble may have ended meanwhile).
  double opaque_budget_us = 0.0;
};

// A bubble's slices packed by time x SMs x memory, in policy order (slice_launcher.cpp).
struct BubblePlan {
  std::vector<PackedSlice> slices;
  std::string skip_reason;  // why a job got nothing (the first reason), for traces and logs
  pfSkipCause_t skip_cause = pfSkipNoJob;  // skip_reason's category (none given: no runnable job)
  // Job slots whose estimated item did not fit this bubble's budget (cost_model.hpp's streak),
  // and that budget for gated work (the usable time less the first slice's launch overhead).
  std::bitset<kMaxJobs> too_short_slots;
  double gated_budget_us = 0.0;
};

// Inline launch mode: the plan of a bubble class prepared by the executor after a harvest, so
// pfBubbleBegin only checks and enqueues it (docs/architecture.md, "Launch modes").
struct PreparedPlan {
  std::string class_key;
  bool indexed = false;      // the key is "#<index>" (no label)
  uint64_t index = 0;
  double gated_predicted_us = 0.0;    // gated_prediction_quantile of the class's history
  double ungated_predicted_us = 0.0;  // prediction_quantile of it (opaque work)
  BubblePlan plan;
};

// A slice whose launch callback ran but whose read-back or end event could not be enqueued: its
// kernel is queued, so its slot, workspace and the job's share stay taken until the fill stream
// is known to have passed it (a later slice's end event completed, or the stream was drained).
struct QuarantinedSlice {
  SliceRecord slice;
  uint64_t bubble_id = 0;
};

// One bubble class's counters (pfClassStats_t), accumulated at harvest.
struct ClassCounters {
  std::string key;
  int kind = pfBubbleOther;  // of the class's last bubble
  uint64_t bubbles = 0;
  uint64_t bubbles_filled = 0;
  uint64_t bubbles_timed = 0;
  double bubble_time_us = 0.0;
  double filled_time_us = 0.0;
  uint64_t items_completed = 0;
  std::array<uint64_t, PF_SKIP_CAUSE_COUNT> skips{};
  uint64_t late_backoffs = 0;  // jobs held out of the class after late slices (executor.cpp)
};

// pfRuntimeSetSliceObserver's observer, and what one of its calls passes (slice_launcher.cpp).
struct SliceObserver {
  pfSliceObserverFn fn = nullptr;
  void* user = nullptr;
};
// One observer call queued on a fill stream: filled under the state lock when the slice is
// launched, read by the fill stream's thread when the call runs. Two per slice slot (start, end)
// made at creation, so a launch allocates nothing; a slot is reused only after its slice was
// harvested, which waits for the end call (it runs before the slice's end event).
struct SliceObserverCall {
  SliceObserver observer;
  pfSliceEvent_t event{};
  std::shared_ptr<JobState> job;  // keeps job_name valid (the slice record keeps it too)
};

// A bubble whose Begin message the executor handled, until it is harvested.
struct BubbleRecord {
  uint64_t id = 0;
  uint64_t iteration = 0;
  uint64_t index_in_iteration = 0;
  std::string class_key;
  int kind = pfBubbleOther;
  bool tracked = false;          // its begin/end events were recorded (an event pair was free)
  bool ended = false;            // its End message was handled
  bool abandoned = false;        // its stream died before the end: no end event, not timed
  double predicted_us = 0.0;     // prediction gated work was planned to (0: none)
  std::vector<SliceRecord> slices;
  std::string skip_reason;
  pfSkipCause_t skip_cause = pfSkipNoJob;  // skip_reason's category (none given: no runnable job)
  // The plans' too-short job slots and gated budget (BubblePlan), counted at harvest: once per
  // bubble, however many packing rounds or prepared plans were made for it.
  std::bitset<kMaxJobs> too_short_slots;
  double gated_budget_us = 0.0;
};

struct RuntimeState {
  mutable Mutex mu;
  // Signalled (with mu held or just released) whenever a job's status or a job's count of
  // callers in flight changes: pfJobWait and pfJobDestroy wait on it.
  CondVar job_changed;

  BubblePredictor predictor GUARDED_BY(mu);
  // pfRuntimeSetClassMargin: per class key, the margin that replaces safety_margin_us.
  std::unordered_map<std::string, double> class_margins GUARDED_BY(mu);
  // Classes whose last ended bubble was closed early by pfBubbleCloseFill.
  std::unordered_set<std::string> noticed_classes GUARDED_BY(mu);
  std::deque<BubbleRecord> pending GUARDED_BY(mu);  // in bubble order
  std::vector<size_t> free_slice_slots GUARDED_BY(mu);
  std::vector<QuarantinedSlice> quarantined GUARDED_BY(mu);
  uint64_t next_slice_sequence GUARDED_BY(mu) = 1;
  // Inline launch mode: per bubble class, rebuilt when dirty (a harvest, a job attached or
  // ended) by the executor; read by pfBubbleBegin.
  std::vector<PreparedPlan> prepared_plans GUARDED_BY(mu);
  bool plans_dirty GUARDED_BY(mu) = true;
  ArenaAllocator arena GUARDED_BY(mu);

  // Jobs (job_registry.cpp).
  std::vector<std::shared_ptr<JobState>> jobs GUARDED_BY(mu);  // attached, creation order
  std::vector<bool> job_slot_used GUARDED_BY(mu);
  uint64_t next_job_sequence GUARDED_BY(mu) = 0;
  // Jobs whose teardown is due, run outside the lock by run_pending_teardowns().
  std::vector<std::shared_ptr<JobState>> teardowns GUARDED_BY(mu);
  std::atomic<bool> teardowns_pending{false};
  // Inline launch mode: bubbles pfBubbleBegin left to the executor rather than wait for the lock.
  std::atomic<uint64_t> inline_deferred{0};

  // Statistics and trace (harvest).
  pfStats_t stats GUARDED_BY(mu){};
  std::array<uint64_t, PF_SKIP_CAUSE_COUNT> skip_counts GUARDED_BY(mu){};  // by pfSkipCause_t
  std::vector<ClassCounters> classes GUARDED_BY(mu);  // in order of their first harvest
  std::unordered_map<std::string, size_t> class_index GUARDED_BY(mu);  // key -> classes[i]
  TraceRecords trace GUARDED_BY(mu);
  SliceObserver slice_observer GUARDED_BY(mu);
  // [2 * slot]: the start call of the slice in that slot, [2 * slot + 1]: its end call. Sized
  // at creation; each entry is written under the lock at launch and read on the fill stream.
  std::vector<SliceObserverCall> observer_calls;
  uint64_t calibration_iteration GUARDED_BY(mu) = 0;
  bool calibration_available GUARDED_BY(mu) = true;

  // First asynchronous error; the code is readable without the lock.
  std::atomic<pfResult_t> async_error{pfSuccess};
  std::string async_message GUARDED_BY(mu);

  // Every bubble id <= this is harvested (read by the user thread to reuse event pairs).
  std::atomic<uint64_t> harvested_upto{0};
  // The user thread recorded the end event of every bubble id <= this (so the executor may query
  // it for bubbles it handles late).
  std::atomic<uint64_t> ended_upto{0};
};

// Records the first asynchronous error of the runtime (later ones are only logged).
void record_async_error(RuntimeState& s, pfResult_t code, const std::string& message)
    REQUIRES(s.mu);

}  // namespace pipefill::core
