// The executor's half of the inline launch mode (inline_fill.hpp; docs/architecture.md, "Launch
// modes"): pfBubbleBegin makes the bubble's record and enqueues its slices from the prepared
// plan, on the caller's thread, without ever waiting for the executor's state lock; pfBubbleEnd
// enqueues the slices' tails after the gate write.
#include <chrono>
#include <exception>
#include <string>

#include "common/log.hpp"
#include "core/executor.hpp"

namespace pipefill::core {

bool Executor::lock_for_inline_begin(RuntimeState& s, uint64_t bubble_id) {
  // The simulator waits: its runs must not depend on thread timing (its executor runs only in
  // the world's hook anyway, so the lock is only ever briefly taken by the completion poller).
  if (device_.driven_clock() != nullptr) {
    s.mu.lock();
    return true;
  }
  if (s.mu.try_lock()) return true;
  const auto give_up = std::chrono::steady_clock::now() + kInlineLockPatience;
  while (std::chrono::steady_clock::now() < give_up) {
    if (s.mu.try_lock()) return true;
  }
  if (s.inline_deferred.fetch_add(1, std::memory_order_relaxed) == 0) {
    log::info("inline launch: bubble {} was left to the executor (it held the state lock longer "
              "than {} ns); pfBubbleBegin never waits for the executor",
              bubble_id, kInlineLockPatience.count());
  }
  return false;
}

bool Executor::begin_bubble(const BubbleMessage& m, SliceTails* tails) {
  RuntimeState& s = state_;
  tails->bubble_id = m.bubble_id;
  tails->count = 0;
  // The trainer's thread never waits for the executor: while the executor harvests or re-plans
  // (it holds the state lock), the bubble goes to the executor, as in the executor launch mode
  // (its slices may then start late: the late-slice backoff, late_slices.hpp, covers a run of it).
  if (!lock_for_inline_begin(s, m.bubble_id)) return false;
  const bool handled = begin_bubble_locked(s, m, tails);
  s.mu.unlock();
  return handled;
}

bool Executor::begin_bubble_locked(RuntimeState& s, const BubbleMessage& m, SliceTails* tails) {
  try {
    // On a driven clock (the simulator) harvest what completed and plan from it, as the executor
    // would when handling the begin: same-seed runs stay identical. Elsewhere the plan the
    // executor prepared after its last harvest is used as it is (a stale one is re-checked
    // against the jobs when enqueued), keeping pfBubbleBegin's host cost small.
    if (device_.driven_clock() != nullptr) {
      harvest(s);
      refresh_plans(s);
    }
    BubbleRecord& bubble = open_bubble_record(s, m);
    if (!bubble.tracked || left_unfilled_by_kind(bubble)) return true;
    for (const PreparedPlan& prepared : s.prepared_plans) {
      if (prepared.class_key != bubble.class_key) continue;
      bubble.predicted_us = prepared.gated_predicted_us;
      bubble.skip_reason = prepared.plan.skip_reason;
      bubble.skip_cause = prepared.plan.skip_cause;
      FillRequest request;
      request.gated_predicted_us = prepared.gated_predicted_us;
      request.ungated_predicted_us = prepared.ungated_predicted_us;
      request.margin_us = class_margin(s, bubble.class_key);
      launcher_.fill_packed(s, bubble, request, prepared.plan, /*observed=*/false, tails);
      return true;
    }
    // No measured history yet (a hint, or nothing): plan here.
    std::string why;
    const FillRequest request = request_for(s, bubble.class_key, m.expected_us, &why);
    bubble.predicted_us = request.gated_predicted_us;
    if (bubble.predicted_us <= 0) {
      bubble.skip_reason = why;
      bubble.skip_cause = pfSkipNoHistory;
      return true;
    }
    const BubblePlan packed = launcher_.plan(s, request, /*observed=*/nullptr);
    bubble.skip_reason = packed.skip_reason;
    bubble.skip_cause = packed.skip_cause;
    launcher_.fill_packed(s, bubble, request, packed, /*observed=*/false, tails);
  } catch (const std::exception& e) {
    record_async_error(s, pfErrorInternal, fmt::format("inline launch: {}", e.what()));
  } catch (...) {
    record_async_error(s, pfErrorInternal, "inline launch: unknown exception");
  }
  return true;
}

void Executor::end_bubble(SliceTails* tails) {
  if (tails->count == 0) return;
  const std::vector<FailedTail> failed = launcher_.enqueue_tails(*tails);
  tails->count = 0;
  if (failed.empty()) return;
  MutexLock lock(state_.mu);
  for (const FailedTail& f : failed) quarantine_slice(state_, tails->bubble_id, f.slot, f.why);
}

}  // namespace pipefill::core
