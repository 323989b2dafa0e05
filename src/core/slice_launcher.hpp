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
// Thread affinity: the thread that handles messages (the executor thread, or the thread running
// the simulated world), with the state lock held; launch callbacks run there.
#pragma once

#include <memory>

#include "core/config.hpp"
#include "core/fill_resources.hpp"
#include "core/message_ring.hpp"
#include "core/runtime_state.hpp"
#include "device/device.hpp"

namespace pipefill::core {

class SliceLauncher {
 public:
  SliceLauncher(const RuntimeOptions& options, Device& device, const FillResources& resources)
      : options_(options), device_(device), resources_(resources) {}

  // Plans and launches the slices of `bubble` (predicted `predicted_us`, hint in `begin`).
  void fill(RuntimeState& s, BubbleRecord& bubble, double predicted_us,
            const BubbleMessage& begin) REQUIRES(s.mu);

 private:
  bool launch(RuntimeState& s, BubbleRecord& bubble, const std::shared_ptr<JobState>& job,
              const SlicePlan& plan, void* workspace, uintptr_t workspace_block,
              size_t workspace_bytes) REQUIRES(s.mu);

  const RuntimeOptions& options_;
  Device& device_;
  const FillResources& resources_;
};

}  // namespace pipefill::core
