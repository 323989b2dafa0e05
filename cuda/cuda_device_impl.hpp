// The CUDA device's class (pipefill::Device on a CUDA GPU), shared by the files that implement
// it, one concern each: cuda_device.cpp (creation, identity, launch callbacks, shutdown),
// cuda_device_streams.cpp (streams, main streams at bubble instructions),
// cuda_device_capture.cpp (capture streams in private capture contexts),
// cuda_device_events.cpp (events and the clock they are timed against), cuda_device_memory.cpp
// (device words, gate writes, the arena), cuda_device_partition.cpp (the SM partition: green
// context or grid cap) and cuda_device_self_tests.cpp (the word-write and event self-tests that
// decide it). Internal to the backend: the core sees only Device, tests CudaDeviceExtras.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.hpp"
#include "cuda_device.hpp"
#include "cupti_collector.hpp"
#include "device_context.hpp"
#include "fallbacks.hpp"
#include "stream_context.hpp"

// The device's primary context current for the rest of the enclosing call, as `need` says
// (device_context.hpp): never cudaSetDevice, which would leave the caller's thread bound to this
// device's primary context (issue 24 item 3).
#define PF_DEVICE_CONTEXT(need)             \
  DeviceContextScope device_context_scope_; \
  PF_TRY(device_context_scope_.enter(primary_, cu_device_, need))

namespace pipefill {
struct RuntimeOptions;

namespace cuda {

// Pinned slots for the fallback gate write: a slot is reused after this many writes, so at most
// this many gate writes may be enqueued but not yet executed (a few per iteration in practice).
constexpr size_t kGateSlotCount = 4096;
// Re-base event timings once the reference is older than this: cudaEventElapsedTime returns
// float milliseconds, whose resolution at 8 s is ~0.5 µs.
constexpr double kReferenceMaxAgeUs = 4e6;
// Length of the main-side kernel of the cross-context event self-test.
constexpr uint64_t kEventSelfTestKernelNs = 200'000;

// An environment variable set to "1"/"true" (env_flag) or "0"/"false"/"off" (env_off).
bool env_flag(const char* name);
bool env_off(const char* name);

// A context's clock reference: an event aligned with the host clock, re-based when old.
struct Reference {
  cudaEvent_t event = nullptr;
  double time_us = 0.0;
  cudaEvent_t pending = nullptr;  // the next reference, recorded but maybe not yet complete
  cudaStream_t stream = nullptr;  // where its events are recorded
};

class CudaDevice final : public Device, public CudaDeviceExtras {
 public:
  ~CudaDevice() override { shutdown(); }

  pfResult_t init(const RuntimeOptions& options, int ordinal, const std::string& source);

  // ---- Identity -----------------------------------------------------------------------------
  pfBackend_t backend() const override { return pfBackendCuda; }
  std::string name() const override { return name_; }
  int sm_count() const override { return sm_count_; }
  int ordinal() const override { return ordinal_; }
  GateWriteMode gate_write_mode() const override { return gate_mode_; }
  ActivityCollector* activity_collector() override { return collector_.get(); }
  const FillPartition& partition() const override { return partition_; }
  const PartitionOutcome& partition_outcome() const override { return outcome_; }
  bool single_connection() const override { return single_connection_; }
  ClusterOccupancy cluster_occupancy() const override {
    std::lock_guard lock(mutex_);
    return clusters_;
  }
  // One connection is one hardware queue in green-context mode too: cuda.h's green-context notes
  // (cuGreenCtxCreate) say kernels of green contexts with disjoint SMs may still depend on each
  // other through hardware connections (CUDA_DEVICE_MAX_CONNECTIONS), so a slice enqueued after
  // the main stream's wait could start only once the gate is closed, run no item and be classed
  // late. Until a GPU check measures that green-context streams get queues of their own, the
  // runtime's auto launch mode goes inline (slices enqueued in pfBubbleBegin) in both modes.
  bool single_hardware_queue() const override { return single_connection_; }

