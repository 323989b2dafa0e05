#include "core/bubble_tracker.hpp"

#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"

namespace pipefill::core {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

pfResult_t BubbleTracker::refuse_null_stream(void* stream, const char* call) const {
  // NULL is CUDA's legacy default stream, a valid main stream there; the simulated and host
  // devices have none (the message names the backend: it used to say "simulated" for both).
  if (stream != nullptr || options_.backend == pfBackendCuda) return pfSuccess;
  return fail(pfErrorInvalidArgument,
              "{}: stream is NULL (the {} backend has no default stream; pass a stream of this "
              "runtime, e.g. pfStreamCreateHighPriority)",
              call, backend_name(options_.backend));
}

pfResult_t BubbleTracker::begin(void* stream, const pfBubbleHint_t* hint) {
  MutexLock lock(calls_mu_);
  return begin_locked(stream, hint);
}

pfResult_t BubbleTracker::end(void* stream) {
  MutexLock lock(calls_mu_);
  return end_locked(stream);
}

pfResult_t BubbleTracker::begin_locked(void* stream, const pfBubbleHint_t* hint) {
  // The clock read costs as much as the rest of the call on some machines (no vDSO TSC), so
  // only one pair in kTimingSample is timed; the mean is over the sampled pairs.
  const bool timed = (timing_counter_++ % kTimingSample) == 0;
  const auto t0 = timed ? Clock::now() : Clock::time_point{};
  PF_TRY(refuse_null_stream(stream, "pfBubbleBegin"));
  if (in_bubble()) {
    // One open bubble per runtime (docs/api.md, "Threads"): whichever thread or stream asks.
    const bool same_thread =
        bubble_thread_.load(std::memory_order_acquire) == std::this_thread::get_id();
    return fail(pfErrorInvalidState,
                "pfBubbleBegin on stream {}: bubble {} is still open on stream {} ({}); a runtime "
                "has one open bubble at a time (call pfBubbleEnd on stream {} first, or give "
                "each stage its own runtime)",
                stream, next_bubble_id_ - 1, open_bubble_stream(),
                same_thread ? "begun on this thread: nested bubbles are not allowed"
                            : "begun on another thread",
                open_bubble_stream());
  }
  BubbleMessage m;
  m.type = BubbleMessage::Type::Begin;
  if (hint != nullptr) {
    if (hint->kind < 0 || hint->kind >= pfBubbleKindCount) {
      return fail(pfErrorInvalidArgument, "pfBubbleBegin: hint->kind = {} is not a pfBubbleKind_t",
                  hint->kind);
    }
    if (!std::isfinite(hint->expected_duration_us)) {
      return fail(pfErrorInvalidArgument,
                  "pfBubbleBegin: hint->expected_duration_us = {} is not finite",
                  hint->expected_duration_us);
    }
    if (hint->lent_bytes > 0 && hint->lent_memory == nullptr) {
      return fail(pfErrorInvalidArgument,
                  "pfBubbleBegin: hint->lent_bytes = {} but hint->lent_memory is NULL",
                  hint->lent_bytes);
    }
    if (hint->label != nullptr) {
      const size_t length = std::strlen(hint->label);
      if (length >= sizeof(m.label)) {
        return fail(pfErrorInvalidArgument,
                    "pfBubbleBegin: hint->label '{}' is {} characters (at most {})", hint->label,
                    length, sizeof(m.label) - 1);
      }
      std::memcpy(m.label, hint->label, length + 1);
    }
    m.kind = hint->kind;
    m.expected_us = hint->expected_duration_us;
    if (hint->lent_bytes > 0 && !lent_memory_warned_) {
      lent_memory_warned_ = true;
      log::warn("pfBubbleBegin: hint->lent_memory is ignored: fill work could still write it "
                "after pfBubbleEnd (there is no stream-ordered release); workspace comes from "
                "the fill arena");
    }
  }
  if (!device_.is_valid_main_stream(stream)) {
    return fail(pfErrorInvalidArgument,
                "pfBubbleBegin: stream {} is not a main-job stream of this runtime's device",
                stream);
  }
  if (device_.is_capturing(stream)) {
    return fail(pfErrorNotSupported,
                "pfBubbleBegin: stream {} is being captured into a CUDA graph; bubble "
                "instructions cannot be captured (a replay would reuse this bubble's id; see "
                "docs/api.md, 'CUDA graphs')",
                stream);
  }
  // The device may refuse a stream it cannot serve (CUDA: another context's, whose streams fail
  // the event self-test); the identity lets pfBubbleEnd tell a stream destroyed meanwhile.
  uint64_t identity = 0;
  PF_TRY(device_.admit_main_stream(stream, &identity));
  const uint64_t id = next_bubble_id_;
  // The event pair of bubble `id` is reused from bubble id - (pool size), which must be
  // harvested. If the executor fell that far behind, the bubble is simply not tracked.
  const uint64_t harvested = harvested_upto_.load(std::memory_order_acquire);
  m.tracked = id <= harvested + resources_.bubble_begin_events.size();
  if (!m.tracked) {
    ++untracked_bubbles_;
    if (!untracked_warned_) {
      untracked_warned_ = true;
      log::warn("pfBubbleBegin: bubble {} is not timed: all {} bubble event pairs are in flight "
                "(bubbles {}..{} begun, only those up to {} harvested), so it and every bubble "
                "begun while the executor is that far behind are counted as skipped "
                "(pfSkipUntimed) and not filled. Harvesting needs the bubbles' end events to "
                "complete: synchronize now and then, or raise the bound with "
                "PIPEFILL_BUBBLE_EVENT_PAIRS (now {}). Said once per runtime.",
                id, resources_.bubble_begin_events.size(), harvested + 1, id, harvested,
                resources_.bubble_begin_events.size());
    }
  }
  if (m.tracked) PF_TRY(device_.record_event(resources_.begin_event(id), stream));
  m.bubble_id = id;
  m.iteration = iterations_.load(std::memory_order_relaxed);
  m.index_in_iteration = index_in_iteration_;
  // Inline mode: the slices go on the fill streams now, before the caller enqueues the wait.
  if (inline_fill_ != nullptr) m.deferred = !inline_fill_->begin_bubble(m, &tails_);
  push(m);
  current_tracked_ = m.tracked;
  bubble_stream_identity_ = identity;
  bubble_stream_.store(stream, std::memory_order_release);
  bubble_thread_.store(std::this_thread::get_id(), std::memory_order_release);
  in_bubble_.store(true, std::memory_order_release);
  next_bubble_id_.store(id + 1, std::memory_order_release);
  ++index_in_iteration_;
  current_timed_ = timed;
  current_closed_early_ = false;
  if (timed) {
    begin_ns_pending_ = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  return pfSuccess;
}

pfResult_t BubbleTracker::end_locked(void* stream) {
  const auto t0 = current_timed_ ? Clock::now() : Clock::time_point{};
  PF_TRY(refuse_null_stream(stream, "pfBubbleEnd"));
  if (!in_bubble()) {
    return fail(pfErrorInvalidState, "pfBubbleEnd: no bubble is open (pfBubbleBegin not called)");
  }
  if (stream != open_bubble_stream()) {
    return fail(pfErrorInvalidState,
                "pfBubbleEnd: stream {} is not the stream {} bubble {} began on", stream,
                open_bubble_stream(), next_bubble_id_ - 1);
  }
  const uint64_t id = next_bubble_id_ - 1;
  // The stream died with the bubble open (destroyed behind the runtime's back, e.g. by
  // cudaStreamDestroy; on CUDA its handle may even name a new stream by now): without this the
  // runtime would be wedged in the bubble for good, and a gate write on a dead handle may report
  // success while closing nothing.
  if (!device_.is_valid_main_stream(stream) ||
      !device_.main_stream_unchanged(stream, bubble_stream_identity_)) {
    abandon(id);
    return fail(pfErrorInvalidArgument,
                "pfBubbleEnd: stream {} is no longer a live main-job stream (destroyed while "
                "bubble {} was open); the bubble is abandoned: not timed, its fill ends with its "
                "budget",
                stream, id);
  }
  if (device_.is_capturing(stream)) {
    return fail(pfErrorNotSupported,
                "pfBubbleEnd: stream {} is being captured into a CUDA graph; end the capture "
                "first (bubble {} stays open; see docs/api.md, 'CUDA graphs')",
                stream, id);
  }
  // Close the gate in stream order: ticket blocks of this bubble stop at their next check.
  if (const pfResult_t r = device_.write_word(stream, resources_.gate(), id); r != pfSuccess) {
    const std::string why = last_error_message();
    abandon(id);
    return fail(r, "pfBubbleEnd: closing the gate on stream {} failed ({}); bubble {} is "
                "abandoned: not timed, its fill ends with its budget",
                stream, why, id);
  }
  if (current_tracked_) {
    if (const pfResult_t r = device_.record_event(resources_.end_event(id), stream);
        r != pfSuccess) {
      const std::string why = last_error_message();
      abandon(id);
      return fail(r, "pfBubbleEnd: recording the end event on stream {} failed ({}); bubble {} "
                  "is abandoned: not timed",
                  stream, why, id);
    }
    ended_upto_.store(id, std::memory_order_release);
  }
  // Inline mode: the slices' read-backs, behind the gate write in every queue.
  if (inline_fill_ != nullptr) inline_fill_->end_bubble(&tails_);
  BubbleMessage m;
  m.type = BubbleMessage::Type::End;
  m.bubble_id = id;
  m.fill_closed_early = current_closed_early_;
  push(m);
  in_bubble_.store(false, std::memory_order_release);
  bubble_stream_.store(nullptr, std::memory_order_release);
  if (current_timed_) {
    const uint64_t end_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    host_ns_total_.fetch_add(begin_ns_pending_ + end_ns, std::memory_order_relaxed);
    host_pairs_.fetch_add(1, std::memory_order_relaxed);
  }
  return pfSuccess;
}

pfResult_t BubbleTracker::close_fill(void* stream) {
  MutexLock lock(calls_mu_);
  PF_TRY(refuse_null_stream(stream, "pfBubbleCloseFill"));
  if (!in_bubble()) {
    return fail(pfErrorInvalidState,
                "pfBubbleCloseFill on stream {}: no bubble is open (call it between "
                "pfBubbleBegin and pfBubbleEnd)",
                stream);
  }
  const uint64_t id = next_bubble_id_ - 1;
  if (!device_.is_valid_main_stream(stream)) {
    return fail(pfErrorInvalidArgument,
                "pfBubbleCloseFill: stream {} is not a main-job stream of this runtime's device "
                "(bubble {} is open; a fill stream cannot close its own bubble)",
                stream, id);
  }
  if (device_.is_capturing(stream)) {
    return fail(pfErrorNotSupported,
                "pfBubbleCloseFill: stream {} is being captured into a CUDA graph; bubble "
                "instructions cannot be captured (bubble {} stays open)",
                stream, id);
  }
  // As for pfBubbleBegin: the device may refuse a stream it cannot serve (CUDA: a stream of
  // another context is admitted once that context passed the runtime's self-tests).
  uint64_t identity = 0;
  PF_TRY(device_.admit_main_stream(stream, &identity));
  // An untimed bubble is not filled (pfSkipUntimed) and has no begin event to order the close
  // after: there is nothing to close.
  if (!current_tracked_) {
    current_closed_early_ = true;
    return pfSuccess;
  }
  // After the bubble's begin: the close cannot land before the previous bubble's end write.
  // An atomic max: landing after this bubble's end, or a later one's, changes nothing.
  PF_TRY(device_.stream_wait_event(stream, resources_.begin_event(id)));
  PF_TRY(device_.write_word_max(stream, resources_.gate(), id));
  current_closed_early_ = true;
  return pfSuccess;
}

pfResult_t BubbleTracker::iteration_end() {
  MutexLock lock(calls_mu_);
  if (in_bubble()) {
    return fail(pfErrorInvalidState,
                "pfIterationEnd: bubble {} is still open (call pfBubbleEnd first)",
                next_bubble_id_ - 1);
  }
  index_in_iteration_ = 0;
  iterations_.fetch_add(1, std::memory_order_relaxed);
  return pfSuccess;
}

double BubbleTracker::host_ns_per_pair() const {
  const uint64_t pairs = host_pairs_.load(std::memory_order_relaxed);
  if (pairs == 0) return 0.0;
  return static_cast<double>(host_ns_total_.load(std::memory_order_relaxed)) /
         static_cast<double>(pairs);
}

void BubbleTracker::abandon(uint64_t id) {
  // The gate is not written elsewhere: a write on another stream could land after a later
  // bubble's close and move the gate back. The bubble's ticket slices stop at the next bubble's
  // gate write, or at their budget (the planned share of the prediction) - bounded either way.
  // Their tails still go on the fill streams: the harvest needs every slice's end.
  if (inline_fill_ != nullptr) inline_fill_->end_bubble(&tails_);
  BubbleMessage m;
  m.type = BubbleMessage::Type::End;
  m.bubble_id = id;
  m.abandoned = true;
  push(m);
  in_bubble_.store(false, std::memory_order_release);
  bubble_stream_.store(nullptr, std::memory_order_release);
}

bool BubbleTracker::abandon_if_stream_died() {
  MutexLock lock(calls_mu_);
  if (!in_bubble()) return true;
  if (device_.is_valid_main_stream(open_bubble_stream())) return false;
  log::warn("bubble {}'s stream {} died with the bubble open; abandoning it", next_bubble_id_ - 1,
            open_bubble_stream());
  abandon(next_bubble_id_ - 1);
  return true;
}

void BubbleTracker::push(const BubbleMessage& message) {
  while (!ring_.try_push(message)) pump_->make_room();
}

}  // namespace pipefill::core
