// The late-slice backoff: what the harvest does with a gated slice that started only after its
// bubble had ended (it ran no item through no fault of the job). After
// kMaxLateSlicesWithoutProgress such slices in a row the job is held out of bubbles like those
// (job_state.hpp, held_out_by_late_slices), retried with an exponential backoff and resumed once a
// slice completes an item - never failed for it (docs/api.md, "Late slices").
#pragma once

#include "core/runtime_state.hpp"

namespace pipefill::core {

// Called by the harvest for each timed gated slice of a job that is not detached. `late`: the
// slice started after its bubble ended (or was enqueued after it); `start_delay_us`: its start
// relative to the bubble's begin. Returns true when a hold began or was extended.
bool note_late_slices(RuntimeState& s, JobState& job, bool late, uint64_t items_done,
                      bool enqueued_after_end, pfLaunchMode_t launch_mode, double start_delay_us,
                      const BubbleRecord& bubble) REQUIRES(s.mu);

}  // namespace pipefill::core
