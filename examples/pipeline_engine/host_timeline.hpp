// Per-bubble timing of the host transport's fill (examples/pipeline_engine/host_transport.cpp):
// where a bubble's time goes on the real-time host device, measured on the threads that do the
// work, not inferred. For every bubble of a stage:
//
//   begin      the main stream passed pfBubbleBegin (a host function right behind its record)
//   launched   the executor called the job's launch callback for it (the slice was enqueued)
//   started    the fill stream passed the slice's wait on the begin event (slice observer)
//   first/last the first and the last item of the bubble's slice completed (item observer)
//   end        the main stream passed pfBubbleEnd (right behind the gate write)
//   stopped    the fill stream passed the slice's work: every block exited (slice observer)
//
// All times are µs on one steady clock (the timeline's origin), written with relaxed atomics by
// the thread that sees the moment, read after the iteration was synchronized.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace engine {

// One bubble's moments; -1: not seen (e.g. a bubble without a slice).
struct BubbleMoments {
  std::atomic<double> begin{-1}, launched{-1}, started{-1}, first_item{-1}, last_item{-1},
      end{-1}, stopped{-1};
  std::atomic<uint64_t> items{0};       // items of this bubble's slice completed
  std::atomic<uint64_t> late_items{0};  // of them, completed after the bubble's end
  std::atomic<int> iteration{-1};
  std::atomic<int> index{-1};  // k-th bubble of its iteration (its class "#k")
};

// Where one stage's bubble time went, summed over the bubbles counted (µs).
struct StageBreakdown {
  int stage = 0;
  uint64_t bubbles = 0;          // counted bubbles (the classes asked for, counted iterations)
  uint64_t bubbles_with_slice = 0;
  double bubble_us = 0;          // begin -> end
  double executor_late_us = 0;   // begin -> launched, when the launch came after the begin
  double stream_wake_us = 0;     // max(begin, launched) -> started: the fill stream's hop
  double first_item_us = 0;      // max(begin, launched, started) -> first item done, minus one
                                 // item: the blocks' hop
  double items_span_us = 0;      // first item started -> last item done, inside the bubble
  double tail_us = 0;            // last item done -> end: the margin and the last round
  double unfilled_us = 0;        // bubbles without a slice: all of their time
  uint64_t items = 0, late_items = 0;
  double stop_after_end_us = 0;  // end -> every block exited (overrun, not bubble time)
};

class HostTimeline {
 public:
  // `capacity` bubbles per stage (ids 1..capacity are recorded, later ones ignored).
  HostTimeline(int stages, size_t capacity);

  double now_us() const;
  // The moment of `bubble_id` (1-based, the runtime's ids) of `stage`, or nullptr.
  BubbleMoments* at(int stage, uint64_t bubble_id);
  const BubbleMoments* at(int stage, uint64_t bubble_id) const {
    return const_cast<HostTimeline*>(this)->at(stage, bubble_id);
  }
  // The bubble whose slice the stage's blocks run now (set at slice start).
  void set_running(int stage, uint64_t bubble_id);
  // An item of `stage` completed now (item observer, SM thread).
  void item_done(int stage);

  // Sums the bubbles of `stage` from iteration `first_iteration` on whose index in the
  // iteration is marked in `classes` (classes[k]: class "#k" counts); item_cost_us: one item's
  // time (the blocks' hop excludes it).
  StageBreakdown breakdown(int stage, int first_iteration, const std::vector<bool>& classes,
                           double item_cost_us) const;
  // Every recorded bubble of every stage as CSV (µs; -1: not seen), one line per bubble:
  // stage,id,iteration,index,begin,launched,started,first_item,last_item,end,stopped,items,late
  std::string csv() const;

 private:
  struct StageMoments {
    std::unique_ptr<BubbleMoments[]> bubbles;
    std::atomic<uint64_t> running{0};
  };
  const std::chrono::steady_clock::time_point origin_;
  const size_t capacity_;
  std::vector<StageMoments> stages_;
};

}  // namespace engine