  // ---- Streams ------------------------------------------------------------------------------
  pfResult_t priority_range(int* lowest, int* highest) override;
  pfResult_t create_fill_stream(Stream* out) override;
  pfResult_t create_stream(int priority, Stream* out) override;
  pfResult_t destroy_stream(Stream stream) override;
  bool is_valid_main_stream(Stream stream) const override;
  bool is_capturing(Stream stream) const override;
  pfResult_t synchronize_stream(Stream stream) override;

  // ---- Events -------------------------------------------------------------------------------
  pfResult_t create_event(Event* out) override;
  pfResult_t destroy_event(Event event) override;
  pfResult_t record_event(Event event, Stream stream) override;
  pfResult_t stream_wait_event(Stream stream, Event event) override;
  pfResult_t query_event(Event event, bool* done, double* time_us) override;
  pfResult_t synchronize_event(Event event) override;

  // ---- Device words -------------------------------------------------------------------------
  pfResult_t allocate_words(size_t count, uint64_t** words) override;
  pfResult_t free_words(uint64_t* words) override;
  pfResult_t allocate_host_words(size_t count, uint64_t** words) override;
  pfResult_t free_host_words(uint64_t* words) override;
  pfResult_t write_word(Stream stream, uint64_t* word, uint64_t value) override;
  pfResult_t write_word_max(Stream stream, uint64_t* word, uint64_t value) override;
  pfResult_t copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) override;

  // ---- Memory -------------------------------------------------------------------------------
  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) override;
  pfResult_t allocate_arena(size_t bytes, void** base) override;
  pfResult_t free_arena(void* base) override;

  // ---- SMs ----------------------------------------------------------------------------------
  pfResult_t configure_partition(int reserved_sms, FillPartition* out) override;

