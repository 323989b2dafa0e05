// The harvester: what a completed bubble and its slices mean for the statistics and the jobs.
// A pure function of the event times and the cursor read-backs, so its rules are tested with
// hand-computed cases (tests/core/harvester_test.cpp). The executor (executor.cpp) queries the
// events, calls it, and applies the result.
//
// Rules:
//  - duration = end - begin (floored at 0);
//  - ticket slices: items completed = min(read-back cursor, item count) - exact, because a
//    claimed item always finishes before its slice's end event; opaque slices: the planned items;
//  - a ticket slice that completed no item had no block running one (its blocks found the gate
//    closed or the budget spent): it counts neither as filled time nor as overrun, even when its
//    completion event is long after the bubble end;
//  - otherwise a slice's filled time = overlap of its [start, end] with the bubble, its filled
//    SM·µs = that overlap x the SMs it was granted, overrun = how far it ended past the bubble
//    end, busy time = its length;
//  - a bubble's filled time is the time at least one slice filled (the union of the slices'
//    overlaps: concurrent slices on several fill streams do not count twice); its filled SM·µs
//    the sum over its slices;
//  - a slice that started at or after the bubble's end is late (enqueued after the bubble ended,
//    or a zero-length bubble): a ticket slice then runs no item (the gate is closed), and so is
//    neither fill nor overrun by the rule above;
//  - the bubble's edges (issue 33 item 7): its fill start delay = the earliest start of a slice
//    that ran work, minus the bubble's begin (floored at 0; none when no slice ran work), and its
//    slices past the end = the slices that ran work and ended after the bubble's end (still
//    resident when the main stream passed it; their drain is their overrun).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pipefill/pipefill.h"

namespace pipefill::core {

struct SliceObservation {
  pfJobKind_t kind = pfJobTicket;
  double start_us = 0.0, end_us = 0.0;  // the slice's start/end events
  uint64_t cursor_readback = 0;         // ticket: the job's cursor read back after the slice
  uint64_t planned_items = 0;
  uint64_t items_completed_before = 0;  // the job's completed items before this slice
  uint64_t item_count = 0;              // the job's total
  int sms = 0;                          // SMs granted to the slice (its max_blocks)
};

struct SliceAccounting {
  uint64_t items_done = 0;               // newly completed by this slice
  uint64_t items_completed_after = 0;    // the job's completed items after it
  bool ran_work = false;                 // counts as fill work (filled/overrun/busy)
  bool late = false;                     // started at or after the bubble's end
  double filled_us = 0.0;
  double filled_sm_us = 0.0;             // filled_us x the slice's SMs
  double overrun_us = 0.0;               // > 0 when the slice ended after the bubble
  double busy_us = 0.0;
};

struct BubbleAccounting {
  double duration_us = 0.0;
  double filled_us = 0.0;                // union of the slices' overlaps with the bubble
  double filled_sm_us = 0.0;             // sum of the slices' filled SM·µs
  double overrun_us = 0.0;               // the largest slice overrun (0 when none)
  double fill_start_delay_us = -1.0;     // first working slice's start - begin (-1: none ran work)
  uint64_t slices_past_end = 0;          // working slices that ended after the bubble
  std::vector<SliceAccounting> slices;   // one per observation, same order
};

SliceAccounting account_slice(double begin_us, double end_us, const SliceObservation& slice);
BubbleAccounting account_bubble(double begin_us, double end_us,
                                std::span<const SliceObservation> slices);

}  // namespace pipefill::core
