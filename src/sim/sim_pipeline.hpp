// A reusable driver that executes a pipeline schedule on a simulated world: one device and
// one main stream per stage, compute ops as kernels, cross-stage dependencies as event waits
// with the schedule's point-to-point latency (holding `comm_sms` SMs, like a spinning NCCL
// recv), an end-of-iteration barrier (the drain bubble), the data-parallel all-reduce (an
// optimizer bubble: a communication kernel on comm_sms SMs) and the optimizer step.
//
// With a pfRuntime_t per stage it marks every bubble the no-fill schedule shows: pfBubbleBegin
// right before the waits the bubble consists of, pfBubbleEnd right after them, pfIterationEnd
// after each iteration. Ops of all stages are enqueued in the global start-time order of the
// no-fill schedule, so every event record is enqueued before the wait that needs it.
//
// Used by the runtime tests, the benchmarks and the examples.
#pragma once

#include <memory>
#include <vector>

#include "pipefill/pipefill.h"
#include "schedule/schedule.hpp"

namespace pipefill::sim {

struct PipelineOptions {
  schedule::ScheduleSpec spec;
  int comm_sms = 8;        // SMs a communication wait / the all-reduce holds
  int compute_sms = 0;     // SMs a compute kernel needs (0: every SM of the device)
  // Pass the no-fill schedule's bubble duration as hint->expected_duration_us, so bubbles can
  // be filled before the predictor has history.
  bool hint_expected_durations = false;
  // Empty, or one runtime per stage (nullptr: that stage marks no bubbles). Runtime s must run
  // on device s of the world.
  std::vector<pfRuntime_t> runtimes;
};

// A bubble as it happened on the simulated device (between the marks around its waits).
struct BubbleWindow {
  int stage = 0;
  uint64_t iteration = 0;
  int index_in_iteration = 0;
  pfBubbleKind_t kind = pfBubbleOther;
  double begin_us = 0.0;
  double end_us = 0.0;
};

struct IterationResult {
  double start_us = 0.0;                // end of the previous iteration (0 for the first)
  double end_us = 0.0;                  // last stage's end of this iteration
  std::vector<double> stage_end_us;     // per stage
  double duration_us() const { return end_us - start_us; }
};

class Pipeline {
 public:
  // The world needs at least spec.stages devices.
  static pfResult_t create(pfSimWorld_t world, const PipelineOptions& options,
                           std::unique_ptr<Pipeline>* out);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Enqueues one iteration on every stage and runs the world until idle.
  pfResult_t run_iteration(IterationResult* result);
  // Runs `count` iterations, appending their results.
  pfResult_t run(int count, std::vector<IterationResult>* results);

  const schedule::Timeline& timeline() const { return timeline_; }
  const std::vector<BubbleWindow>& bubbles() const { return windows_; }
  void* stream(int stage) const { return streams_[static_cast<size_t>(stage)]; }
  uint64_t iterations() const { return iteration_; }

 private:
  Pipeline() = default;
  struct Step {            // one op of one stage in global enqueue order
    int stage;
    size_t op;
  };
  struct Mark {            // a bubble to mark before op `op` of `stage`
    int index_in_iteration;
    pfBubbleKind_t kind;
    double expected_us;
  };
  pfResult_t enqueue_iteration();
  pfResult_t begin_bubble(int stage, const Mark& mark, size_t window_slot);
  pfResult_t end_bubble(int stage, size_t window_slot);

  pfSimWorld_t world_ = nullptr;
  PipelineOptions options_;
  schedule::Timeline timeline_;
  double link_us_ = 0.0;
  int stages_ = 0;
  int virtual_stages_ = 0;
  std::vector<void*> streams_;
  std::vector<Step> order_;
  // forward_done_[vs][mb], backward_done_[vs][mb]: recorded after the op on its stage.
  std::vector<std::vector<pfSimEvent_t>> forward_done_, backward_done_;
  std::vector<pfSimEvent_t> stage_done_;     // after the last compute op (barrier)
  std::vector<pfSimEvent_t> iteration_done_; // after the optimizer step
  // Per stage: bubble marks keyed by the op they precede (-1 .. ops), and their window events.
  std::vector<std::vector<std::vector<Mark>>> marks_;  // [stage][op + 1]
  std::vector<std::vector<pfSimEvent_t>> window_begin_, window_end_;  // [stage][bubble]
  std::vector<BubbleWindow> windows_;
  std::vector<BubbleWindow> pending_windows_;
  std::vector<std::pair<int, size_t>> pending_slots_;
  uint64_t iteration_ = 0;
  double last_end_us_ = 0.0;
};

}  // namespace pipefill::sim
