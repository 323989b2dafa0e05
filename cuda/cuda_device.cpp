// pipefill::Device on a CUDA GPU. See docs/cuda-backend.md for the design; in short:
//  - fill streams at the lowest priority, inside a green context holding all SMs but R when the
//    driver supports it (grid-cap mode otherwise); main-job streams at any valid priority;
//  - event timings relative to a reference event recorded at creation (re-based every few
//    seconds so float milliseconds keep sub-microsecond precision), never a blocking sync;
//  - the gate close is a stream-ordered write (cuStreamWriteValue64, or a copy from a pinned
//    slot ring), never a wait-value operation;
//  - device memory only at setup: words, pinned words, one arena allocation.
#include "cuda_device.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/mutex.hpp"
#include "core/config.hpp"
#include "cuda_check.hpp"
#include "clock_alignment.hpp"
#include "cupti_collector.hpp"
#include "device_context.hpp"
#include "driver_api.hpp"
#include "event_query.hpp"
#include "fallbacks.hpp"
#include "fill_kernels.hpp"
#include "gated_graph.hpp"
#include "partition.hpp"
#include "stream_context.hpp"

// The device's primary context current for the rest of the enclosing call, as `need` says
// (device_context.hpp): never cudaSetDevice, which would leave the caller's thread bound to this
// device's primary context (issue 24 item 3).
#define PF_DEVICE_CONTEXT(need)             \
  DeviceContextScope device_context_scope_; \
  PF_TRY(device_context_scope_.enter(primary_, cu_device_, need))

namespace pipefill {
namespace cuda {

const char* gate_write_mode_name(GateWriteMode mode) {
  return mode == GateWriteMode::StreamWriteValue ? "cuStreamWriteValue64" : "pinned-copy";
}

namespace {

// Pinned slots for the fallback gate write: a slot is reused after this many writes, so at most
// this many gate writes may be enqueued but not yet executed (a few per iteration in practice).
constexpr size_t kGateSlotCount = 4096;
// Re-base event timings once the reference is older than this: cudaEventElapsedTime returns
// float milliseconds, whose resolution at 8 s is ~0.5 µs.
constexpr double kReferenceMaxAgeUs = 4e6;

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && (std::strcmp(value, "1") == 0 || std::strcmp(value, "true") == 0);
}

bool env_off(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && (std::strcmp(value, "0") == 0 || std::strcmp(value, "false") == 0 ||
                              std::strcmp(value, "off") == 0);
}

// Length of the main-side kernel of the cross-context event self-test.
constexpr uint64_t kEventSelfTestKernelNs = 200'000;

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

