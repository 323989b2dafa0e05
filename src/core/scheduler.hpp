// Fill-job scheduling policies: which job gets the next bubble (or the rest of one).
// Shared by the runtime and the cluster simulator.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pipefill/pipefill.h"

namespace pipefill {

struct JobSchedView {
  uint64_t sequence = 0;          // creation order (FIFO key, final tie-breaker)
  int priority = 0;               // larger first under pfPolicyPriority
  double remaining_work_us = 0.0; // remaining items x item cost (per worker, / parallelism)
  double received_bubble_us = 0.0;// bubble time given so far (fair share)
  bool runnable = true;           // false: completed/failed/cancelled/does not fit
};

// Indices of the runnable jobs in the order the policy serves them. Ties always fall back to
// `sequence` so the order is deterministic.
std::vector<size_t> schedule_order(pfSchedulePolicy_t policy, std::span<const JobSchedView> jobs);

const char* policy_name(pfSchedulePolicy_t policy);
// "fifo", "priority", "srpt"/"shortest-remaining", "fair"/"fair-share"; false when unknown.
bool parse_policy(const char* text, pfSchedulePolicy_t* out);

}  // namespace pipefill
