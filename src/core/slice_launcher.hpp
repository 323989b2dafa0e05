// The slice launcher: for a begun bubble, which jobs get which share of its predicted time, and
// the enqueueing of each slice on the fill stream:
//
//   write_word(budget_counter, 0)          -- the per-slice claim counter
//   stream_wait_event(begin_event[k])      -- never before the bubble starts
//   record slice_start
//   job.launch(slice{bubble_id = k, gate, cursor, budget_counter, max_items, ...})
//   copy_word_to_host(cursor -> host word of the slice)
//   record slice_end                       -- after the read-back: done => word valid
//
// Gated (ticket) work may be sized from the hint's expected duration: the gate stops it at the
// bubble end. Ungated (opaque) work only from measured history, and never once the bubble is
// seen to have ended; when the executor handles the begin late (the normal case on a GPU) it gets
// the prediction minus the time already gone since the begin event completed.
//
// Thread affinity: the thread that handles messages (the executor thread, or the thread running
// the simulated world), with the state lock held; launch callbacks run there.
#pragma once

#include <memory>

#include "core/config.hpp"
#include "core/fill_resources.hpp"
#include "core/runtime_state.hpp"
#include "device/device.hpp"

namespace pipefill::core {

struct FillRequest {
  double gated_predicted_us = 0.0;    // from history, else the hint (0: do not fill)
  double ungated_predicted_us = 0.0;  // from measured history only (0: no opaque work)
};

class SliceLauncher {
 public:
  SliceLauncher(const RuntimeOptions& options, Device& device, const FillResources& resources)
      : options_(options), device_(device), resources_(resources) {}

  void fill(RuntimeState& s, BubbleRecord& bubble, const FillRequest& request) REQUIRES(s.mu);

 private:
  enum class Launched { No, Yes, Untracked };
  // How the bubble looks to the executor right now (queried, never waited for).
  struct Observed {
    bool ended = false;     // its end event completed
    double elapsed_us = 0;  // since its begin event completed (0 when it has not)
  };
  // `elapsed`: also the time since the begin event (one more query).
  Observed observe(const RuntimeState& s, const BubbleRecord& bubble, bool elapsed);
  Launched launch(RuntimeState& s, BubbleRecord& bubble, const std::shared_ptr<JobState>& job,
                  const SlicePlan& plan, uintptr_t workspace_block) REQUIRES(s.mu);

  const RuntimeOptions& options_;
  Device& device_;
  const FillResources& resources_;
};

}  // namespace pipefill::core
