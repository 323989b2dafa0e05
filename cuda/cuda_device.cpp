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
#include "core/config.hpp"
#include "cuda_check.hpp"
#include "cupti_collector.hpp"
#include "driver_api.hpp"
#include "event_query.hpp"
#include "fallbacks.hpp"
#include "fill_kernels.hpp"
#include "gated_graph.hpp"
#include "partition.hpp"

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

class CudaDevice final : public Device, public CudaDeviceExtras {
 public:
  ~CudaDevice() override { shutdown(); }

  pfResult_t init(const RuntimeOptions& options) {
    ordinal_ = options.device;
    origin_ = std::chrono::steady_clock::now();  // the device clock's origin (CUPTI aligns to it)
    // CUPTI first: activity must be enabled before the work it should see.
    if (options.enable_cupti || env_flag("PIPEFILL_CUPTI")) {
      if (start_cupti_collector([this] { return now_us(); }, &collector_) != pfSuccess) {
        collector_.reset();  // warned once inside; events only
        clear_last_error();
      }
    }
    PF_CUDA_CHECK(cudaSetDevice(ordinal_));
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
    log::info("CUDA device {} '{}': {} SMs, stream priorities {}..{} (lowest..highest), gate write {}, "
              "CUDA_DEVICE_MAX_CONNECTIONS={}, CUPTI {}",
              ordinal_, name_, sm_count_, lowest_priority_, highest_priority_,
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
  // One connection only matters where the fill streams share the primary context's queue: in
  // green-context mode they belong to another context (docs/cuda-backend.md).
  bool single_hardware_queue() const override {
    return single_connection_ && !partition_.hardware_confined;
  }

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
    PF_TRY(bind());
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
    PF_TRY(bind());
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
      if (!fill && !main)
        return fail(pfErrorInvalidArgument, "destroy_stream: stream {} was not created by this device",
                    stream);
    }
    PF_TRY(bind());
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
    PF_TRY(bind());
    PF_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  // ---- Events -------------------------------------------------------------------------------
  pfResult_t create_event(Event* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "create_event: out is null");
    PF_TRY(bind());
    cudaEvent_t event = nullptr;
    PF_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDefault));  // timing enabled
    *out = event;
    return pfSuccess;
  }

  pfResult_t destroy_event(Event event) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "destroy_event: event is null");
    PF_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
    return pfSuccess;
  }

  pfResult_t record_event(Event event, Stream stream) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "record_event: event is null");
    PF_TRY(bind());
    PF_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  pfResult_t stream_wait_event(Stream stream, Event event) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "stream_wait_event: event is null");
    PF_TRY(bind());
    PF_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
    return pfSuccess;
  }

  pfResult_t query_event(Event event, bool* done, double* time_us) override {
    if (event == nullptr || done == nullptr || time_us == nullptr)
      return fail(pfErrorInvalidArgument, "query_event: null argument (event {})", event);
    auto cuda_event = static_cast<cudaEvent_t>(event);
    cudaError_t error = cudaSuccess;
    const EventState state = query_event_state(cuda_event, &error);  // clears NotReady
    if (state == EventState::Pending) {
      *done = false;
      return pfSuccess;
    }
    PF_CUDA_CHECK(error);
    std::lock_guard lock(clock_mutex_);
    PF_TRY(advance_reference_locked());
    float elapsed_ms = 0.0f;
    const cudaError_t timing = cudaEventElapsedTime(&elapsed_ms, reference_event_, cuda_event);
    if (timing == cudaErrorInvalidResourceHandle) {
      (void)cudaGetLastError();
      return fail(pfErrorInvalidState, "query_event: event {} has never been recorded", event);
    }
    PF_CUDA_CHECK(timing);
    *done = true;
    *time_us = reference_time_us_ + static_cast<double>(elapsed_ms) * 1000.0;
    return pfSuccess;
  }

  pfResult_t synchronize_event(Event event) override {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "synchronize_event: event is null");
    PF_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
    return pfSuccess;
  }

  // ---- Device words -------------------------------------------------------------------------
  pfResult_t allocate_words(size_t count, uint64_t** words) override {
    if (words == nullptr || count == 0)
      return fail(pfErrorInvalidArgument, "allocate_words: count={} (must be > 0) or null output", count);
    PF_TRY(bind());
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
    PF_TRY(bind());
    PF_CUDA_CHECK(cudaFree(words));
    return pfSuccess;
  }

  pfResult_t allocate_host_words(size_t count, uint64_t** words) override {
    if (words == nullptr || count == 0)
      return fail(pfErrorInvalidArgument, "allocate_host_words: count={} (must be > 0) or null output", count);
    PF_TRY(bind());
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
    PF_CUDA_CHECK(cudaFreeHost(words));
    return pfSuccess;
  }

  pfResult_t write_word(Stream stream, uint64_t* word, uint64_t value) override {
    if (word == nullptr) return fail(pfErrorInvalidArgument, "write_word: word is null");
    // Also makes this device current on the calling thread (the executor thread's launch
    // callbacks follow a budget write and launch kernels on this device).
    PF_TRY(bind());
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
    PF_TRY(bind());
    PF_CUDA_CHECK(cudaMemcpyAsync(host, word, sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                  static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  // ---- Memory -------------------------------------------------------------------------------
  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) override {
    if (free_bytes == nullptr || total_bytes == nullptr)
      return fail(pfErrorInvalidArgument, "memory_info: null output pointer");
    PF_TRY(bind());
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
    PF_TRY(bind());
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
    PF_TRY(bind());
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
      if (single_connection_)
        log::warn("CUDA_DEVICE_MAX_CONNECTIONS=1 in grid-cap mode: fill and main streams share one "
                  "hardware queue, so a fill slice enqueued after the main stream's gate close starts "
                  "only once the gate is closed and runs no item (see docs/cuda-backend.md)");
    } else {
      log::info("fill partition: green-context mode, fill work confined to {} of {} SMs (R={} from {}, "
                "rounded to {}); events: {}",
                partition.fill_sms, sm_count_, reserved_sms, source, partition.reserved_sms, outcome.detail);
    }
    partition_ = partition;
    outcome_ = outcome;
    partition_configured_ = true;
    *out = partition;
    return pfSuccess;
  }

  // ---- Calibration --------------------------------------------------------------------------
  // ---- Graph fill jobs (cuda/gated_graph.hpp) -------------------------------------------------
  pfResult_t prepare_graph_items(const GraphJobSpec& spec, std::unique_ptr<GraphItems>* out) override {
    PF_TRY(bind());
    return make_gated_graph(spec, out);
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
    PF_TRY(bind());
    if (!partition_configured()) {
      FillPartition ignored;
      PF_TRY(configure_partition(-1, &ignored));
    }
    if (green_context_ == nullptr) return create_stream(lowest_priority_, out);
    CUstream raw = nullptr;
    PF_DRIVER_CHECK(driver_api().green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING,
                                                         lowest_priority_));
    std::lock_guard lock(mutex_);
    main_streams_.insert(reinterpret_cast<cudaStream_t>(raw));  // destroy_stream knows it
    *out = raw;
    return pfSuccess;
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
  // Makes this device current on the calling thread (cheap when it already is). The API and
  // executor threads may call in with another device current.
  pfResult_t bind() {
    PF_CUDA_CHECK(cudaSetDevice(ordinal_));
    return pfSuccess;
  }

  bool partition_configured() const {
    std::lock_guard lock(mutex_);
    return partition_configured_;
  }

  // Records the first reference event and aligns it with the host clock.
  pfResult_t init_clock() {
    PF_CUDA_CHECK(cudaEventCreateWithFlags(&reference_event_, cudaEventDefault));
    PF_CUDA_CHECK(cudaEventRecord(reference_event_, control_stream_));
    PF_CUDA_CHECK(cudaEventSynchronize(reference_event_));
    // The event completed a few µs before the host saw it: that is the alignment error.
    reference_time_us_ = now_us();
    return pfSuccess;
  }

  // Moves to a newer reference event when the current one is old (caller holds clock_mutex_).
  pfResult_t advance_reference_locked() {
    if (pending_reference_ != nullptr) {
      cudaError_t error = cudaSuccess;
      if (query_event_state(pending_reference_, &error) == EventState::Pending) return pfSuccess;
      PF_CUDA_CHECK(error);
      float elapsed_ms = 0.0f;
      PF_CUDA_CHECK(cudaEventElapsedTime(&elapsed_ms, reference_event_, pending_reference_));
      reference_time_us_ += static_cast<double>(elapsed_ms) * 1000.0;
      PF_CUDA_CHECK(cudaEventDestroy(reference_event_));
      reference_event_ = pending_reference_;
      pending_reference_ = nullptr;
      return pfSuccess;
    }
    if (now_us() - reference_time_us_ < kReferenceMaxAgeUs) return pfSuccess;
    PF_CUDA_CHECK(cudaEventCreateWithFlags(&pending_reference_, cudaEventDefault));
    PF_CUDA_CHECK(cudaEventRecord(pending_reference_, control_stream_));
    return pfSuccess;
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
    const EventSelfTest test = run_event_self_test(spare_fill_stream_);
    if (std::string failure = event_self_test_failure(test); !failure.empty()) {
      *outcome = {FallbackCause::EventSelfTestFailed, std::move(failure)};
      destroy_green_context();
      return;
    }
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

  // The runtime records primary-context events (its slice events) on the fill stream and times
  // them against primary-context events (the reference, the bubble's begin/end); cudaEventRecord
  // documents event and stream from the same context. Checked here once, on the real pair.
  EventSelfTest run_event_self_test(cudaStream_t fill) {
    EventSelfTest test;
    test.kernel_ms = static_cast<double>(kEventSelfTestKernelNs) / 1e6;
    cudaEvent_t a = nullptr, b = nullptr, c = nullptr;
    auto ok = [](std::string* slot, const char* call, cudaError_t error) {
      if (error == cudaSuccess) return true;
      (void)cudaGetLastError();
      *slot = fmt::format("{}: {}", call, cudaGetErrorName(error));
      return false;
    };
    bool good = ok(&test.create_error, "cudaEventCreate(A)", cudaEventCreate(&a)) &&
                ok(&test.create_error, "cudaEventCreate(B)", cudaEventCreate(&b)) &&
                ok(&test.create_error, "cudaEventCreate(C)", cudaEventCreate(&c)) &&
                ok(&test.create_error, "cudaEventRecord(A, main)", cudaEventRecord(a, control_stream_));
    if (good && launch_spin_and_stamp(control_stream_, kEventSelfTestKernelNs, nullptr) != pfSuccess) {
      test.create_error = last_error_message();
      clear_last_error();
      good = false;
    }
    good = good && ok(&test.create_error, "cudaEventRecord(B, main)", cudaEventRecord(b, control_stream_)) &&
           ok(&test.wait_error, "cudaStreamWaitEvent(fill, B)", cudaStreamWaitEvent(fill, b, 0)) &&
           ok(&test.record_error, "cudaEventRecord(C, fill)", cudaEventRecord(c, fill)) &&
           ok(&test.sync_error, "cudaEventSynchronize(C)", cudaEventSynchronize(c));
    float elapsed_ms = -1.0f;
    if (good && ok(&test.elapsed_error, "cudaEventElapsedTime(A, C)", cudaEventElapsedTime(&elapsed_ms, a, c)))
      test.elapsed_ms = elapsed_ms;
    if (cudaStreamSynchronize(control_stream_) != cudaSuccess) (void)cudaGetLastError();
    if (cudaStreamSynchronize(fill) != cudaSuccess) (void)cudaGetLastError();
    for (cudaEvent_t e : {a, b, c})
      if (e != nullptr && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
    return test;
  }

  void shutdown() {
    // Best effort: the device is going away; failures are logged, never thrown.
    if (ordinal_ < 0) return;
    if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
    for (cudaStream_t stream : fill_streams_) (void)cudaStreamDestroy(stream);
    for (cudaStream_t stream : main_streams_) (void)cudaStreamDestroy(stream);
    for (void* words : device_words_) (void)cudaFree(words);
    for (void* words : host_words_) (void)cudaFreeHost(words);
    for (auto& [base, bytes] : arenas_) (void)cudaFree(base);
    if (pending_reference_) (void)cudaEventDestroy(pending_reference_);
    if (reference_event_) (void)cudaEventDestroy(reference_event_);
    if (control_stream_) (void)cudaStreamDestroy(control_stream_);
    if (gate_slots_) (void)cudaFreeHost(gate_slots_);
    destroy_green_context();  // after its streams
    collector_.reset();
    (void)cudaGetLastError();
  }

  int ordinal_ = -1;
  std::string name_;
  int sm_count_ = 0;
  int lowest_priority_ = 0;
  int highest_priority_ = 0;
  cudaStream_t control_stream_ = nullptr;  // setup work and reference events

  std::mutex clock_mutex_;
  std::chrono::steady_clock::time_point origin_;
  cudaEvent_t reference_event_ = nullptr;
  double reference_time_us_ = 0.0;
  cudaEvent_t pending_reference_ = nullptr;

  GateWriteMode gate_mode_ = GateWriteMode::PinnedCopy;
  uint64_t* gate_slots_ = nullptr;
  std::atomic<size_t> next_gate_slot_{0};

  mutable std::mutex mutex_;
  std::set<cudaStream_t> fill_streams_;
  std::set<cudaStream_t> main_streams_;
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
  if (options.device < 0 || options.device >= count)
    return fail(pfErrorInvalidArgument, "device={} is out of range: {} CUDA device(s) visible", options.device,
                count);
  auto device = std::make_unique<cuda::CudaDevice>();
  PF_TRY(device->init(options));
  *out = std::move(device);
  return pfSuccess;
}

}  // namespace pipefill
