#include "core/late_slices.hpp"

#include <algorithm>
#include <string>

#include "common/log.hpp"

namespace pipefill::core {

// A gated slice's lateness (harvest). Slices that keep starting after their bubble ended run no
// item and take a slice of every bubble - through no fault of the job (the trainer's bubbles are
// shorter than the executor's reaction or mis-hinted, or the fill stream shares a hardware
// queue). After kMaxLateSlicesWithoutProgress in a row the job backs off instead of failing: it is
// held out of bubbles predicted no longer than those that were late (held_out_by_late_slices),
// retried now and then with an exponential backoff, and resumes once a slice completes an item.
// Returns true when a hold began (or was extended by a late retry).
bool note_late_slices(RuntimeState& s, JobState& job, bool late, uint64_t items_done,
                      bool enqueued_after_end, pfLaunchMode_t launch_mode, double start_delay_us,
                      const BubbleRecord& bubble) REQUIRES(s.mu) {
  if (items_done > 0 || !late) {
    job.late_slices_without_progress = 0;
    job.late_slices_enqueued_after_end = 0;
    if (job.late_hold_us > 0 && items_done > 0) {
      log::info("job '{}' resumes: a slice completed {} item(s) in bubble {} ({}); the hold after "
                "late slices is lifted",
                job.name, items_done, bubble.id, bubble.class_key);
      job.late_hold_us = 0.0;
      job.late_hold_skipped = 0;
      job.late_hold_retry_after = 0;
    }
    return false;
  }
  ++job.late_slices_without_progress;
  if (enqueued_after_end) ++job.late_slices_enqueued_after_end;
  // What the bubbles were that the slices could not reach: the hold covers bubbles predicted up
  // to the longest of them (and of the delays the slices started with).
  const double reach_us = std::max(start_delay_us, bubble.predicted_us);
  if (job.late_hold_us > 0) {
    // A retry (or a slice planned into a longer bubble) was late too: back off further.
    job.late_hold_us = std::max(job.late_hold_us, reach_us);
    job.late_hold_skipped = 0;
    job.late_hold_retry_after = std::min(kMaxLateHoldRetryAfter, 2 * job.late_hold_retry_after);
    return true;
  }
  if (job.late_slices_without_progress < kMaxLateSlicesWithoutProgress || is_terminal(job.status))
    return false;
  const uint32_t late_count = job.late_slices_without_progress;
  const uint32_t by_executor = job.late_slices_enqueued_after_end;
  std::string cause;
  if (by_executor == late_count) {
    cause = "the executor enqueued every one of them only after its bubble had ended (the "
            "bubbles are shorter than the executor's reaction time, or their hints "
            "(expected_duration_us) promise more than they last; launch mode inline enqueues "
            "slices in pfBubbleBegin)";
  } else if (launch_mode == pfLaunchInline) {
    cause = "the fill stream reached them only after the main stream had closed the gate, although "
            "they were enqueued in pfBubbleBegin (other work queued ahead of them on the fill "
            "stream, or a hardware queue the fill stream shares)";
  } else {
    cause = "the fill stream reached them only after the main stream had closed the gate: fill "
            "and main work share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) or the fill "
            "stream is held behind other work; launch mode inline (PIPEFILL_LAUNCH=inline) "
            "enqueues slices before the main stream's wait";
  }
  job.late_hold_us = reach_us;
  job.late_hold_skipped = 0;
  job.late_hold_retry_after = kFirstLateHoldRetryAfter;
  job.late_slices_without_progress = 0;
  job.late_slices_enqueued_after_end = 0;
  ++job.late_holds;
  const std::string message = fmt::format(
      "job '{}': {} slices in a row started after their bubble had ended and ran no item ({} "
      "enqueued after the end): {}. The job is not failed: it is held out of bubbles predicted "
      "at {:.1f} us or less (the last was bubble {}, class {}, predicted {:.1f} us, its slice "
      "started {:.1f} us after the begin), retried after {} such bubbles (doubling), and resumes "
      "once a slice completes an item",
      job.name, late_count, by_executor, cause, job.late_hold_us, bubble.id, bubble.class_key,
      bubble.predicted_us, start_delay_us, job.late_hold_retry_after);
  if (job.late_holds == 1) {
    log::warn("{}", message);
  } else {
    log::info("{}", message);
  }
  return true;
}

}  // namespace pipefill::core