  // `ordinal`: the device (config.device, or the caller's current one); `source` says which.
  pfResult_t init(const RuntimeOptions& options, int ordinal, const std::string& source) {
    ordinal_ = ordinal;
    origin_ = std::chrono::steady_clock::now();  // the device clock's origin (CUPTI aligns to it)
    // The device's primary context, held for the device's life and pushed per call where a call
    // needs it (device_context.hpp): the caller's current context and device never change.
    const DriverApi& api = driver_api();
    if (api.device_get == nullptr || api.device_primary_ctx_retain == nullptr ||
        api.device_primary_ctx_release == nullptr || api.ctx_get_current == nullptr ||
        api.ctx_push_current == nullptr || api.ctx_pop_current == nullptr)
      return fail(pfErrorNotSupported,
                  "the CUDA driver ({}) lacks cuDeviceGet, cuDevicePrimaryCtxRetain@7000, "
                  "cuDevicePrimaryCtxRelease@11000 or the cuCtx push/pop calls: the runtime reaches "
                  "its device only through the device's primary context, never by changing the "
                  "caller's current device",
                  api.driver_version);
    PF_DRIVER_CHECK(api.device_get(&cu_device_, ordinal_));
    PF_DRIVER_CHECK(api.device_primary_ctx_retain(&primary_, cu_device_));
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    // CUPTI first: activity must be enabled before the work it should see.
    if (options.enable_cupti || env_flag("PIPEFILL_CUPTI")) {
      if (start_cupti_collector([this] { return now_us(); }, &collector_) != pfSuccess) {
        collector_.reset();  // warned once inside; events only
        clear_last_error();
      }
    }
    cudaDeviceProp properties{};
    PF_CUDA_CHECK(cudaGetDeviceProperties(&properties, ordinal_));
    name_ = properties.name;
    sm_count_ = properties.multiProcessorCount;
    PF_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest_priority_, &highest_priority_));
    PF_CUDA_CHECK(cudaStreamCreateWithFlags(&control_stream_, cudaStreamNonBlocking));
    PF_TRY(load_fill_kernels());
    PF_TRY(init_clock());
    PF_TRY(init_gate_write());
    const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    single_connection_ = connections != nullptr && std::strcmp(connections, "1") == 0;
    log::info("CUDA device {} '{}' ({}): {} SMs, stream priorities {}..{} (lowest..highest), gate "
              "write {}, CUDA_DEVICE_MAX_CONNECTIONS={}, CUPTI {}",
              ordinal_, name_, source, sm_count_, lowest_priority_, highest_priority_,
              gate_write_mode_name(gate_mode_), connections ? connections : "unset",
              collector_ ? "on" : "off");
    return pfSuccess;
  }

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
  // One connection is one hardware queue in green-context mode too: cuda.h's green-context notes
  // (cuGreenCtxCreate) say kernels of green contexts with disjoint SMs may still depend on each
  // other through hardware connections (CUDA_DEVICE_MAX_CONNECTIONS), so a slice enqueued after
  // the main stream's wait could start only once the gate is closed, run no item and be classed
  // late. Until a GPU check measures that green-context streams get queues of their own, the
  // runtime's auto launch mode goes inline (slices enqueued in pfBubbleBegin) in both modes.
  bool single_hardware_queue() const override { return single_connection_; }

  // ---- Streams ------------------------------------------------------------------------------
  pfResult_t priority_range(int* lowest, int* highest) override {
    if (lowest == nullptr || highest == nullptr)
      return fail(pfErrorInvalidArgument, "priority_range: null output pointer");
    *lowest = lowest_priority_;
    *highest = highest_priority_;
    return pfSuccess;
  }

  pfResult_t create_fill_stream(Stream* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "create_fill_stream: out is null");
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    if (!partition_configured()) {  // configure_partition not called: default R
      FillPartition ignored;
      PF_TRY(configure_partition(-1, &ignored));
    }
    cudaStream_t stream = nullptr;
    {
      std::lock_guard lock(mutex_);
      std::swap(stream, spare_fill_stream_);  // the green-context stream configure made and tested
    }
    if (stream == nullptr) {
      if (green_context_ != nullptr) {
        CUstream raw = nullptr;
        PF_DRIVER_CHECK(driver_api().green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING,
                                                             lowest_priority_));
        stream = reinterpret_cast<cudaStream_t>(raw);
      } else {
        PF_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, lowest_priority_));
      }
      // Load the fill kernels into the stream's context now (a green context loads modules on
      // its own), so no lazy load can happen inside a bubble.
      if (const pfResult_t result = warm_up_fill_kernels(stream); result != pfSuccess) {
        (void)cudaStreamDestroy(stream);
        return result;
      }
    }
    if (collector_) (void)collector_->register_fill_stream(stream);
    std::lock_guard lock(mutex_);
    fill_streams_.insert(stream);
    *out = stream;
    return pfSuccess;
  }

  pfResult_t create_stream(int priority, Stream* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "create_stream: out is null");
    if (priority > lowest_priority_ || priority < highest_priority_)
      return fail(pfErrorInvalidArgument,
                  "stream priority {} is outside the device's range {} (lowest) .. {} (highest)",
                  priority, lowest_priority_, highest_priority_);
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    cudaStream_t stream = nullptr;
    PF_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
    std::lock_guard lock(mutex_);
    main_streams_.insert(stream);
    *out = stream;
    return pfSuccess;
  }

  pfResult_t destroy_stream(Stream stream) override {
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    {
      std::lock_guard lock(mutex_);
      const bool fill = fill_streams_.erase(cuda_stream) > 0;
      const bool main = main_streams_.erase(cuda_stream) > 0;
      capture_streams_.erase(cuda_stream);
      if (!fill && !main)
        return fail(pfErrorInvalidArgument, "destroy_stream: stream {} was not created by this device",
                    stream);
    }
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    PF_CUDA_CHECK(cudaStreamDestroy(cuda_stream));
    return pfSuccess;
  }

  bool is_valid_main_stream(Stream stream) const override {
    std::lock_guard lock(mutex_);
    return fill_streams_.count(static_cast<cudaStream_t>(stream)) == 0;
  }

  // cudaStreamIsCapturing: a stream under capture (or, for the legacy NULL stream, any global
  // capture on the device: cudaErrorStreamCaptureImplicit) refuses bubble instructions.
  bool is_capturing(Stream stream) const override {
    DeviceContextScope scope;
    if (scope.enter(primary_, cu_device_, ContextNeed::Any) != pfSuccess) clear_last_error();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t error = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
    if (error == cudaErrorStreamCaptureImplicit) {
      (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
      return true;
    }
    if (error != cudaSuccess) {
      // Not a capture: the stream is invalid, and the next stream operation reports why.
      (void)cudaGetLastError();
      return false;
    }
    return status != cudaStreamCaptureStatusNone;
  }

  pfResult_t synchronize_stream(Stream stream) override {
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    PF_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  // ---- Events -------------------------------------------------------------------------------
  pfResult_t create_event(Event* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "create_event: out is null");
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    cudaEvent_t event = nullptr;
    PF_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDefault));  // timing enabled
    if (per_context_events_) {
      // Its twin in the fill context, for records on fill streams (see FillTwin).
      cudaEvent_t twin = nullptr;
      const pfResult_t made = create_fill_context_event(&twin);
      if (made != pfSuccess) {
        (void)cudaEventDestroy(event);
        return made;
      }
      MutexLock lock(twins_mutex_);
      twins_[event] = FillTwin{twin, false};
    }
    *out = event;
    return pfSuccess;
  }

  pfResult_t destroy_event(Event event) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "destroy_event: event is null");
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    cudaEvent_t twin = nullptr;
    {
      MutexLock lock(twins_mutex_);
      if (const auto it = twins_.find(static_cast<cudaEvent_t>(event)); it != twins_.end()) {
        twin = it->second.event;
        twins_.erase(it);
      }
    }
    if (twin != nullptr) PF_CUDA_CHECK(cudaEventDestroy(twin));
    PF_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
    return pfSuccess;
  }

  pfResult_t record_event(Event event, Stream stream) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "record_event: event is null");
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    auto cuda_event = static_cast<cudaEvent_t>(event);
    if (per_context_events_) {
      const bool fill = is_fill_stream(static_cast<cudaStream_t>(stream));
      MutexLock lock(twins_mutex_);
      if (const auto it = twins_.find(cuda_event); it != twins_.end()) {
        it->second.latest_on_fill = fill;
        if (fill) cuda_event = it->second.event;
      }
    }
    PF_CUDA_CHECK(cudaEventRecord(cuda_event, static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  pfResult_t stream_wait_event(Stream stream, Event event) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "stream_wait_event: event is null");
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    // cudaStreamWaitEvent may wait on an event of another context (cuda.h, cuStreamWaitEvent).
    PF_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), latest_of(event).event, 0));
    return pfSuccess;
  }

  pfResult_t query_event(Event event, bool* done, double* time_us) override {
    if (event == nullptr || done == nullptr || time_us == nullptr)
      return fail(pfErrorInvalidArgument, "query_event: null argument (event {})", event);
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    const LatestRecord latest = latest_of(event);
    auto cuda_event = latest.event;
    cudaError_t error = cudaSuccess;
    const EventState state = query_event_state(cuda_event, &error);  // clears NotReady
    if (state == EventState::Pending) {
      *done = false;
      return pfSuccess;
    }
    PF_CUDA_CHECK(error);
    std::lock_guard lock(clock_mutex_);
    // Timed against the reference of its own context (cudaEventElapsedTime pairs one context's
    // events); both references are aligned to the host clock.
    Reference& reference = latest.fill_context ? fill_reference_ : reference_;
    PF_TRY(advance_reference_locked(reference));
    float elapsed_ms = 0.0f;
    const cudaError_t timing = cudaEventElapsedTime(&elapsed_ms, reference.event, cuda_event);
    if (timing == cudaErrorInvalidResourceHandle) {
      (void)cudaGetLastError();
      return fail(pfErrorInvalidState, "query_event: event {} has never been recorded", event);
    }
    PF_CUDA_CHECK(timing);
    *done = true;
    *time_us = reference.time_us + static_cast<double>(elapsed_ms) * 1000.0;
    return pfSuccess;
  }

  pfResult_t synchronize_event(Event event) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "synchronize_event: event is null");
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    PF_CUDA_CHECK(cudaEventSynchronize(latest_of(event).event));
    return pfSuccess;
  }

  // ---- Device words -------------------------------------------------------------------------
  pfResult_t allocate_words(size_t count, uint64_t** words) override {
    if (words == nullptr || count == 0)
      return fail(pfErrorInvalidArgument, "allocate_words: count={} (must be > 0) or null output", count);
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    void* memory = nullptr;
    PF_CUDA_CHECK(cudaMalloc(&memory, count * sizeof(uint64_t)));  // 256-byte aligned
    const cudaError_t zero = cudaMemsetAsync(memory, 0, count * sizeof(uint64_t), control_stream_);
    const cudaError_t sync = zero == cudaSuccess ? cudaStreamSynchronize(control_stream_) : zero;
    if (sync != cudaSuccess) {
      (void)cudaFree(memory);
      return cuda_failure(sync, "cudaMemsetAsync/cudaStreamSynchronize(words)", __FILE__, __LINE__);
    }
    std::lock_guard lock(mutex_);
    device_words_.insert(memory);
    *words = static_cast<uint64_t*>(memory);
    return pfSuccess;
  }

  pfResult_t free_words(uint64_t* words) override {
    {
      std::lock_guard lock(mutex_);
      if (device_words_.erase(words) == 0)
        return fail(pfErrorInvalidArgument, "free_words: {} was not allocated by allocate_words",
                    static_cast<void*>(words));
    }
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    PF_CUDA_CHECK(cudaFree(words));
    return pfSuccess;
  }

  pfResult_t allocate_host_words(size_t count, uint64_t** words) override {
    if (words == nullptr || count == 0)
      return fail(pfErrorInvalidArgument, "allocate_host_words: count={} (must be > 0) or null output", count);
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    void* memory = nullptr;
    PF_CUDA_CHECK(cudaHostAlloc(&memory, count * sizeof(uint64_t), cudaHostAllocPortable));
    std::memset(memory, 0, count * sizeof(uint64_t));
    std::lock_guard lock(mutex_);
    host_words_.insert(memory);
    *words = static_cast<uint64_t*>(memory);
    return pfSuccess;
  }

  pfResult_t free_host_words(uint64_t* words) override {
    {
      std::lock_guard lock(mutex_);
      if (host_words_.erase(words) == 0)
        return fail(pfErrorInvalidArgument, "free_host_words: {} was not allocated by allocate_host_words",
                    static_cast<void*>(words));
    }
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    PF_CUDA_CHECK(cudaFreeHost(words));
    return pfSuccess;
  }

  pfResult_t write_word(Stream stream, uint64_t* word, uint64_t value) override {
    if (word == nullptr) return fail(pfErrorInvalidArgument, "write_word: word is null");
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    if (gate_mode_ == GateWriteMode::StreamWriteValue) {
      PF_DRIVER_CHECK(driver_api().stream_write_value64(static_cast<CUstream>(stream),
                                                        reinterpret_cast<CUdeviceptr>(word), value,
                                                        CU_STREAM_WRITE_VALUE_DEFAULT));
      return pfSuccess;
    }
    const size_t slot = next_gate_slot_.fetch_add(1, std::memory_order_relaxed) % kGateSlotCount;
    gate_slots_[slot] = value;
    PF_CUDA_CHECK(cudaMemcpyAsync(word, &gate_slots_[slot], sizeof(uint64_t), cudaMemcpyHostToDevice,
                                  static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  pfResult_t copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) override {
    if (word == nullptr || host == nullptr)
      return fail(pfErrorInvalidArgument, "copy_word_to_host: null word ({}) or host ({}) pointer",
                  static_cast<const void*>(word), static_cast<void*>(host));
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    PF_CUDA_CHECK(cudaMemcpyAsync(host, word, sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                  static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  // ---- Memory -------------------------------------------------------------------------------
  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) override {
    if (free_bytes == nullptr || total_bytes == nullptr)
      return fail(pfErrorInvalidArgument, "memory_info: null output pointer");
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    PF_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return pfSuccess;
  }

  pfResult_t allocate_arena(size_t bytes, void** base) override {
    if (base == nullptr) return fail(pfErrorInvalidArgument, "allocate_arena: base is null");
    // The size is the runtime's decision (by default min(2 GiB, free memory / 8), see
    // docs/cuda-backend.md "Memory"); the device has no default of its own to disagree with.
    if (bytes == 0)
      return fail(pfErrorInvalidArgument, "allocate_arena: bytes=0 (the caller sizes the arena)");
    size_t free_bytes = 0, total_bytes = 0;
    PF_TRY(memory_info(&free_bytes, &total_bytes));
    if (bytes > free_bytes)
      return fail(pfErrorOutOfMemory, "allocate_arena: {} bytes requested but only {} of {} bytes are free",
                  bytes, free_bytes, total_bytes);
    void* memory = nullptr;
    const cudaError_t error = cudaMalloc(&memory, bytes);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return fail(pfErrorOutOfMemory, "allocate_arena: cudaMalloc of {} bytes failed ({} bytes free)", bytes,
                  free_bytes);
    }
    PF_CUDA_CHECK(error);
    std::lock_guard lock(mutex_);
    arenas_[memory] = bytes;
    *base = memory;
    log::info("fill arena: {} bytes at {}", bytes, memory);
    return pfSuccess;
  }

  pfResult_t free_arena(void* base) override {
    {
      std::lock_guard lock(mutex_);
      if (arenas_.erase(base) == 0)
        return fail(pfErrorInvalidArgument, "free_arena: {} is not an arena of this device", base);
    }
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    PF_CUDA_CHECK(cudaFree(base));
    return pfSuccess;
  }

  // ---- SMs ----------------------------------------------------------------------------------
  pfResult_t configure_partition(int reserved_sms, FillPartition* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "configure_partition: partition is null");
    std::string source = "config";
    if (reserved_sms < 0) PF_TRY(reserved_sms_from_nccl_env(process_env(), &reserved_sms, &source));
    if (reserved_sms >= sm_count_ && source != "config") {
      log::warn("reserved SMs from {} ({}) leave no SM of {} for fill work; capping at {}", source,
                reserved_sms, sm_count_, sm_count_ - 1);
      reserved_sms = sm_count_ - 1;
    }
    PF_TRY(check_reserved_sms(reserved_sms, sm_count_));
    std::lock_guard lock(mutex_);
    if (partition_configured_) {
      if (partition_.reserved_sms >= reserved_sms || !fill_streams_.empty()) {
        *out = partition_;
        if (partition_.reserved_sms < reserved_sms)
          return fail(pfErrorInvalidState,
                      "configure_partition: fill streams already exist with {} reserved SMs; cannot raise to {}",
                      partition_.reserved_sms, reserved_sms);
        return pfSuccess;
      }
    }
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    destroy_green_context();  // re-partitioning before any fill stream exists
    FillPartition partition;
    partition.total_sms = sm_count_;
    PartitionOutcome outcome;
    try_green_context(reserved_sms, &partition, &outcome);
    if (outcome.cause != FallbackCause::None) {
      partition = FillPartition{};
      partition.total_sms = sm_count_;
      partition.mode = "grid-cap";
      partition.reserved_sms = reserved_sms;
      partition.fill_sms = sm_count_ - reserved_sms;
      log::info("fill partition: grid-cap mode, fill grids capped at {} of {} SMs (R={} from {}); {}",
                partition.fill_sms, sm_count_, reserved_sms, source, describe(outcome));
      if (!fallback_is_explained(driver_api().driver_version, outcome))
        log::warn("grid-cap mode on driver {} without an explained fallback ({}): this is a bug",
                  driver_api().driver_version, describe(outcome));
    } else {
      log::info("fill partition: green-context mode, fill work confined to {} of {} SMs (R={} from {}, "
                "rounded to {}); events: {}",
                partition.fill_sms, sm_count_, reserved_sms, source, partition.reserved_sms, outcome.detail);
    }
    if (single_connection_)
      log::warn("CUDA_DEVICE_MAX_CONNECTIONS=1 in {} mode: fill and main work may share one hardware "
                "queue, so a fill slice enqueued after the main stream's wait would start only once "
                "the gate is closed; the auto launch mode enqueues slices inline in pfBubbleBegin "
                "(see docs/cuda-backend.md)",
                partition.mode);
    partition_ = partition;
    outcome_ = outcome;
    partition_configured_ = true;
    *out = partition;
    return pfSuccess;
  }

  // ---- Calibration --------------------------------------------------------------------------
  // ---- Graph fill jobs (cuda/gated_graph.hpp) -------------------------------------------------
  pfResult_t prepare_graph_items(const GraphJobSpec& spec, std::unique_ptr<GraphItems>* out) override {
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    return make_gated_graph(spec, primary_, out);
  }

  // The slice's bubble id and budget go to the graph's words in fill-stream order, then one launch.
  pfResult_t launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice, Stream stream) override {
    if (!is_gated_graph(items))
      return fail(pfErrorInternal, "launch_graph_items: the items were not prepared by the CUDA device");
    uint64_t* words = gated_graph_slice_words(items);
    PF_TRY(write_word(stream, &words[0], slice.bubble_id));
    PF_TRY(write_word(stream, &words[1], slice.max_items));
    return launch_gated_graph(items, stream);
  }

  // A capture stream on the fill partition's context: the green context when there is one.
  pfResult_t create_capture_stream(Stream* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "create_capture_stream: out is null");
    PF_DEVICE_CONTEXT(ContextNeed::Primary);
    if (!partition_configured()) {
      FillPartition ignored;
      PF_TRY(configure_partition(-1, &ignored));
    }
    if (green_context_ == nullptr) {
      PF_TRY(create_stream(lowest_priority_, out));
    } else {
      CUstream raw = nullptr;
      PF_DRIVER_CHECK(driver_api().green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING,
                                                           lowest_priority_));
      std::lock_guard lock(mutex_);
      main_streams_.insert(reinterpret_cast<cudaStream_t>(raw));  // destroy_stream knows it
      *out = raw;
    }
    std::lock_guard lock(mutex_);
    capture_streams_.insert(static_cast<cudaStream_t>(*out));
    return pfSuccess;
  }

  // pfGraphCaptureContextPush: the capture stream's context (the green context in green-context
  // mode) pushed on the calling thread until the matching pop - through ScopedStreamContext, so
  // the push holds the process-wide green-context mutex (stream_context.hpp) like every other.
  pfResult_t push_capture_context(Stream stream) override {
    {
      std::lock_guard lock(mutex_);
      if (capture_streams_.count(static_cast<cudaStream_t>(stream)) == 0)
        return fail(pfErrorInvalidArgument,
                    "pfGraphCaptureContextPush: stream {} is not a capture stream of this runtime "
                    "(pfGraphCaptureStreamCreate)",
                    stream);
    }
    auto scope = std::make_unique<ScopedStreamContext>();
    PF_TRY(scope->enter(stream));
    capture_context_pushes().push_back({this, std::move(scope)});
    return pfSuccess;
  }

  pfResult_t pop_capture_context() override {
    auto& pushes = capture_context_pushes();
    if (pushes.empty() || pushes.back().device != this)
      return fail(pfErrorInvalidState,
                  "pfGraphCaptureContextPop: no pfGraphCaptureContextPush of this runtime is open on "
                  "the calling thread");
    pushes.pop_back();  // the scope pops the context it pushed (if it pushed one)
    return pfSuccess;
  }

  // ---- Main streams at bubble instructions --------------------------------------------------
  // A main stream of another context than the device's primary one (a torch green context's
  // stream, the NULL stream while such a context is current) gets the runtime's primary-context
  // begin/end events and gate writes: CUDA documents event and stream of one context. So the
  // first bubble on a stream of a new context runs the event and word-write self-tests for that
  // context, once, on a private stream of it (never the caller's stream); a context that fails, or
  // belongs to another device, is refused by name from then on (issue 24 item 4).
  pfResult_t admit_main_stream(Stream stream, uint64_t* identity) override {
    *identity = 0;
    PF_DEVICE_CONTEXT(ContextNeed::Any);
    const DriverApi& api = driver_api();
    if (api.stream_get_ctx != nullptr) {
      CUcontext context = nullptr;
      PF_DRIVER_CHECK(api.stream_get_ctx(static_cast<CUstream>(stream), &context));
      if (context != primary_ && context != nullptr) PF_TRY(check_main_context(context, stream));
    }
    if (api.stream_get_id != nullptr) {
      unsigned long long id = 0;
      PF_DRIVER_CHECK(api.stream_get_id(static_cast<CUstream>(stream), &id));
      *identity = static_cast<uint64_t>(id) + 1;  // 0 stays "not tracked"
    }
    return pfSuccess;
  }

  // cuStreamGetId gives every stream a process-unique id: a destroyed stream fails the query (the
  // driver no longer knows the handle) or, if the handle was reused, reports another id.
  bool main_stream_unchanged(Stream stream, uint64_t identity) const override {
    const DriverApi& api = driver_api();
    if (identity == 0 || api.stream_get_id == nullptr) return true;
    DeviceContextScope scope;
    if (scope.enter(primary_, cu_device_, ContextNeed::Any) != pfSuccess) {
      clear_last_error();
      return true;
    }
    unsigned long long id = 0;
    if (api.stream_get_id(static_cast<CUstream>(stream), &id) != CUDA_SUCCESS) return false;
    return static_cast<uint64_t>(id) + 1 == identity;
  }

  // ---- Launch callbacks -----------------------------------------------------------------------
  bool enter_launch_context() override {
    const DriverApi& api = driver_api();
    CUcontext current = nullptr;
    if (api.ctx_get_current == nullptr || api.ctx_get_current(&current) != CUDA_SUCCESS) return false;
    if (current == primary_) return false;
    const CUresult pushed = api.ctx_push_current(primary_);
    if (pushed != CUDA_SUCCESS) {
      log::warn("a launch callback runs without the device's primary context current: cuCtxPushCurrent "
                "failed: {}", driver_result_name(pushed));
      return false;
    }
    return true;
  }

  void leave_launch_context() override {
    CUcontext popped = nullptr;
    const CUresult result = driver_api().ctx_pop_current(&popped);
    if (result != CUDA_SUCCESS) log::warn("cuCtxPopCurrent after a launch callback failed: {}", driver_result_name(result));
  }

  pfResult_t collect_activity(std::vector<ActivityRecord>* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "collect_activity: out is null");
    if (!collector_)
      return fail(pfErrorNotSupported,
                  "collect_activity: calibration mode is off (PIPEFILL_CUPTI=1) or CUPTI could not start");
    return collector_->flush(out);
  }

  // ---- Clock --------------------------------------------------------------------------------
  double now_us() override {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
  }

 private:
  // The capture-context pushes open on this thread, innermost last (any CudaDevice of the process).
  struct CapturePush {
    const CudaDevice* device;
    std::unique_ptr<ScopedStreamContext> scope;
  };
  static std::vector<CapturePush>& capture_context_pushes() {
    thread_local std::vector<CapturePush> pushes;
    return pushes;
  }

  // admit_main_stream's verdict on a context other than the primary one, cached per context ("":
  // admitted; else why not). The first check of a context runs its self-tests (about a millisecond,
  // once per context and runtime, before the bubble's first event is recorded).
  pfResult_t check_main_context(CUcontext context, Stream stream) {
    MutexLock lock(main_contexts_mutex_);
    auto it = main_contexts_.find(context);
    if (it == main_contexts_.end()) it = main_contexts_.emplace(context, judge_main_context(context)).first;
    if (it->second.empty()) return pfSuccess;
    return fail(it->second.rfind("device", 0) == 0 ? pfErrorInvalidArgument : pfErrorNotSupported,
                "pfBubbleBegin: stream {} belongs to context {}, not to the primary context {} of the "
                "runtime's device {}: {}",
                stream, static_cast<void*>(context), static_cast<void*>(primary_), ordinal_, it->second);
  }

  // "" when the runtime's primary-context events and word writes work on streams of `context`.
  std::string judge_main_context(CUcontext context) {
    const DriverApi& api = driver_api();
    CUdevice device = 0;
    CUresult result = CUDA_ERROR_NOT_SUPPORTED;
    if (api.ctx_get_device_of != nullptr) {
      result = api.ctx_get_device_of(&device, context);
    } else {
      DeviceContextScope in_context;
      if (in_context.enter(context, cu_device_, ContextNeed::Primary) != pfSuccess) {
        std::string why = last_error_message();
        clear_last_error();
        return "its device could not be read (" + why + ")";
      }
      result = api.ctx_get_device(&device);
    }
    if (result != CUDA_SUCCESS) return "its device could not be read (cuCtxGetDevice: " + driver_result_name(result) + ")";
    if (device != cu_device_)
      return fmt::format("device handle {} is another device: mark bubbles on streams of the runtime's "
                         "device (config.device)", static_cast<int>(device));
    // A private stream of that context for the self-tests (created with the context current).
    cudaStream_t probe = nullptr;
    {
      DeviceContextScope in_context;
      if (in_context.enter(context, cu_device_, ContextNeed::Primary) != pfSuccess) {
        std::string why = last_error_message();
        clear_last_error();
        return "no stream of it could be made for the self-test (" + why + ")";
      }
      const cudaError_t made = cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking);
      if (made != cudaSuccess) {
        (void)cudaGetLastError();
        return fmt::format("no stream of it could be made for the self-test ({})", cudaGetErrorName(made));
      }
    }
    std::string verdict;
    {
      DeviceContextScope in_primary;  // the self-tests' own events and words are the runtime's
      if (in_primary.enter(primary_, cu_device_, ContextNeed::Primary) != pfSuccess) {
        verdict = last_error_message();
        clear_last_error();
      } else {
        const MemoryOpsVerdict memory = judge_memory_ops(run_memory_ops_self_test(probe));
        const bool writes = memory.usable && (gate_mode_ != GateWriteMode::StreamWriteValue || memory.stream_write);
        const std::string events = event_self_test_failure(run_event_self_test(probe));
        if (!writes)
          verdict = "the runtime's gate writes fail on its streams (" + memory.detail + ")";
        else if (!events.empty())
          verdict = "the runtime's primary-context events fail on its streams (" + events + ")";
      }
    }
    if (cudaStreamDestroy(probe) != cudaSuccess) (void)cudaGetLastError();
    if (!verdict.empty()) {
      verdict += "; mark bubbles on a stream of the primary context (a torch.cuda.Stream() made with no "
                 "green context current)";
      log::warn("main streams of context {} are refused: {}", static_cast<void*>(context), verdict);
    } else {
      log::info("main streams of context {} (not the primary context) passed the event and word-write "
                "self-tests", static_cast<void*>(context));
    }
    return verdict;
  }

  bool partition_configured() const {
    std::lock_guard lock(mutex_);
    return partition_configured_;
  }

  // Records the first reference event of the primary context and aligns it with the host clock.
  pfResult_t init_clock() {
    reference_.stream = control_stream_;
    return init_reference(reference_);
  }

  // Records `reference`'s first event on its stream (whose context must be current) and aligns
  // it with the host clock.
  pfResult_t init_reference(Reference& reference) {
    PF_CUDA_CHECK(cudaEventCreateWithFlags(&reference.event, cudaEventDefault));
    PF_CUDA_CHECK(cudaEventRecord(reference.event, reference.stream));
    PF_CUDA_CHECK(cudaEventSynchronize(reference.event));
    // The event completed a few µs before the host saw it: that is the alignment error.
    reference.time_us = now_us();
    return pfSuccess;
  }

  // Moves to a newer reference event when the current one is old (caller holds clock_mutex_).
  pfResult_t advance_reference_locked(Reference& reference) {
    if (reference.pending != nullptr) {
      cudaError_t error = cudaSuccess;
      if (query_event_state(reference.pending, &error) == EventState::Pending) return pfSuccess;
      PF_CUDA_CHECK(error);
      float elapsed_ms = 0.0f;
      PF_CUDA_CHECK(cudaEventElapsedTime(&elapsed_ms, reference.event, reference.pending));
      reference.time_us += static_cast<double>(elapsed_ms) * 1000.0;
      PF_CUDA_CHECK(cudaEventDestroy(reference.event));
      reference.event = reference.pending;
      reference.pending = nullptr;
      return pfSuccess;
    }
    if (now_us() - reference.time_us < kReferenceMaxAgeUs) return pfSuccess;
    if (&reference == &fill_reference_) {
      ScopedStreamContext scope;  // the fill reference is an event of the fill context
      PF_TRY(scope.enter(reference.stream));
      PF_CUDA_CHECK(cudaEventCreateWithFlags(&reference.pending, cudaEventDefault));
    } else {
      PF_CUDA_CHECK(cudaEventCreateWithFlags(&reference.pending, cudaEventDefault));
    }
    PF_CUDA_CHECK(cudaEventRecord(reference.pending, reference.stream));
    return pfSuccess;
  }

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
  LatestRecord latest_of(Event event) {
    auto cuda_event = static_cast<cudaEvent_t>(event);
    if (!per_context_events_) return {cuda_event, false};
    MutexLock lock(twins_mutex_);
    const auto it = twins_.find(cuda_event);
    if (it == twins_.end() || !it->second.latest_on_fill) return {cuda_event, false};
    return {it->second.event, true};
  }

  bool is_fill_stream(cudaStream_t stream) const {
    std::lock_guard lock(mutex_);
    return fill_streams_.count(stream) > 0 || stream == spare_fill_stream_;
  }

  // An event made with the fill context current (its reference stream's context).
  pfResult_t create_fill_context_event(cudaEvent_t* out) {
    ScopedStreamContext scope;
    PF_TRY(scope.enter(fill_reference_.stream));
    PF_CUDA_CHECK(cudaEventCreateWithFlags(out, cudaEventDefault));
    return pfSuccess;
  }

  // The self-test of the per-context path on the real pair: fill side records F (a fill-context
  // event) before the main side's kernel starts, waits for the main side's B (a primary-context
  // event, cross-context wait) and records C (fill context); elapsed(F, C) spans the kernel.
  EventSelfTest run_per_context_event_self_test(cudaStream_t fill) {
    EventSelfTest test;
    test.kernel_ms = static_cast<double>(kEventSelfTestKernelNs) / 1e6;
    cudaEvent_t f = nullptr, b = nullptr, c = nullptr;
    const auto ok = &self_test_step;
    bool good = true;
    {
      ScopedStreamContext scope;
      if (scope.enter(fill) != pfSuccess) {
        test.create_error = last_error_message();
        clear_last_error();
        good = false;
      }
      good = good && ok(&test.create_error, "cudaEventCreate(F, fill context)", cudaEventCreate(&f)) &&
             ok(&test.create_error, "cudaEventCreate(C, fill context)", cudaEventCreate(&c));
    }
    good = good && ok(&test.create_error, "cudaEventCreate(B)", cudaEventCreate(&b)) &&
           ok(&test.record_error, "cudaEventRecord(F, fill)", cudaEventRecord(f, fill));
    finish_event_self_test(&test, good, fill, f, "F", b, c);
    return test;
  }

  // After the per-context self-test passed: the fill reference on a stream of its own, aligned to
  // the primary clock (not to the host on its own: two host alignments differ by their wake-up
  // latencies, which biased late/overrun/filled figures - issue 24 item 8).
  pfResult_t enable_per_context_events() {
    CUstream raw = nullptr;
    PF_DRIVER_CHECK(driver_api().green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING,
                                                         lowest_priority_));
    std::lock_guard lock(clock_mutex_);  // before the push: query_event's order (clock, then push)
    fill_reference_.stream = reinterpret_cast<cudaStream_t>(raw);
    PF_TRY(align_fill_reference_locked());
    per_context_events_ = true;
    return pfSuccess;
  }

  // The fill reference F1 timed on the primary clock by a two-way exchange (clock_alignment.hpp):
  // B1 (primary) -> the fill reference stream waits for it -> F1, F2 (fill context) -> the control
  // stream waits for F2 -> B2 (primary). F1 lies in [B1, B2 - (F2 - F1)]; its time is the middle.
  // Caller holds clock_mutex_; the primary reference exists.
  pfResult_t align_fill_reference_locked() {
    cudaEvent_t b1 = nullptr, b2 = nullptr, f1 = nullptr, f2 = nullptr;
    const auto release = [&] {
      for (cudaEvent_t e : {b1, b2, f2})
        if (e != nullptr && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
    };
    const pfResult_t result = [&]() -> pfResult_t {
      {
        DeviceContextScope in_primary;
        PF_TRY(in_primary.enter(primary_, cu_device_, ContextNeed::Primary));
        PF_CUDA_CHECK(cudaEventCreateWithFlags(&b1, cudaEventDefault));
        PF_CUDA_CHECK(cudaEventCreateWithFlags(&b2, cudaEventDefault));
      }
      ScopedStreamContext in_fill;
      PF_TRY(in_fill.enter(fill_reference_.stream));
      PF_CUDA_CHECK(cudaEventCreateWithFlags(&f1, cudaEventDefault));
      PF_CUDA_CHECK(cudaEventCreateWithFlags(&f2, cudaEventDefault));
      PF_CUDA_CHECK(cudaEventRecord(b1, control_stream_));
      PF_CUDA_CHECK(cudaStreamWaitEvent(fill_reference_.stream, b1, 0));
      PF_CUDA_CHECK(cudaEventRecord(f1, fill_reference_.stream));
      PF_CUDA_CHECK(cudaEventRecord(f2, fill_reference_.stream));
      PF_CUDA_CHECK(cudaStreamWaitEvent(control_stream_, f2, 0));
      PF_CUDA_CHECK(cudaEventRecord(b2, control_stream_));
      PF_CUDA_CHECK(cudaEventSynchronize(b2));
      PF_TRY(advance_reference_locked(reference_));
      float b1_ms = 0.0f, b2_ms = 0.0f, f_ms = 0.0f;
      PF_CUDA_CHECK(cudaEventElapsedTime(&b1_ms, reference_.event, b1));
      PF_CUDA_CHECK(cudaEventElapsedTime(&b2_ms, reference_.event, b2));
      PF_CUDA_CHECK(cudaEventElapsedTime(&f_ms, f1, f2));
      const ClockAlignment aligned =
          align_second_clock(reference_.time_us + b1_ms * 1000.0, reference_.time_us + b2_ms * 1000.0, f_ms * 1000.0);
      fill_reference_.event = f1;
      fill_reference_.time_us = aligned.time_us;
      f1 = nullptr;  // now the fill reference
      log::info("fill-context clock aligned to the primary one within +-{:.2f} us", aligned.uncertainty_us);
      return pfSuccess;
    }();
    if (f1 != nullptr && cudaEventDestroy(f1) != cudaSuccess) (void)cudaGetLastError();
    release();
    return result;
  }

  // Undoes enable_per_context_events (with the green context, before any event exists).
  void disable_per_context_events() {
    per_context_events_ = false;
    std::lock_guard lock(clock_mutex_);
    for (cudaEvent_t* e : {&fill_reference_.pending, &fill_reference_.event})
      if (*e != nullptr && cudaEventDestroy(*e) != cudaSuccess) (void)cudaGetLastError();
    fill_reference_.pending = fill_reference_.event = nullptr;
    if (fill_reference_.stream != nullptr && cudaStreamDestroy(fill_reference_.stream) != cudaSuccess)
      (void)cudaGetLastError();
    fill_reference_.stream = nullptr;
  }

  // Chooses the gate write: cuStreamWriteValue64 when the entry point exists and a self-test
  // write lands; otherwise the pinned slot ring.
  pfResult_t init_gate_write() {
    void* slots = nullptr;
    PF_CUDA_CHECK(cudaHostAlloc(&slots, kGateSlotCount * sizeof(uint64_t), cudaHostAllocPortable));
    gate_slots_ = static_cast<uint64_t*>(slots);
    std::memset(gate_slots_, 0, kGateSlotCount * sizeof(uint64_t));
    gate_mode_ = GateWriteMode::PinnedCopy;
    const auto& api = driver_api();
    if (api.stream_write_value64 == nullptr) {
      log::info("cuStreamWriteValue64 unavailable (driver {}): gate writes copy from pinned slots",
                api.driver_version);
      return pfSuccess;
    }
    uint64_t* probe = nullptr;
    PF_TRY(allocate_words(1, &probe));
    constexpr uint64_t kProbeValue = 0x5049504546494c4cull;  // "PIPEFILL"
    uint64_t seen = 0;
    const CUresult write = api.stream_write_value64(reinterpret_cast<CUstream>(control_stream_),
                                                    reinterpret_cast<CUdeviceptr>(probe), kProbeValue,
                                                    CU_STREAM_WRITE_VALUE_DEFAULT);
    cudaError_t copy = cudaSuccess;
    if (write == CUDA_SUCCESS) {
      copy = cudaMemcpyAsync(&seen, probe, sizeof seen, cudaMemcpyDeviceToHost, control_stream_);
      if (copy == cudaSuccess) copy = cudaStreamSynchronize(control_stream_);
    }
    PF_TRY(free_words(probe));
    if (write == CUDA_SUCCESS && copy == cudaSuccess && seen == kProbeValue) {
      gate_mode_ = GateWriteMode::StreamWriteValue;
    } else {
      (void)cudaGetLastError();
      log::info("cuStreamWriteValue64 self-test failed (result {}, copy {}, value {:#x}): gate writes copy "
                "from pinned slots", static_cast<int>(write), cudaGetErrorName(copy), seen);
    }
    return pfSuccess;
  }

  // Sets up the green-context partition: a green context holding all SMs but R (R rounded up to
  // the partition granularity), its first fill stream with the fill kernels warmed up on it, and
  // the cross-context event self-test. On any failure it destroys what it made and *outcome says
  // why; the caller then uses grid-cap mode. The tested stream is kept for create_fill_stream.
  void try_green_context(int reserved_sms, FillPartition* partition, PartitionOutcome* outcome) {
    const auto& api = driver_api();
    if (env_off("PIPEFILL_GREEN_CONTEXT")) {
      *outcome = {FallbackCause::DisabledByEnv, ""};
      return;
    }
    if (api.driver_version == 0) {
      *outcome = {FallbackCause::NoDriver, ""};
      return;
    }
    if (api.driver_version < kGreenContextDriverVersion) {
      *outcome = {FallbackCause::DriverTooOld, fmt::format("driver {}", api.driver_version)};
      return;
    }
    if (!api.has_green_contexts()) {
      *outcome = {FallbackCause::EntryPointsMissing,
                  fmt::format("driver {} lacks {}", api.driver_version,
                              api.missing_entry_points(EntryPointGroup::GreenContext))};
      return;
    }
    std::string why_no_split;
    if (create_green_context(reserved_sms, partition, &why_no_split) != pfSuccess) {
      *outcome = {FallbackCause::DriverCallFailed, last_error_message()};
      clear_last_error();
      destroy_green_context();
      return;
    }
    if (green_context_ == nullptr) {
      *outcome = {FallbackCause::NoUsefulSplit, why_no_split};
      return;
    }
    CUstream raw = nullptr;
    const CUresult created =
        api.green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING, lowest_priority_);
    if (created != CUDA_SUCCESS) {
      *outcome = {FallbackCause::StreamCreationFailed,
                  fmt::format("cuGreenCtxStreamCreate: {}", driver_result_name(created))};
      destroy_green_context();
      return;
    }
    spare_fill_stream_ = reinterpret_cast<cudaStream_t>(raw);
    if (warm_up_fill_kernels(spare_fill_stream_) != pfSuccess) {
      *outcome = {FallbackCause::WarmUpFailed, last_error_message()};
      clear_last_error();
      destroy_green_context();
      return;
    }
    const MemoryOpsVerdict memory = judge_memory_ops(run_memory_ops_self_test(spare_fill_stream_));
    if (!memory.usable) {
      *outcome = {FallbackCause::MemoryOpsSelfTestFailed, memory.detail};
      destroy_green_context();
      return;
    }
    // Applied once the green context is accepted (grid-cap mode keeps the control stream's test):
    // one write mode for every stream, the pinned copy working on the main streams as well.
    const auto accept_word_writes = [&] {
      if (gate_mode_ != GateWriteMode::StreamWriteValue || memory.stream_write) return;
      gate_mode_ = GateWriteMode::PinnedCopy;
      log::info("word writes on every stream copy from pinned slots: {}", memory.detail);
    };
    const EventSelfTest test = run_event_self_test(spare_fill_stream_);
    if (std::string failure = event_self_test_failure(test); !failure.empty()) {
      // Primary-context events on green streams fail: per-context event pools, if they work.
      const EventSelfTest own = run_per_context_event_self_test(spare_fill_stream_);
      std::string own_failure = event_self_test_failure(own);
      if (own_failure.empty() && enable_per_context_events() != pfSuccess) {
        own_failure = last_error_message();
        clear_last_error();
      }
      if (!own_failure.empty()) {
        *outcome = {FallbackCause::EventSelfTestFailed,
                    fmt::format("primary-context events on the green-context stream: {}; per-context "
                                "events: {}",
                                failure, own_failure)};
        destroy_green_context();
        return;
      }
      *outcome = {FallbackCause::None,
                  fmt::format("per-context event pools: fill-stream records use events of the green "
                              "context, timed against a green-context reference (primary-context events "
                              "on the green-context stream failed: {}; per-context self-test: fill-side "
                              "event {:.3f} ms after its start, main kernel {:.3f} ms)",
                              failure, own.elapsed_ms, own.kernel_ms)};
      accept_word_writes();
      return;
    }
    accept_word_writes();
    *outcome = {FallbackCause::None,
                fmt::format("primary-context events on green-context streams (self-test: fill-side event "
                            "{:.3f} ms after the main-side start, main kernel {:.3f} ms)",
                            test.elapsed_ms, test.kernel_ms)};
  }

  // The green context itself. Leaves green_context_ null (and explains in *why_not) when no
  // split leaves R SMs; a failing driver call returns its error.
  pfResult_t create_green_context(int reserved_sms, FillPartition* partition, std::string* why_not) {
    const auto& api = driver_api();
    CUdevice device = 0;
    PF_DRIVER_CHECK(api.device_get(&device, ordinal_));
    CUdevResource sms{};
    PF_DRIVER_CHECK(api.device_get_dev_resource(device, &sms, CU_DEV_RESOURCE_TYPE_SM));
    const SmGranularity granularity{static_cast<int>(sms.sm.minSmPartitionSize),
                                    static_cast<int>(sms.sm.smCoscheduledAlignment)};
    const int total = static_cast<int>(sms.sm.smCount);
    int want = plan_fill_sms(total, reserved_sms, granularity);
    log::debug("SM resource: {} SMs, min partition {}, alignment {}; want {} fill SMs", total,
               granularity.min_partition, granularity.alignment, want);
    if (reserved_sms > 0 && want > 0) {
      // The main job's SMs first, fill work on the remainder: the same split by count that
      // torch's GreenContext.create(num_sms=R) makes (docs/pytorch.md, "Torch green contexts"),
      // so a main job confined to such a context and the fill partition never share an SM.
      CUdevResource main_group{}, rest{};
      unsigned groups = 1;
      PF_DRIVER_CHECK(api.dev_sm_resource_split_by_count(&main_group, &groups, &sms, &rest, 0,
                                                         static_cast<unsigned>(reserved_sms)));
      const int got = static_cast<int>(rest.sm.smCount);
      if (groups == 1 && got >= granularity.min_partition && total - got >= reserved_sms) {
        CUdevResourceDesc desc = nullptr;
        PF_DRIVER_CHECK(api.dev_resource_generate_desc(&desc, &rest, 1));
        CUgreenCtx green = nullptr;
        PF_DRIVER_CHECK(api.green_ctx_create(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
        green_context_ = green;
        partition->hardware_confined = true;
        partition->mode = "green-context";
        partition->fill_sms = got;
        partition->reserved_sms = total - got;
        return pfSuccess;
      }
      log::debug("the remainder of a {}-SM main group has {} SMs: splitting the fill group off "
                 "instead", reserved_sms, got);
    }
    // The split rounds its minimum count up; step down until the group leaves R SMs free.
    while (want > 0) {
      CUdevResource group{}, rest{};
      unsigned groups = 1;
      PF_DRIVER_CHECK(api.dev_sm_resource_split_by_count(&group, &groups, &sms, &rest, 0,
                                                         static_cast<unsigned>(want)));
      const int got = groups == 1 ? static_cast<int>(group.sm.smCount) : 0;
      if (got > 0 && total - got >= reserved_sms) {
        CUdevResourceDesc desc = nullptr;
        PF_DRIVER_CHECK(api.dev_resource_generate_desc(&desc, &group, 1));
        CUgreenCtx green = nullptr;
        PF_DRIVER_CHECK(api.green_ctx_create(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
        green_context_ = green;
        partition->hardware_confined = true;
        partition->mode = "green-context";
        partition->fill_sms = got;
        partition->reserved_sms = total - got;
        return pfSuccess;
      }
      want -= granularity.alignment > 0 ? granularity.alignment : 1;
      if (want < granularity.min_partition) break;
    }
    *why_not = fmt::format("no SM split of {} SMs (min partition {}, alignment {}) leaves {} SMs reserved",
                           total, granularity.min_partition, granularity.alignment, reserved_sms);
    return pfSuccess;
  }

  // Destroys the spare fill stream and the green context (no fill stream may exist). Caller
  // holds mutex_ or is the only thread using the device.
  void destroy_green_context() {
    disable_per_context_events();
    if (spare_fill_stream_ != nullptr) {
      if (cudaStreamDestroy(spare_fill_stream_) != cudaSuccess) (void)cudaGetLastError();
      spare_fill_stream_ = nullptr;
    }
    if (green_context_ != nullptr) {
      const CUresult result = driver_api().green_ctx_destroy(green_context_);
      if (result != CUDA_SUCCESS) log::warn("cuGreenCtxDestroy failed: {}", driver_result_name(result));
      green_context_ = nullptr;
    }
  }

  // The fill stream's word operations, checked once on the real stream (fallbacks.hpp says what
  // and why). Raw allocations: the caller holds mutex_, which allocate_words takes.
  MemoryOpsSelfTest run_memory_ops_self_test(cudaStream_t fill) {
    MemoryOpsSelfTest test;
    constexpr uint64_t kSentinel = 0x5E5E5E5E5E5E5E5Eull;
    constexpr uint64_t kWritten = 0x5049504546494c4cull;  // "PIPEFILL"
    constexpr uint64_t kCopied = 0x434f5059574f5244ull;   // "COPYWORD"
    void* probe = nullptr;
    void* host = nullptr;  // [0]: read-back target, [1]: pinned source of the copy
    auto name = [](const char* call, cudaError_t error) {
      (void)cudaGetLastError();
      return fmt::format("{}: {}", call, cudaGetErrorName(error));
    };
    cudaError_t error = cudaMalloc(&probe, sizeof(uint64_t));
    if (error == cudaSuccess) error = cudaHostAlloc(&host, 2 * sizeof(uint64_t), cudaHostAllocPortable);
    if (error == cudaSuccess) error = cudaMemsetAsync(probe, 0, sizeof(uint64_t), control_stream_);
    if (error == cudaSuccess) error = cudaStreamSynchronize(control_stream_);
    if (error != cudaSuccess) {
      test.readback_error = name("setting up the probe word", error);
    } else {
      auto* words = static_cast<volatile uint64_t*>(host);
      // Copies `probe` to words[0] on the fill stream and waits; "" or the failing call.
      auto read_back = [&](uint64_t* seen) -> std::string {
        words[0] = kSentinel;
        cudaError_t e = cudaMemcpyAsync(host, probe, sizeof(uint64_t), cudaMemcpyDeviceToHost, fill);
        if (e != cudaSuccess) return name("cudaMemcpyAsync(pinned <- probe, fill stream)", e);
        e = cudaStreamSynchronize(fill);
        if (e != cudaSuccess) return name("cudaStreamSynchronize(fill stream)", e);
        *seen = words[0];
        return "";
      };
      uint64_t seen = kSentinel;
      test.readback_error = read_back(&seen);
      test.readback_landed = test.readback_error.empty() && seen == 0;
      test.stream_write_tried = gate_mode_ == GateWriteMode::StreamWriteValue;
      if (test.readback_landed && test.stream_write_tried) {
        const CUresult write = driver_api().stream_write_value64(
            reinterpret_cast<CUstream>(fill), reinterpret_cast<CUdeviceptr>(probe), kWritten,
            CU_STREAM_WRITE_VALUE_DEFAULT);
        if (write != CUDA_SUCCESS) {
          test.stream_write_error = fmt::format("cuStreamWriteValue64(fill stream): {}", driver_result_name(write));
        } else {
          test.stream_write_error = read_back(&seen);
          test.stream_write_landed = test.stream_write_error.empty() && seen == kWritten;
        }
      }
      if (test.readback_landed) {
        words[1] = kCopied;
        const cudaError_t copy = cudaMemcpyAsync(probe, static_cast<uint64_t*>(host) + 1, sizeof(uint64_t),
                                                 cudaMemcpyHostToDevice, fill);
        if (copy != cudaSuccess) {
          test.pinned_copy_error = name("cudaMemcpyAsync(probe <- pinned slot, fill stream)", copy);
        } else {
          test.pinned_copy_error = read_back(&seen);
          test.pinned_copy_landed = test.pinned_copy_error.empty() && seen == kCopied;
        }
      }
    }
    if (cudaStreamSynchronize(fill) != cudaSuccess) (void)cudaGetLastError();
    if (probe != nullptr && cudaFree(probe) != cudaSuccess) (void)cudaGetLastError();
    if (host != nullptr && cudaFreeHost(host) != cudaSuccess) (void)cudaGetLastError();
    return test;
  }

  // The runtime records primary-context events (its slice events) on the fill stream and times
  // them against primary-context events (the reference, the bubble's begin/end); cudaEventRecord
  // documents event and stream from the same context. Checked here once, on the real pair.
  EventSelfTest run_event_self_test(cudaStream_t fill) {
    EventSelfTest test;
    test.kernel_ms = static_cast<double>(kEventSelfTestKernelNs) / 1e6;
    cudaEvent_t a = nullptr, b = nullptr, c = nullptr;
    const auto ok = &self_test_step;
    bool good = ok(&test.create_error, "cudaEventCreate(A)", cudaEventCreate(&a)) &&
                ok(&test.create_error, "cudaEventCreate(B)", cudaEventCreate(&b)) &&
                ok(&test.create_error, "cudaEventCreate(C)", cudaEventCreate(&c)) &&
                ok(&test.create_error, "cudaEventRecord(A, main)", cudaEventRecord(a, control_stream_));
    finish_event_self_test(&test, good, fill, a, "A", b, c);
    return test;
  }

  // One step of an event self-test: true on success, else the call and its error in *slot.
  static bool self_test_step(std::string* slot, const char* call, cudaError_t error) {
    if (error == cudaSuccess) return true;
    (void)cudaGetLastError();
    *slot = fmt::format("{}: {}", call, cudaGetErrorName(error));
    return false;
  }

  // The shared second half of both event self-tests, after `first` was recorded on its stream:
  // a kernel of known length on the main side, B recorded after it, the fill stream waiting for
  // B and recording C; elapsed(first, C) must span the kernel. Destroys the three events.
  void finish_event_self_test(EventSelfTest* test, bool good, cudaStream_t fill, cudaEvent_t first,
                              const char* first_name, cudaEvent_t b, cudaEvent_t c) {
    const auto ok = &self_test_step;
    if (good && launch_spin_and_stamp(control_stream_, kEventSelfTestKernelNs, nullptr) != pfSuccess) {
      test->create_error = last_error_message();
      clear_last_error();
      good = false;
    }
    good = good && ok(&test->create_error, "cudaEventRecord(B, main)", cudaEventRecord(b, control_stream_)) &&
           ok(&test->wait_error, "cudaStreamWaitEvent(fill, B)", cudaStreamWaitEvent(fill, b, 0)) &&
           ok(&test->record_error, "cudaEventRecord(C, fill)", cudaEventRecord(c, fill)) &&
           ok(&test->sync_error, "cudaEventSynchronize(C)", cudaEventSynchronize(c));
    float elapsed_ms = -1.0f;
    const std::string elapsed_call = fmt::format("cudaEventElapsedTime({}, C)", first_name);
    if (good && ok(&test->elapsed_error, elapsed_call.c_str(), cudaEventElapsedTime(&elapsed_ms, first, c)))
      test->elapsed_ms = elapsed_ms;
    if (cudaStreamSynchronize(control_stream_) != cudaSuccess) (void)cudaGetLastError();
    if (cudaStreamSynchronize(fill) != cudaSuccess) (void)cudaGetLastError();
    for (cudaEvent_t e : {first, b, c})
      if (e != nullptr && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  }

  void shutdown() {
    // Best effort: the device is going away; failures are logged, never thrown.
    if (ordinal_ < 0 || primary_ == nullptr) return;
    shutdown_in_primary_context();
    const CUresult released = driver_api().device_primary_ctx_release(cu_device_);
    if (released != CUDA_SUCCESS) log::warn("cuDevicePrimaryCtxRelease failed: {}", driver_result_name(released));
    primary_ = nullptr;
  }

  void shutdown_in_primary_context() {
    DeviceContextScope scope;
    if (scope.enter(primary_, cu_device_, ContextNeed::Primary) != pfSuccess) clear_last_error();
    for (cudaStream_t stream : fill_streams_) (void)cudaStreamDestroy(stream);
    for (cudaStream_t stream : main_streams_) (void)cudaStreamDestroy(stream);
    for (void* words : device_words_) (void)cudaFree(words);
    for (void* words : host_words_) (void)cudaFreeHost(words);
    for (auto& [base, bytes] : arenas_) (void)cudaFree(base);
    {
      MutexLock lock(twins_mutex_);
      for (auto& [event, twin] : twins_) (void)cudaEventDestroy(twin.event);  // events left behind
      twins_.clear();
    }
    if (reference_.pending) (void)cudaEventDestroy(reference_.pending);
    if (reference_.event) (void)cudaEventDestroy(reference_.event);
    if (control_stream_) (void)cudaStreamDestroy(control_stream_);
    if (gate_slots_) (void)cudaFreeHost(gate_slots_);
    destroy_green_context();  // after its streams
    collector_.reset();
    (void)cudaGetLastError();
  }

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
  cudaStream_t spare_fill_stream_ = nullptr;  // tested by configure_partition, not yet handed out
  PartitionOutcome outcome_;
  bool single_connection_ = false;

  std::unique_ptr<ActivityCollector> collector_;
};

}  // namespace
}  // namespace cuda

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

pfResult_t make_cuda_device(const RuntimeOptions& options, std::unique_ptr<Device>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "make_cuda_device: out is null");
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(pfErrorNoDevice, "no usable CUDA device: cudaGetDeviceCount failed with {} ({})",
                cudaGetErrorName(error), cudaGetErrorString(error));
  }
  if (count == 0) return fail(pfErrorNoDevice, "no usable CUDA device: cudaGetDeviceCount reported 0 devices");
  int ordinal = options.device;
  std::string source = "config.device / PIPEFILL_DEVICE";
  if (!options.device_given) {
    PF_TRY(cuda::caller_device_ordinal(cuda::driver_api(), count, &ordinal, &source));
  } else if (options.device < 0 || options.device >= count) {
    return fail(pfErrorInvalidArgument, "device={} is out of range: {} CUDA device(s) visible", options.device,
                count);
  }
  auto device = std::make_unique<cuda::CudaDevice>();
  PF_TRY(device->init(options, ordinal, source));
  *out = std::move(device);
  return pfSuccess;
}

}  // namespace pipefill
