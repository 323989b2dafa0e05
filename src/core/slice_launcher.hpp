// The slice launcher: which jobs get which part of a begun bubble, and the enqueueing of each
// slice on its fill stream.
//
// Concurrent fill: a bubble is budgeted in SM·µs - the partition's fill SMs for its usable time.
// The jobs, in the policy's order, are packed into it by time x SMs x memory: each job's slice
// gets SMs <= its parallelism (and <= the SMs still free), a duration <= the usable time, and
// workspace from the arena; at most one slice per fill stream, so up to `fill_streams` jobs run
// side by side (a parallelism-1 training job no longer holds the whole bubble on one SM while
// the other fill SMs idle). The policy decides who is packed first, hence who gets SMs when
// there are not enough for everyone.
//
// Each slice on its fill stream:
//
//   stream_wait_event(end of the job's previous slice)   -- only when that one is unharvested
//                                                            and ran on another fill stream
//   write_word(budget_counter, 0)          -- the per-slice claim counter
//   stream_wait_event(begin_event[k])      -- never before the bubble starts
//   record slice_start
//   host function: observer start call     -- only with a slice observer (host backend)
//   launch_slice_work(...)                 -- the job's launch callback (the kind-specific part)
//   copy_word_to_host(cursor -> host word of the slice)     } the slice's tail: right after it
//   host function: observer end call       -- (observer only)  } (executor mode) or from
//   record slice_end                       -- done => word valid } pfBubbleEnd (inline mode)
//
// Gated (ticket) work may be sized from the hint's expected duration: the gate bounds it to one
// item past the bubble end. Ungated (opaque) work only from measured history, and never once the
// bubble is seen to have ended; when the executor handles the begin late it gets the prediction
// minus the time already gone since the begin event completed.
//
// Thread affinity: plan/enqueue/fill with the state lock held, on the pump's thread (executor
// mode) or the thread of pfBubbleBegin (inline mode); enqueue_tails on the thread of pfBubbleEnd
// without the lock; warm_up on the thread of pfJobCreate without the lock.
#pragma once

#include <memory>
#include <vector>

#include "core/config.hpp"
#include "core/fill_resources.hpp"
#include "core/inline_fill.hpp"
#include "core/runtime_state.hpp"
#include "device/device.hpp"

namespace pipefill::core {

struct FillRequest {
  double gated_predicted_us = 0.0;    // gated_prediction_quantile of the history, else the hint
                                      // (0: do not fill)
  double ungated_predicted_us = 0.0;  // prediction_quantile of the measured history only (0: no
                                      // opaque work)
  double margin_us = -1.0;  // the class's margin (pfRuntimeSetClassMargin); < 0: safety_margin_us
};

// A tail that could not be enqueued (inline mode): its slice is quarantined under the lock.
struct FailedTail {
  size_t slot = 0;
  std::string why;
};

class SliceLauncher {
 public:
  SliceLauncher(const RuntimeOptions& options, Device& device, const FillResources& resources)
      : options_(options), device_(device), resources_(resources) {}

  // Executor mode: skips a bubble already seen ended, plans it and enqueues every slice with
  // its tail.
  void fill(RuntimeState& s, BubbleRecord& bubble, const FillRequest& request) REQUIRES(s.mu);

  // Packs the bubble (no side effect on the jobs). `observed`: the bubble as the executor sees
  // it (a late begin: opaque work gets only the time left, none once it ended); nullptr when the
  // plan is made before the bubble began (inline mode, prepared plans).
  // What a bubble's earlier packing rounds took (fill_packed): SMs, streams, and the jobs tried.
  struct Packed {
    int sms_taken = 0;
    uint64_t streams_taken = 0;
    std::vector<const JobState*> jobs;
  };
  // so_far: pack only the SMs, streams and jobs earlier rounds left (nullptr: the whole bubble).
  BubblePlan plan(RuntimeState& s, const FillRequest& request, const BubbleRecord* observed,
                  const Packed* so_far = nullptr) REQUIRES(s.mu);

  // Enqueues the plan's slices for `bubble`, re-checking each against the jobs as they are now
  // (a prepared plan may be older than the last launch): ended jobs are skipped, items clamped
  // to what is left, workspace and a slice slot taken. tails == nullptr: each slice's tail right
  // after it; otherwise the tails are described in *tails for enqueue_tails.
  // Returns true when a planned slice did not go out (its SMs are free again); *done collects
  // what went out and every job tried.
  bool enqueue(RuntimeState& s, BubbleRecord& bubble, const BubblePlan& plan, SliceTails* tails,
               Packed* done) REQUIRES(s.mu);
  // Enqueues `first`, then re-packs what slices that did not go out left free, until every
  // planned slice went out or no job is left. observed: plan with the bubble as the executor
  // sees it (executor mode).
  void fill_packed(RuntimeState& s, BubbleRecord& bubble, const FillRequest& request,
                   const BubblePlan& first, bool observed, SliceTails* tails) REQUIRES(s.mu);

  // Inline mode, after the gate write: the read-back and end record of every slice in *tails.
  // Returns the ones that failed (their slices must be quarantined).
  std::vector<FailedTail> enqueue_tails(const SliceTails& tails);

  // pfJobCreate, after setup: the job's launch callback once per fill stream with an empty slice
  // (max_items = 0, bubble_id = 0: a ticket kernel exits without touching a word), then every
  // fill stream synchronized, so kernels and library handles are loaded before the first bubble.
  // A failure names the stream and what failed.
  pfResult_t warm_up(const JobState& job);

 private:
  // How the bubble looks to the executor right now (queried, never waited for).
  struct Observed {
    bool ended = false;     // its end event completed
    double elapsed_us = 0;  // since its begin event completed (0 when it has not)
  };
  // `elapsed`: also the time since the begin event (one more query).
  Observed observe(const RuntimeState& s, const BubbleRecord& bubble, bool elapsed);
  enum class Launched { No, Yes, Untracked };
  Launched launch(RuntimeState& s, BubbleRecord& bubble, const std::shared_ptr<JobState>& job,
                  const SlicePlan& plan, int stream, uintptr_t workspace_block, SliceTails* tails)
      REQUIRES(s.mu);
  // The kind-specific part of a slice: what runs on `stream` between the slice's start and its
  // tail. Today every kind calls the job's launch callback; returns the callback's result (an
  // int: a callback may return a value outside pfResult_t) and, on failure, why.
  int launch_slice_work(const JobState& job, const pfSliceDesc_t& slice, Stream stream,
                        std::string* why);
  // A slice's tail on its fill stream (launch in executor mode, enqueue_tails in inline mode):
  // the cursor read back into the slot's host word, the slice observer's end call if any, then
  // the slot's end event - so a completed end event means the word is valid and the call returned.
  pfResult_t enqueue_slice_end(Stream fill, const uint64_t* cursor, size_t slot,
                               void* observer_end_call);

  const RuntimeOptions& options_;
  Device& device_;
  const FillResources& resources_;
};

}  // namespace pipefill::core
