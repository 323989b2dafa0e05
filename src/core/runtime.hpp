// The runtime behind pfRuntime_t: bubble tracker (user thread side), executor thread (planning,
// launching and harvesting fill slices), fill jobs, arena, statistics and trace.
//
// Threading model
//  - The *user thread* (the engine's CPU thread) calls bubble_begin/bubble_end/iteration_end.
//    These touch only user-side state (one caller at a time), enqueue two stream operations
//    each, and push a fixed-size message into a bounded ring (short mutex, no allocation).
//  - The *executor thread* pops messages. For each begun bubble it first harvests everything
//    already completed, then plans and launches fill slices on the fill stream. When idle it
//    polls completions (non-blocking event queries) every kIdlePollMicros.
//  - Every other API call (jobs, stats, trace, synchronize) may come from any thread; all
//    executor state is guarded by `mutex_`. Launch callbacks run on the executor thread with
//    `mutex_` held: they must not call PipeFill runtime/job functions (the pfSim* launch
//    helpers are fine).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/arena.hpp"
#include "core/config.hpp"
#include "core/planner.hpp"
#include "core/predictor.hpp"
#include "device/device.hpp"
#include "pipefill/pipefill.h"

// Internal classes live in pipefill::core so they can never clash with the public C++ layer
// (include/pipefill/pipefill.hpp defines pipefill::Runtime and pipefill::Job).
namespace pipefill::core {

class Runtime;

// A fill job (the object behind pfJob_t).
struct JobState {
  Runtime* runtime = nullptr;
  uint64_t sequence = 0;
  std::string name;
  pfJobKind_t kind = pfJobTicket;
  int priority = 0;
  uint64_t item_count = 0;
  std::vector<JobConfigModel> configs;
  void* user = nullptr;
  pfResult_t (*setup)(void*, const pfArenaAllocator_t*, int) = nullptr;
  pfResult_t (*launch)(void*, const pfSliceDesc_t*, void*) = nullptr;
  void (*teardown)(void*) = nullptr;

  int setup_config = -1;
  size_t resident_reserved = 0;        // bytes reserved in the arena for setup
  uintptr_t resident_block = 0;        // arena block holding them (0: none)
  size_t resident_used = 0;            // bytes setup has sub-allocated so far
  int slot = -1;                       // index of the job's device words
  uint64_t* cursor = nullptr;          // device word: next unclaimed item
  uint64_t* budget_counter = nullptr;  // device word: claims of the current slice

  // Progress; guarded by Runtime::mutex_.
  pfJobStatus_t status = pfJobPending;
  pfResult_t error = pfSuccess;
  std::string error_message;
  uint64_t items_completed = 0;
  uint64_t items_in_flight = 0;        // planned in slices not yet harvested
  uint64_t next_opaque_item = 0;
  uint64_t slices_launched = 0;
  uint64_t slices_in_flight = 0;
  double bubble_time_us = 0.0;
  double busy_time_us = 0.0;
  int last_config = -1;
  bool torn_down = false;
  bool detached = false;               // pfJobDestroy ran: harvest only updates stats
};

struct BubbleMessage {
  enum class Type : uint8_t { Begin, End };
  Type type = Type::Begin;
  bool tracked = false;  // events recorded for it (an event slot was free)
  int kind = pfBubbleOther;
  uint64_t bubble_id = 0;
  uint64_t iteration = 0;
  uint64_t index_in_iteration = 0;
  double expected_us = 0.0;
  size_t lent_bytes = 0;
  void* lent_memory = nullptr;
  char label[64] = {0};
};

class Runtime {
 public:
  static constexpr size_t kBubbleEventSlots = 512;   // begin/end event pairs
  static constexpr size_t kSliceEventSlots = 1024;   // start/end pairs (+ host read-back word)
  static constexpr size_t kMaxJobs = 256;            // live jobs (device word slots)
  static constexpr size_t kQueueCapacity = 4096;     // bubble messages in flight
  static constexpr size_t kMaxTraceRecords = 1 << 20;
  // Chrome-trace thread ids of calibration records: this base plus the device's stream id.
  static constexpr uint64_t kCalibrationTidBase = 1000;

  static pfResult_t create(const pfConfig_t* config, std::unique_ptr<Runtime>* out);
  // From already resolved options (C++ callers and tests).
  static pfResult_t create(const RuntimeOptions& options, std::unique_ptr<Runtime>* out);
  ~Runtime();
  // pfErrorBusy while jobs are attached; otherwise stops the executor and frees everything.
  pfResult_t shutdown();

  const RuntimeOptions& options() const { return options_; }
  Device& device() { return *device_; }
  const FillPartition& partition() const { return partition_; }
  pfSimWorld_t sim_world() const { return sim_world_; }

  // ---- user thread ------------------------------------------------------------------------
  pfResult_t bubble_begin(void* stream, const pfBubbleHint_t* hint);
  pfResult_t bubble_end(void* stream);
  pfResult_t iteration_end();

  // ---- any thread -------------------------------------------------------------------------
  pfResult_t synchronize();
  pfResult_t get_stats(pfStats_t* stats);
  pfResult_t write_trace(const char* path);
  pfResult_t async_error() const { return async_error_.load(); }
  pfResult_t create_high_priority_stream(void** stream);
  pfResult_t destroy_stream(void* stream);

  pfResult_t create_job(const pfJobDesc_t* desc, JobState** out);
  pfResult_t job_info(JobState* job, pfJobInfo_t* info);
  pfResult_t cancel_job(JobState* job);
  pfResult_t wait_job(JobState* job, double timeout_us);
  pfResult_t destroy_job(JobState* job);

