// The CUDA device's events and the clock they are timed against: event times relative to a
// reference event aligned with the host clock (re-based when old), and, where primary-context
// events cannot be recorded on green-context streams, per-context event twins timed against a
// fill-context reference aligned to the primary clock.
#include "cuda_device_impl.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "clock_alignment.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "event_query.hpp"

namespace pipefill::cuda {

pfResult_t CudaDevice::create_event(Event* out) {
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

pfResult_t CudaDevice::destroy_event(Event event) {
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

pfResult_t CudaDevice::record_event(Event event, Stream stream) {
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

pfResult_t CudaDevice::stream_wait_event(Stream stream, Event event) {
  if (event == nullptr) return fail(pfErrorInvalidArgument, "stream_wait_event: event is null");
  PF_DEVICE_CONTEXT(ContextNeed::Any);
  // cudaStreamWaitEvent may wait on an event of another context (cuda.h, cuStreamWaitEvent).
  PF_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), latest_of(event).event, 0));
  return pfSuccess;
}

pfResult_t CudaDevice::query_event(Event event, bool* done, double* time_us) {
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

pfResult_t CudaDevice::synchronize_event(Event event) {
  if (event == nullptr) return fail(pfErrorInvalidArgument, "synchronize_event: event is null");
  PF_DEVICE_CONTEXT(ContextNeed::Any);
  PF_CUDA_CHECK(cudaEventSynchronize(latest_of(event).event));
  return pfSuccess;
}

CudaDevice::LatestRecord CudaDevice::latest_of(Event event) {
  auto cuda_event = static_cast<cudaEvent_t>(event);
  if (!per_context_events_) return {cuda_event, false};
  MutexLock lock(twins_mutex_);
  const auto it = twins_.find(cuda_event);
  if (it == twins_.end() || !it->second.latest_on_fill) return {cuda_event, false};
  return {it->second.event, true};
}

bool CudaDevice::is_fill_stream(cudaStream_t stream) const {
  std::lock_guard lock(mutex_);
  return fill_streams_.count(stream) > 0 || stream == spare_fill_stream_;
}

// An event made with the fill context current (its reference stream's context).
pfResult_t CudaDevice::create_fill_context_event(cudaEvent_t* out) {
  ScopedStreamContext scope;
  PF_TRY(scope.enter(fill_reference_.stream));
  PF_CUDA_CHECK(cudaEventCreateWithFlags(out, cudaEventDefault));
  return pfSuccess;
}

// Records the first reference event of the primary context and aligns it with the host clock.
pfResult_t CudaDevice::init_clock() {
  reference_.stream = control_stream_;
  return init_reference(reference_);
}

// Records `reference`'s first event on its stream (whose context must be current) and aligns
// it with the host clock.
pfResult_t CudaDevice::init_reference(Reference& reference) {
  PF_CUDA_CHECK(cudaEventCreateWithFlags(&reference.event, cudaEventDefault));
  PF_CUDA_CHECK(cudaEventRecord(reference.event, reference.stream));
  PF_CUDA_CHECK(cudaEventSynchronize(reference.event));
  // The event completed a few µs before the host saw it: that is the alignment error.
  reference.time_us = now_us();
  return pfSuccess;
}

// Moves to a newer reference event when the current one is old (caller holds clock_mutex_).
pfResult_t CudaDevice::advance_reference_locked(Reference& reference) {
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
    // The primary reference is an event of the primary context, whatever the caller has current
    // (a query from a thread with a torch green context current, or from inside the fill
    // reference's alignment with the fill context pushed): an event made in another context and
    // recorded on the control stream fails, or times against the wrong clock (issue 33 item 6).
    DeviceContextScope in_primary;
    PF_TRY(in_primary.enter(primary_, cu_device_, ContextNeed::Primary));
    PF_CUDA_CHECK(cudaEventCreateWithFlags(&reference.pending, cudaEventDefault));
  }
  PF_CUDA_CHECK(cudaEventRecord(reference.pending, reference.stream));
  return pfSuccess;
}

// After the per-context self-test passed: the fill reference on a stream of its own, aligned to
// the primary clock (not to the host on its own: two host alignments differ by their wake-up
// latencies, which biased late/overrun/filled figures - issue 24 item 8).
pfResult_t CudaDevice::enable_per_context_events() {
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
pfResult_t CudaDevice::align_fill_reference_locked() {
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
void CudaDevice::disable_per_context_events() {
  per_context_events_ = false;
  std::lock_guard lock(clock_mutex_);
  for (cudaEvent_t* e : {&fill_reference_.pending, &fill_reference_.event})
    if (*e != nullptr && cudaEventDestroy(*e) != cudaSuccess) (void)cudaGetLastError();
  fill_reference_.pending = fill_reference_.event = nullptr;
  if (fill_reference_.stream != nullptr && cudaStreamDestroy(fill_reference_.stream) != cudaSuccess)
    (void)cudaGetLastError();
  fill_reference_.stream = nullptr;
}

}  // namespace pipefill::cuda