  // ---- Calibration --------------------------------------------------------------------------
  // ---- Graph fill jobs (cuda/gated_graph.hpp) -------------------------------------------------
  pfResult_t prepare_graph_items(const GraphJobSpec& spec, std::unique_ptr<GraphItems>* out) override;
  pfResult_t launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice, Stream stream) override;
  pfResult_t create_capture_stream(Stream* out) override;
  pfResult_t push_capture_context(Stream stream) override;
  pfResult_t pop_capture_context() override;

  // ---- Main streams at bubble instructions --------------------------------------------------
  pfResult_t admit_main_stream(Stream stream, uint64_t* identity) override;
  bool main_stream_unchanged(Stream stream, uint64_t identity) const override;

  // ---- Launch callbacks -----------------------------------------------------------------------
  bool enter_launch_context() override;
  void leave_launch_context() override;
  pfResult_t collect_activity(std::vector<ActivityRecord>* out) override;

  // ---- Clock --------------------------------------------------------------------------------
  double now_us() override;

 private:
  // The capture-context pushes open on this thread, innermost last (any CudaDevice of the process).
  struct CapturePush {
    const CudaDevice* device;
    std::unique_ptr<ScopedStreamContext> scope;
  };
  static std::vector<CapturePush>& capture_context_pushes();
  // A private capture context (cuda_device_capture.cpp): the green context and its CUcontext.
  struct CapturedContext {
    CUgreenCtx green = nullptr;
    CUcontext context = nullptr;
  };
  pfResult_t create_private_capture_context(CapturedContext* out, cudaStream_t* stream);
  pfResult_t run_capture_context_self_test(cudaStream_t capture);
  void destroy_capture_contexts();
  pfResult_t check_main_context(CUcontext context, Stream stream);
  std::string judge_main_context(CUcontext context);
  bool partition_configured() const;
  pfResult_t init_clock();
  pfResult_t init_reference(Reference& reference);
  pfResult_t advance_reference_locked(Reference& reference);

  // ---- Per-context events (issue 16 item 4) -----------------------------------------------
  // Where the cross-context self-test shows that primary-context events cannot be recorded on
  // green-context streams (cudaEventRecord documents event and stream from one context), every
  // event the runtime creates gets a twin made in the fill context: records on a fill stream go
  // to the twin, records elsewhere to the event itself, and waits, queries and syncs use the one
  // recorded last. Twins are made with their event (setup), never in a bubble; fill-side times
  // come from a fill-context reference aligned to the host clock like the primary one.
  struct LatestRecord {
    cudaEvent_t event = nullptr;
    bool fill_context = false;
  };
  LatestRecord latest_of(Event event);
  bool is_fill_stream(cudaStream_t stream) const;
  pfResult_t create_fill_context_event(cudaEvent_t* out);
  EventSelfTest run_per_context_event_self_test(cudaStream_t fill);
  pfResult_t enable_per_context_events();
  pfResult_t align_fill_reference_locked();
  void disable_per_context_events();
  pfResult_t init_gate_write();
  void try_green_context(int reserved_sms, FillPartition* partition, PartitionOutcome* outcome);
  pfResult_t create_green_context(int reserved_sms, FillPartition* partition, std::string* why_not);
  void destroy_green_context();
  ClusterOccupancy measure_cluster_occupancy(cudaStream_t fill) const;
  MemoryOpsSelfTest run_memory_ops_self_test(cudaStream_t fill);
  EventSelfTest run_event_self_test(cudaStream_t fill);
  static bool self_test_step(std::string* slot, const char* call, cudaError_t error);
  void finish_event_self_test(EventSelfTest* test, bool good, cudaStream_t fill, cudaEvent_t first,
                              const char* first_name, cudaEvent_t b, cudaEvent_t c);

  void shutdown();
  void shutdown_in_primary_context();

  int ordinal_ = -1;
  CUdevice cu_device_ = 0;
  CUcontext primary_ = nullptr;  // retained at init, released at shutdown
  std::string name_;
  int sm_count_ = 0;
  int lowest_priority_ = 0;
  int highest_priority_ = 0;
  cudaStream_t control_stream_ = nullptr;  // setup work and reference events

  std::mutex clock_mutex_;
  std::chrono::steady_clock::time_point origin_;
  Reference reference_;       // primary context (control stream)
  Reference fill_reference_;  // fill context, per-context event mode only

  // Per-context event mode (set while the partition is configured, before any runtime event).
  struct FillTwin {
    cudaEvent_t event = nullptr;   // made in the fill context
    bool latest_on_fill = false;   // the latest record went to the twin
  };
  std::atomic<bool> per_context_events_{false};
  Mutex twins_mutex_;
  std::map<cudaEvent_t, FillTwin> twins_ GUARDED_BY(twins_mutex_);

  GateWriteMode gate_mode_ = GateWriteMode::PinnedCopy;
  uint64_t* gate_slots_ = nullptr;
  std::atomic<size_t> next_gate_slot_{0};

  mutable std::mutex mutex_;
  std::set<cudaStream_t> fill_streams_;
  std::set<cudaStream_t> main_streams_;
  std::set<cudaStream_t> capture_streams_;  // also in main_streams_
  Mutex main_contexts_mutex_;
  std::map<CUcontext, std::string> main_contexts_ GUARDED_BY(main_contexts_mutex_);
  std::set<void*> device_words_;
  std::set<void*> host_words_;
  std::map<void*, size_t> arenas_;
  bool partition_configured_ = false;
  FillPartition partition_;
  CUgreenCtx green_context_ = nullptr;
  CUdevResourceDesc green_desc_ = nullptr;  // its SMs: private capture contexts are made from it
  std::vector<CapturedContext> capture_contexts_;  // live until shutdown (graphs may outlive streams)
  std::atomic<bool> private_captures_{true};  // false once they failed or PIPEFILL_CAPTURE_CONTEXT=0
  cudaStream_t spare_fill_stream_ = nullptr;  // tested by configure_partition, not yet handed out
  PartitionOutcome outcome_;
  ClusterOccupancy clusters_;
  bool single_connection_ = false;

  std::unique_ptr<ActivityCollector> collector_;
};

}  // namespace cuda
}  // namespace pipefill
