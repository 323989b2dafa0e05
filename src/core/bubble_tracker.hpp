// The user-thread bubble tracker: pfBubbleBegin, pfBubbleEnd and pfIterationEnd. They validate,
// enqueue their stream operations on the main stream (begin: record the begin event; end: close
// the gate, record the end event) and push a fixed-size message into the ring. They never wait
// for the device or the executor; a rejected call enqueues nothing. In the inline launch mode
// (inline_fill.hpp) begin also enqueues the bubble's fill slices, and end their read-backs after
// the gate write.
//
// Threads: one bubble open per runtime at a time. Begin, end and iteration end may come from any
// thread (an engine with several virtual stages drives several streams from several threads):
// they are serialised by the tracker's own mutex, which nothing else takes while it waits (the
// state lock may be taken under it, never the other way round), so a second pfBubbleBegin while
// a bubble is open - from any thread, on any stream - is refused with pfErrorInvalidState naming
// the stream and thread that hold it, and its caller's pfBubbleEnd never meets a taken-over
// bubble. What other threads read without the mutex (in_bubble, the open stream) is atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "common/error.hpp"
#include "common/mutex.hpp"
#include "core/config.hpp"
#include "core/fill_resources.hpp"
#include "core/inline_fill.hpp"
#include "core/message_pump.hpp"
#include "core/message_ring.hpp"
#include "device/device.hpp"

namespace pipefill::core {

class BubbleTracker {
 public:
  // `harvested_upto`: every bubble id <= it is harvested (its event pair may be reused).
  // `ended_upto`: written here once a bubble's end event is recorded.
  BubbleTracker(const RuntimeOptions& options, Device& device, const FillResources& resources,
                MessageRing& ring, const std::atomic<uint64_t>& harvested_upto,
                std::atomic<uint64_t>& ended_upto)
      : options_(options),
        device_(device),
        resources_(resources),
        ring_(ring),
        harvested_upto_(harvested_upto),
        ended_upto_(ended_upto) {}

  // The pump that makes room when the ring is full (set before the first bubble).
  void set_pump(MessagePump* pump) { pump_ = pump; }
  // Inline launch mode (set before the first bubble): begin enqueues the bubble's slices through
  // it, end their tails after the gate write. nullptr: executor mode.
  void set_inline_fill(InlineFill* fill) { inline_fill_ = fill; }

  pfResult_t begin(void* stream, const pfBubbleHint_t* hint) EXCLUDES(calls_mu_);
  pfResult_t end(void* stream) EXCLUDES(calls_mu_);
  pfResult_t iteration_end() EXCLUDES(calls_mu_);
  // pfBubbleCloseFill: on `stream`, after the open bubble's begin, the gate's atomic max to the
  // bubble's id (its fill stops at the next claim).
  pfResult_t close_fill(void* stream) EXCLUDES(calls_mu_);

  // Shutdown with a bubble open: when the bubble's stream died meanwhile, the bubble is abandoned
  // (as pfBubbleEnd would) and true is returned; false when the bubble is still live.
  bool abandon_if_stream_died() EXCLUDES(calls_mu_);
  // pfStreamDestroy: refuses (pfErrorInvalidState naming the stream and bubble) to destroy the
  // stream the open bubble began on, else destroys it with `destroy` while no begin or end can
  // run, so a bubble cannot begin on the stream between the check and the destroy.
  template <typename Destroy>
  pfResult_t destroy_stream_unless_open(void* stream, Destroy destroy) EXCLUDES(calls_mu_);

  // Any thread.
  bool in_bubble() const { return in_bubble_.load(std::memory_order_acquire); }
  // The stream of the open bubble (nullptr when none).
  void* open_bubble_stream() const { return bubble_stream_.load(std::memory_order_acquire); }
  uint64_t open_bubble_id() const { return next_bubble_id_ - 1; }
  // Whether the calling thread opened the bubble that is open now: a blocking call there would
  // stall the main stream's schedule (and on the simulator never return), so it is refused.
  bool bubble_open_on_calling_thread() const {
    return in_bubble() &&
           bubble_thread_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }
  uint64_t iterations() const { return iterations_.load(std::memory_order_relaxed); }
  // Mean host cost of a begin+end pair over the timed pairs (0 when none).
  double host_ns_per_pair() const;

 private:
  pfResult_t begin_locked(void* stream, const pfBubbleHint_t* hint) REQUIRES(calls_mu_);
  pfResult_t end_locked(void* stream) REQUIRES(calls_mu_);
  void push(const BubbleMessage& message);
  // pfErrorInvalidArgument naming `call` for a NULL stream off CUDA (no default stream there).
  pfResult_t refuse_null_stream(void* stream, const char* call) const;
  // Closes the open bubble without its end event; the executor counts it as not timed.
  void abandon(uint64_t id);

  const RuntimeOptions& options_;
  Device& device_;
  const FillResources& resources_;
  MessageRing& ring_;
  const std::atomic<uint64_t>& harvested_upto_;
  std::atomic<uint64_t>& ended_upto_;
  MessagePump* pump_ = nullptr;
  InlineFill* inline_fill_ = nullptr;
  SliceTails tails_;  // inline mode: the open bubble's slices whose tails pfBubbleEnd enqueues

  // Serialises begin, end, iteration end and the abandon path (see the header comment).
  Mutex calls_mu_;
  // Caller state (guarded by calls_mu_; the atomics are also read without it).
  std::atomic<bool> in_bubble_{false};
  bool current_tracked_ = false;
  uint64_t bubble_stream_identity_ = 0;  // Device::admit_main_stream's token of the open bubble's stream
  bool current_timed_ = false;
  bool current_closed_early_ = false;  // pfBubbleCloseFill was called for the open bubble
  uint64_t timing_counter_ = 0;
  static constexpr uint64_t kTimingSample = 64;  // one begin+end pair in 64 is timed
  std::atomic<void*> bubble_stream_{nullptr};
  std::atomic<std::thread::id> bubble_thread_{};  // the thread that opened the open bubble
  bool lent_memory_warned_ = false;
  std::atomic<uint64_t> next_bubble_id_{1};  // read by other threads for messages
  uint64_t index_in_iteration_ = 0;
  uint64_t begin_ns_pending_ = 0;
  std::atomic<uint64_t> iterations_{0};
  std::atomic<uint64_t> host_ns_total_{0};
  std::atomic<uint64_t> host_pairs_{0};
  bool untracked_warned_ = false;  // the event-pair bound was reported (once)
  uint64_t untracked_bubbles_ = 0;
};

template <typename Destroy>
pfResult_t BubbleTracker::destroy_stream_unless_open(void* stream, Destroy destroy) {
  MutexLock lock(calls_mu_);
  if (in_bubble() && open_bubble_stream() == stream) {
    return fail(pfErrorInvalidState,
                "pfStreamDestroy: bubble {} is open on stream {} (began on it); call pfBubbleEnd "
                "on that stream first",
                open_bubble_id(), stream);
  }
  return destroy();
}

}  // namespace pipefill::core
