#include "cupti_collector.hpp"


#include <atomic>
#include <cstdlib>
#include <mutex>

#include "common/log.hpp"
#include "cuda_check.hpp"
#include "cupti_api.hpp"
#include "cupti_convert.hpp"
#include "driver_api.hpp"

namespace pipefill::cuda {
namespace {

constexpr size_t kBufferBytes = size_t{4} << 20;  // Kineto's buffer size
constexpr size_t kBufferAlignment = 8;            // CUPTI requires 8-byte aligned buffers

// The context `stream` belongs to: a green-context stream's is its green context (as a
// CUcontext), any other stream's the context current when it was created.
pfResult_t stream_context(CUstream stream, CUcontext* context) {
  const DriverApi& api = driver_api();
  if (api.stream_get_ctx != nullptr) {
    PF_DRIVER_CHECK(api.stream_get_ctx(stream, context));
    return pfSuccess;
  }
  if (api.ctx_get_current == nullptr)
    return fail(pfErrorNotSupported, "CUPTI fill-stream registration: the driver has neither cuStreamGetCtx "
                                     "nor cuCtxGetCurrent");
  PF_DRIVER_CHECK(api.ctx_get_current(context));
  return pfSuccess;
}

class CuptiCollector;
// CUPTI's buffer callbacks are plain functions: they reach the (single) live collector here.
std::mutex g_active_mutex;
CuptiCollector* g_active = nullptr;

class CuptiCollector final : public ActivityCollector {
 public:
  explicit CuptiCollector(ClockAlignment clock) : converter_(clock) {}

  ~CuptiCollector() override {
    for (CUpti_ActivityKind kind : kKinds) (void)cupti_api().cuptiActivityDisable(kind);
    (void)cupti_api().cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard lock(g_active_mutex);
    if (g_active == this) g_active = nullptr;
  }

  pfResult_t flush(std::vector<ActivityRecord>* out) override {
    if (out == nullptr) return fail(pfErrorInvalidArgument, "cupti flush: out is null");
    PF_CUPTI_CHECK(cuptiActivityFlushAll, (0));
    std::lock_guard lock(mutex_);
    out->insert(out->end(), std::make_move_iterator(records_.begin()),
                std::make_move_iterator(records_.end()));
    records_.clear();
    return pfSuccess;
  }

  pfResult_t register_fill_stream(void* stream) override {
    const auto raw = static_cast<CUstream>(stream);
    CUcontext context = nullptr;
    PF_TRY(stream_context(raw, &context));
    uint32_t context_id = 0, stream_id = 0;
    PF_CUPTI_CHECK(cuptiGetContextId, (context, &context_id));
    PF_CUPTI_CHECK(cuptiGetStreamIdEx, (context, raw, 0, &stream_id));
    log::debug("CUPTI: fill stream {} is (context {}, stream {})", stream, context_id, stream_id);
    std::lock_guard lock(mutex_);
    converter_.add_fill_stream(context_id, stream_id);
    return pfSuccess;
  }

  uint64_t dropped_records() const override { return dropped_.load(); }

  // Called from CUPTI's worker thread with a completed buffer.
  void consume(uint8_t* buffer, size_t valid_bytes) {
    CUpti_Activity* record = nullptr;
    {
      std::lock_guard lock(mutex_);
      while (cupti_api().cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
        ActivityRecord out;
        if (converter_.convert(*record, &out)) records_.push_back(std::move(out));
      }
    }
  }

  void add_dropped(size_t count) { dropped_ += count; }

  static constexpr CUpti_ActivityKind kKinds[] = {
      CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
      CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MEMORY2};

 private:
  std::mutex mutex_;
  ActivityConverter converter_;
  std::vector<ActivityRecord> records_;
  std::atomic<uint64_t> dropped_{0};
};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t,
                               size_t valid_bytes) {
  {
    std::lock_guard lock(g_active_mutex);
    if (g_active != nullptr) {
      g_active->consume(buffer, valid_bytes);
      size_t dropped = 0;
      if (cupti_api().cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) == CUPTI_SUCCESS && dropped)
        g_active->add_dropped(dropped);
    }
  }
  std::free(buffer);
}

// Warns once per process that calibration mode is off and why.
void warn_once(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    log::warn("CUPTI collector unavailable, continuing with event timings only: {}", why);
  });
}

}  // namespace

pfResult_t start_cupti_collector(std::function<double()> device_clock_us,
                                 std::unique_ptr<ActivityCollector>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "start_cupti_collector: out is null");
  static std::mutex start_mutex;  // one start at a time (CUPTI state is process-wide)
  std::lock_guard start_lock(start_mutex);
  {
    std::lock_guard lock(g_active_mutex);
    if (g_active != nullptr)
      return fail(pfErrorBusy, "a PipeFill CUPTI collector is already running in this process");
  }
  // CUPTI is loaded here, by the first collector, never with the library (cupti_api.hpp).
  if (const CuptiApi& api = cupti_api(); !api.ok) {
    warn_once(api.error);
    return fail(pfErrorNotSupported, "CUPTI collector: {}", api.error);
  }
  ClockAlignment clock;
  {
    const CUptiResult result = cupti_api().cuptiGetTimestamp(&clock.cupti_ns);
    if (result != CUPTI_SUCCESS) {
      const pfResult_t code = cupti_failure(result, "cuptiGetTimestamp(&clock.cupti_ns)", __FILE__, __LINE__);
      warn_once(last_error_message());
      return code;
    }
    clock.device_us = device_clock_us ? device_clock_us() : 0.0;
  }
  auto collector = std::make_unique<CuptiCollector>(clock);
  {
    std::lock_guard lock(g_active_mutex);
    g_active = collector.get();
  }
  // Any failure from here: the collector's destructor disables what was enabled and detaches.
  auto enable = [&]() -> pfResult_t {
    // Buffer callbacks are registered once per process and stay registered: they route completed
    // buffers to whichever collector is live (or free them when none is).
    static bool callbacks_registered = false;
    if (!callbacks_registered) {
      PF_CUPTI_CHECK(cuptiActivityRegisterCallbacks, (buffer_requested, buffer_completed));
      callbacks_registered = true;
    }
    for (CUpti_ActivityKind kind : CuptiCollector::kKinds) {
      PF_CUPTI_CHECK(cuptiActivityEnable, (kind));
    }
    return pfSuccess;
  };
  if (const pfResult_t result = enable(); result != pfSuccess) {
    warn_once(last_error_message());
    const std::string message = last_error_message();
    collector.reset();
    set_error(result, message);  // the destructor's CUPTI calls must not hide the cause
    return result;
  }
  log::info("CUPTI collector started (CONCURRENT_KERNEL, MEMCPY, MEMSET, MEMORY2; 4 MiB buffers)");
  *out = std::move(collector);
  return pfSuccess;
}

}  // namespace pipefill::cuda