  // Blocks until the executor has processed every message pushed so far (the sim pre-run
  // hook and synchronize use it). Never call it from the executor thread.
  void wait_for_executor();

 private:
  Runtime() = default;
  pfResult_t init(const RuntimeOptions& options);
  void release_resources();

  struct SliceRecord {
    std::shared_ptr<JobState> job;
    size_t event_slot = 0;        // index into slice_events_ / slice_host_words_
    uint64_t planned_items = 0;
    uint64_t first_item = 0;
    int config_index = 0;
    double granted_us = 0.0;
    uintptr_t workspace = 0;      // arena block to release at harvest (0: none/lent)
  };
  struct BubbleRecord {
    uint64_t id = 0;
    uint64_t iteration = 0;
    uint64_t index_in_iteration = 0;
    std::string class_key;
    int kind = pfBubbleOther;
    bool tracked = false;
    bool ended = false;
    double predicted_us = 0.0;    // prediction used for planning (0: none)
    std::vector<SliceRecord> slices;
    std::string skip_reason;
  };
  struct TraceBubble {
    uint64_t id;
    uint64_t iteration;
    std::string class_key;
    int kind;
    double begin_us, end_us, predicted_us;
    size_t slices;
  };
  struct TraceSlice {
    uint64_t bubble_id;
    std::string job_name;
    double start_us, end_us;
    uint64_t items;
    int config_index;
  };

  // executor side (mutex_ held)
  void push_message(const BubbleMessage& m);
  void process_messages_inline();
  void executor_main();
  void handle_begin(const BubbleMessage& m);
  void handle_end(const BubbleMessage& m);
  void fill_bubble(BubbleRecord& bubble, double predicted_us, const BubbleMessage& m);
  bool launch_slice(BubbleRecord& bubble, const std::shared_ptr<JobState>& job,
                    const SlicePlan& plan, void* workspace, uintptr_t workspace_block,
                    size_t workspace_bytes);
  void harvest_locked();
  // Calibration mode (enable_cupti): takes the device's activity records (CUPTI on CUDA, the
  // activity log on the simulator) once per harvested iteration, outside bubbles, on the
  // executor thread; pfTraceWrite writes them next to the bubbles for pipefill-analyze.
  void collect_calibration_locked();
  void harvest_bubble(BubbleRecord& bubble, double begin_us, double end_us);
  void end_job_locked(JobState& job, pfJobStatus_t status, pfResult_t error, std::string msg);
  void maybe_teardown_locked(JobState& job);
  void record_async_error(pfResult_t code, const std::string& message);
  uint64_t remaining_items(const JobState& job) const;

  RuntimeOptions options_;
  std::unique_ptr<Device> device_;
  FillPartition partition_;
  pfSimWorld_t sim_world_ = nullptr;
  bool hook_registered_ = false;
  bool inline_processing_ = false;  // sim: messages handled in the world's pre-run hook
  double launch_overhead_us_ = 0.0;
  Stream fill_stream_ = nullptr;
  std::vector<Event> bubble_begin_events_, bubble_end_events_;
  std::vector<Event> slice_start_events_, slice_end_events_;
  std::vector<size_t> free_slice_slots_;
  uint64_t* words_ = nullptr;        // [0] gate, then 2 per job slot (cursor, budget counter)
  uint64_t* host_words_ = nullptr;   // one per slice slot (cursor read-back)
  void* arena_base_ = nullptr;
  ArenaAllocator arena_;
  std::vector<bool> job_slot_used_;

  // user-thread state (one caller at a time by contract)
  bool in_bubble_ = false;
  bool current_tracked_ = false;
  bool current_timed_ = false;
  uint64_t timing_counter_ = 0;
  static constexpr uint64_t kTimingSample = 64;  // one begin+end pair in 64 is timed
  void* bubble_stream_ = nullptr;
  uint64_t next_bubble_id_ = 1;
  uint64_t index_in_iteration_ = 0;
  std::atomic<uint64_t> iterations_{0};
  std::atomic<uint64_t> host_ns_total_{0};
  std::atomic<uint64_t> host_pairs_{0};
  uint64_t begin_ns_pending_ = 0;
  std::atomic<uint64_t> harvested_upto_{0};   // every bubble id <= this is harvested

  // message ring
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;         // executor waits for work / stop
  std::condition_variable processed_cv_;     // wait_for_executor waits for progress
  std::vector<BubbleMessage> ring_;
  uint64_t ring_head_ = 0;                   // next to pop
  uint64_t ring_tail_ = 0;                   // next to push
  std::atomic<uint64_t> ring_tail_atomic_{0};  // ring_tail_, readable without the lock
  uint64_t processed_ = 0;                   // messages fully handled
  bool stop_ = false;
  std::atomic<bool> executor_sleeping_{false};
  std::thread executor_;

  // executor state
  mutable std::mutex mutex_;
  std::condition_variable job_cv_;           // job status changes
  BubblePredictor predictor_;
  std::deque<BubbleRecord> pending_;
  std::vector<std::shared_ptr<JobState>> jobs_;  // attached jobs, creation order
  uint64_t next_job_sequence_ = 0;
  std::atomic<pfResult_t> async_error_{pfSuccess};
  std::string async_message_;
  pfStats_t stats_{};
  std::vector<TraceBubble> trace_bubbles_;
  std::vector<TraceSlice> trace_slices_;
  bool trace_truncated_ = false;
  std::vector<ActivityRecord> calibration_records_;
  uint64_t calibration_iteration_ = 0;
  bool calibration_available_ = true;
};

}  // namespace pipefill::core

// The C handles (pfRuntime_t, pfJob_t) are these objects' addresses, cast at the C boundary
// (src/capi); the handle structs themselves are never defined.
