// The executor: what happens to the bubble messages the pump hands over. For each Begin it first
// harvests everything that completed, then predicts the bubble's duration and lets the slice
// launcher fill it; an End marks the bubble ended. The harvest (strictly in bubble order, never
// blocking) queries the bubble's and its slices' events, runs the harvester's accounting
// (harvester.hpp) and applies it to the statistics, the predictor, the jobs and the trace.
//
// Inline launch mode: the executor launches nothing; pfBubbleBegin makes the bubble's record and
// enqueues its slices through begin_bubble (InlineFill, executor_inline.cpp), from the class's
// plan the executor prepared after the last harvest (refresh_plans), and pfBubbleEnd enqueues
// their tails. A begin that finds the state lock taken leaves the bubble to the executor
// (deferred) rather than wait.
//
// Thread affinity: handle_messages on the pump's thread (executor thread or the thread running
// the simulated world); poll_completions on the executor/poller thread; harvest also from
// pfRuntimeSynchronize and pfJobDestroy; begin_bubble/end_bubble on the user thread. All take or
// hold the state lock.
#pragma once

#include <chrono>
#include <span>

#include "core/config.hpp"
#include "core/fill_resources.hpp"
#include "core/inline_fill.hpp"
#include "core/message_pump.hpp"
#include "core/runtime_state.hpp"
#include "core/slice_launcher.hpp"
#include "device/device.hpp"

namespace pipefill::core {

class Executor final : public MessageHandler, public InlineFill {
 public:
  Executor(const RuntimeOptions& options, Device& device, const FillResources& resources,
           RuntimeState& state)
      : options_(options),
        device_(device),
        resources_(resources),
        state_(state),
        launcher_(options, device, resources) {}

  void handle_messages(std::span<const BubbleMessage> batch) override EXCLUDES(state_.mu);
  void poll_completions() override EXCLUDES(state_.mu);
  bool awaits_completions() override EXCLUDES(state_.mu);

  // InlineFill (inline launch mode, the user thread).
  bool begin_bubble(const BubbleMessage& begin, SliceTails* tails) override EXCLUDES(state_.mu);
  // How long pfBubbleBegin (inline mode) tries for the state lock before it leaves the bubble to
  // the executor: about one uncontended handover, far below a harvest.
  static constexpr std::chrono::nanoseconds kInlineLockPatience{2000};
  void end_bubble(SliceTails* tails) override EXCLUDES(state_.mu);

  // pfJobCreate's warm-up on every fill stream (no lock held).
  pfResult_t warm_up(const JobState& job) { return launcher_.warm_up(job); }

  // Inline mode: rebuilds the prepared plan of every bubble class with a measured prediction
  // when something changed since the last build (a harvest, a launch, a job attached or ended).
  void refresh_plans(RuntimeState& s) REQUIRES(s.mu);

  // Harvests every bubble whose events (and its slices' events) completed, in bubble order.
  void harvest(RuntimeState& s) REQUIRES(s.mu);
  // Calibration mode (enable_cupti): takes the device's activity records (CUPTI on CUDA, the
  // activity log on the simulator) outside bubbles, for pfTraceWrite / pipefill-analyze.
  void collect_calibration(RuntimeState& s) REQUIRES(s.mu);
  // pfRuntimeSynchronize after the pump drained: waits for the fill stream and the end events of
  // ended bubbles, then harvests.
  pfResult_t synchronize(RuntimeState& s) EXCLUDES(s.mu);
  // Waits for every fill stream; every slice enqueued before has ended, so quarantined ones are
  // released.
  pfResult_t drain_fill_streams(RuntimeState& s) EXCLUDES(s.mu);

 private:
  static BubbleRecord& open_bubble_record(RuntimeState& s, const BubbleMessage& m)
      REQUIRES(s.mu);
  // Inline mode: the state lock for pfBubbleBegin (false: not within kInlineLockPatience; the
  // simulator always waits for it).
  bool lock_for_inline_begin(RuntimeState& s, uint64_t bubble_id) TRY_ACQUIRE(true, s.mu)
      NO_THREAD_SAFETY_ANALYSIS;
  bool begin_bubble_locked(RuntimeState& s, const BubbleMessage& m, SliceTails* tails)
      REQUIRES(s.mu);
  // True (with the skip reason set) for a bubble whose kind the options leave unfilled: the
  // optimizer (all-reduce) window unless fill_optimizer_bubbles.
  bool left_unfilled_by_kind(BubbleRecord& bubble) const;
  void handle_begin(RuntimeState& s, const BubbleMessage& m) REQUIRES(s.mu);
  void handle_end(RuntimeState& s, const BubbleMessage& m) REQUIRES(s.mu);
  void harvest_bubble(RuntimeState& s, BubbleRecord& bubble, double begin_us, double end_us)
      REQUIRES(s.mu);
  // The class's margin (pfRuntimeSetClassMargin), -1 when it has none.
  double class_margin(const RuntimeState& s, const std::string& class_key) const REQUIRES(s.mu);
  // The quantile gated work of the class is sized to: noticed_prediction_quantile when its last
  // bubble was closed early (pfBubbleCloseFill), else gated_prediction_quantile.
  double gated_quantile(const RuntimeState& s, const std::string& class_key) const REQUIRES(s.mu);
  // The prediction of a bubble class as a fill request (measured history, else the hint for
  // gated work only); *why says why there is none.
  FillRequest request_for(RuntimeState& s, const std::string& class_key, double expected_us,
                          std::string* why) REQUIRES(s.mu);
  // Releases the quarantined slices on fill stream `stream` (-1: every stream) enqueued before
  // `before_sequence` (the stream has passed them).
  void release_quarantined(RuntimeState& s, int stream, uint64_t before_sequence) REQUIRES(s.mu);
  // A tail (inline mode) could not be enqueued: its slice leaves the bubble for quarantine.
  void quarantine_slice(RuntimeState& s, uint64_t bubble_id, size_t slot, const std::string& why)
      REQUIRES(s.mu);
  // Moves a job to Running / Completed after its counts changed; tears it down when due.
  void settle_job(RuntimeState& s, JobState& job) REQUIRES(s.mu);

  const RuntimeOptions& options_;
  Device& device_;
  const FillResources& resources_;
  RuntimeState& state_;
  SliceLauncher launcher_;
};

}  // namespace pipefill::core
