// PipeFill C++ layer: header-only RAII wrappers over the C API (pipefill.h), C++17. Every failing
// call throws pipefill::Error carrying the pfResult_t and the library's message. Destructors
// never throw; a failure there is kept per thread (last_destructor_error(), cleared by
// clear_destructor_error()).
//
//   pipefill::Runtime rt;                                  // defaults + PIPEFILL_* environment
//   pipefill::Job job = rt.create_job(desc);
//   { pipefill::BubbleScope bubble(rt, stream); enqueue_recv_wait(stream); }
//   rt.iteration_end();
//
// Lifetimes (the rule; the same as the Python package's):
//  - A Job keeps its runtime alive: the C runtime is destroyed when the Runtime object AND every
//    Job (and OwnedStream, CaptureContextScope) made from it are gone, whichever goes last.
//    Destroying a Runtime object with live Jobs is therefore fine: nothing leaks, nothing fails;
//    the jobs stay valid (status, wait, cancel) and the last one's destructor destroys the
//    runtime.
//  - A runtime created in a SimWorld (Runtime(config, world)) keeps that world alive.
//  - BubbleScope is a stack scope, like std::lock_guard: it must end before the runtime it
//    belongs to is destroyed (it holds no reference, to keep the bubble pair at the C cost).
//  - Moved-from objects hold nothing: their destructors do nothing, other calls throw
//    pfErrorInvalidArgument ("... is NULL").
//  - Job callbacks (setup, launch, teardown, on_item) are C functions: never let an exception
//    out of one; pipefill::to_result(...) turns a throwing body into a pfResult_t.
// The simulated and host devices' main-job calls are in pipefill/devices.hpp (included below:
// pipefill::SimEvent, pipefill::sim_device::*, pipefill::host_device::*).
#ifndef PIPEFILL_PIPEFILL_HPP_
#define PIPEFILL_PIPEFILL_HPP_

#if !defined(__cplusplus) || __cplusplus < 201703L
#error "pipefill/pipefill.hpp needs C++17 or later (-std=c++17); C includes pipefill/pipefill.h"
#endif

#include <array>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pipefill/pipefill.h"

namespace pipefill {

class Error : public std::runtime_error {
 public:
  Error(pfResult_t code, const std::string& message)
      : std::runtime_error(std::string(pfGetErrorString(code)) +
                           (message.empty() ? std::string() : " - " + message)),
        code_(code),
        message_(message) {}
  pfResult_t code() const noexcept { return code_; }
  // The library's message for the failing call (names the bad value).
  const std::string& message() const noexcept { return message_; }

 private:
  pfResult_t code_;
  std::string message_;
};

// Throws Error when `result` is not pfSuccess.
inline void check(pfResult_t result) {
  if (result != pfSuccess) throw Error(result, pfGetLastErrorMessage());
}

// The last failure a destructor of this layer swallowed on this thread (pfSuccess when none) and
// its message. Stays until clear_destructor_error() or the next such failure.
inline pfResult_t& last_destructor_error() {
  static thread_local pfResult_t error = pfSuccess;
  return error;
}
inline std::string& last_destructor_error_message() {
  static thread_local std::string message;
  return message;
}
inline void clear_destructor_error() noexcept {
  last_destructor_error() = pfSuccess;
  last_destructor_error_message().clear();
}

namespace detail {
inline void record_destructor_error(pfResult_t result) noexcept {
  if (result == pfSuccess) return;
  last_destructor_error() = result;
  try {
    last_destructor_error_message() = pfGetLastErrorMessage();
  } catch (...) {  // no memory for the message: the code is kept
  }
}
}  // namespace detail

// Runs `body` and returns pfSuccess, or the code of the Error it threw (pfErrorJobFailed for any
// other exception): for job callbacks, which must never let an exception cross the C boundary.
template <typename Body>
pfResult_t to_result(Body&& body) noexcept {
  try {
    std::forward<Body>(body)();
    return pfSuccess;
  } catch (const Error& error) {
    return error.code();
  } catch (...) {
    return pfErrorJobFailed;
  }
}

inline int version() {
  int v = 0;
  check(pfGetVersion(&v));
  return v;
}

inline pfConfig_t default_config() {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  return c;
}

namespace detail {
// The owner of a C simulated world (shared by SimWorld objects and runtimes in it).
struct WorldHandle {
  pfSimWorld_t world = nullptr;
  explicit WorldHandle(pfSimWorld_t w) noexcept : world(w) {}
  ~WorldHandle() { record_destructor_error(pfSimWorldDestroy(world)); }
  WorldHandle(const WorldHandle&) = delete;
  WorldHandle& operator=(const WorldHandle&) = delete;
};

// The owner of a C runtime, shared by its Runtime, Jobs, Streams and capture scopes: the last
// one to go destroys it (after which the world it ran in may go).
struct RuntimeHandle {
  std::shared_ptr<WorldHandle> world;  // destroyed after the runtime (member, body runs first)
  pfRuntime_t runtime = nullptr;
  RuntimeHandle(pfRuntime_t rt, std::shared_ptr<WorldHandle> w) noexcept
      : world(std::move(w)), runtime(rt) {}
  ~RuntimeHandle() { record_destructor_error(pfRuntimeDestroy(runtime)); }
  RuntimeHandle(const RuntimeHandle&) = delete;
  RuntimeHandle& operator=(const RuntimeHandle&) = delete;
};
}  // namespace detail

// A simulated world: owning (SimWorld(n, desc, seed)) or a view (SimWorld::view, e.g. a
// runtime's private world). Copies share the world; the last owning copy (or runtime in it)
// destroys it. The world's main-job calls (streams, kernels, events) are in devices.hpp.
class SimWorld {
 public:
  explicit SimWorld(int device_count = 1, const pfSimDeviceDesc_t* desc = nullptr,
                    uint64_t seed = 1) {
    pfSimWorld_t world = nullptr;
    check(pfSimWorldCreate(device_count, desc, seed, &world));
    owner_ = std::make_shared<detail::WorldHandle>(world);
    world_ = world;
  }
  static SimWorld view(pfSimWorld_t world) noexcept { return SimWorld(world); }

  pfSimWorld_t get() const noexcept { return world_; }
  bool owning() const noexcept { return owner_ != nullptr; }
  void* create_stream(int device, int priority = 0) {
    void* stream = nullptr;
    check(pfSimStreamCreate(world_, device, priority, &stream));
    return stream;
  }
  void run_until_idle() { check(pfSimRunUntilIdle(world_)); }
  void run_until(double time_us) { check(pfSimRunUntil(world_, time_us)); }
  double now() const {
    double t = 0.0;
    check(pfSimNow(world_, &t));
    return t;
  }
  void set_memory_used(int device, size_t bytes) {
    check(pfSimSetMemoryUsed(world_, device, bytes));
  }

 private:
  friend class Runtime;
  explicit SimWorld(pfSimWorld_t world) noexcept : world_(world) {}
  std::shared_ptr<detail::WorldHandle> owner_;  // null for a view
  pfSimWorld_t world_ = nullptr;
};

class Job;
class OwnedStream;

class Runtime {
 public:
  // config == nullptr: defaults and PIPEFILL_* environment variables.
  explicit Runtime(const pfConfig_t* config = nullptr) { create(config, nullptr); }
  explicit Runtime(const pfConfig_t& config) { create(&config, nullptr); }
  // A simulated runtime in `world` (config.sim_world is set to it); the runtime keeps the world
  // alive.
  Runtime(pfConfig_t config, const SimWorld& world) {
    config.sim_world = world.get();
    create(&config, world.owner_);
  }
  // Move-only; destroying it with live Jobs is allowed (the file comment: jobs keep it alive).
  Runtime(Runtime&&) noexcept = default;
  Runtime& operator=(Runtime&&) noexcept = default;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime() = default;

  pfRuntime_t get() const noexcept { return handle_ ? handle_->runtime : nullptr; }

  // ---- Bubble instructions (BubbleScope pairs them) ----
  void bubble_begin(void* stream, const pfBubbleHint_t* hint = nullptr) {
    check(pfBubbleBegin(get(), stream, hint));
  }
  void bubble_end(void* stream) { check(pfBubbleEnd(get(), stream)); }
  // pfBubbleCloseFill: on `stream`, the open bubble's fill stops early (stream order).
  void bubble_close_fill(void* stream) { check(pfBubbleCloseFill(get(), stream)); }
  void iteration_end() { check(pfIterationEnd(get())); }
  void synchronize() { check(pfRuntimeSynchronize(get())); }

  // ---- Jobs ----
  Job create_job(const pfJobDesc_t& desc);
  Job create_graph_job(const pfGraphJobDesc_t& desc);

  // ---- State ----
  pfConfig_t config() const {
    pfConfig_t c = PF_CONFIG_INITIALIZER;  // size: the layout this header knows
    check(pfRuntimeGetConfig(get(), &c));
    return c;
  }
  pfBackend_t backend() const {
    pfBackend_t b = pfBackendAuto;
    check(pfRuntimeGetBackend(get(), &b));
    return b;
  }
  pfResult_t async_error() const {
    pfResult_t e = pfSuccess;
    check(pfRuntimeGetAsyncError(get(), &e));
    return e;
  }

  // ---- Statistics ----
  pfStats_t stats() const {
    pfStats_t s;
    check(pfRuntimeGetStatsV2(get(), &s, sizeof s));  // every field this header knows
    return s;
  }
  // Skipped bubbles by pfSkipCause_t (they sum to stats().bubbles_skipped).
  std::array<uint64_t, PF_SKIP_CAUSE_COUNT> skip_counts() const {
    std::array<uint64_t, PF_SKIP_CAUSE_COUNT> counts{};
    check(pfRuntimeGetSkipCounts(get(), counts.data(), counts.size()));
    return counts;
  }
  size_t class_count() const {
    size_t n = 0;
    check(pfRuntimeGetClassCount(get(), &n));
    return n;
  }
  pfClassStats_t class_stats(size_t index) const {
    pfClassStats_t c{};
    c.size = sizeof c;
    check(pfRuntimeGetClassStats(get(), index, &c));
    return c;
  }
  // Every class, in index order (a class harvested between the two calls is left for the next).
  std::vector<pfClassStats_t> all_class_stats() const {
    std::vector<pfClassStats_t> classes(class_count());
    for (size_t i = 0; i < classes.size(); ++i) classes[i] = class_stats(i);
    return classes;
  }
  // pfRuntimeSetClassMargin: the class's margin in place of safety_margin_us (< 0 removes it).
  void set_class_margin(const std::string& class_key, double margin_us) {
    check(pfRuntimeSetClassMargin(get(), class_key.c_str(), margin_us));
  }
  // May synchronise with the device: refused (pfErrorInvalidState) inside an open bubble.
  pfMemoryInfo_t memory_info() const {
    pfMemoryInfo_t m{};
    m.size = sizeof m;
    check(pfRuntimeGetMemoryInfo(get(), &m));
    return m;
  }
  void write_trace(const std::string& path) const { check(pfTraceWrite(get(), path.c_str())); }

  // ---- Streams ----
  // The fill streams (never enqueue main work on them nor destroy them; they live as long as the
  // runtime).
  std::vector<void*> fill_streams() const {
    size_t count = 0;
    check(pfRuntimeGetFillStreams(get(), nullptr, 0, &count));
    std::vector<void*> streams(count);
    size_t written = count;
    check(pfRuntimeGetFillStreams(get(), streams.data(), streams.size(), &written));
    streams.resize(written < count ? written : count);
    return streams;
  }
  // A main-job stream at the highest priority, owned by the returned OwnedStream (RAII).
  OwnedStream high_priority_stream();
  // The same as a raw handle: destroy it with destroy_stream().
  void* create_high_priority_stream() {
    void* s = nullptr;
    check(pfStreamCreateHighPriority(get(), &s));
    return s;
  }
  // A capture stream for a graph fill job (pfGraphCaptureStreamCreate), owned by the OwnedStream.
  OwnedStream graph_capture_stream();
  void destroy_stream(void* stream) { check(pfStreamDestroy(get(), stream)); }

  // ---- Simulated and host backends ----
  // The simulated world the runtime runs in (a view: not owned).
  SimWorld sim_world() const {
    pfSimWorld_t w = nullptr;
    check(pfRuntimeGetSimWorld(get(), &w));
    return SimWorld::view(w);
  }
  // Host backend: fn(user, event) at every slice's start and end (pfRuntimeSetSliceObserver;
  // fn nullptr removes it). `user` must outlive a synchronize() after removal.
  void set_slice_observer(pfSliceObserverFn fn, void* user) {
    check(pfRuntimeSetSliceObserver(get(), fn, user));
  }

 private:
  friend class Job;
  friend class OwnedStream;
  friend class CaptureContextScope;
  void create(const pfConfig_t* config, std::shared_ptr<detail::WorldHandle> world) {
    pfRuntime_t rt = nullptr;
    check(pfRuntimeCreate(config, &rt));
    try {
      handle_ = std::make_shared<detail::RuntimeHandle>(rt, std::move(world));
    } catch (...) {
      pfRuntimeDestroy(rt);
      throw;
    }
  }
  std::shared_ptr<detail::RuntimeHandle> handle_;
};

// A fill job (pfJobCreate / pfJobCreateGraph). Keeps its runtime alive; its destructor destroys
// the job (pfJobDestroy: cancels it first, waits for its slices), then lets the runtime go.
class Job {
 public:
  Job(Runtime& runtime, const pfJobDesc_t& desc) : runtime_(runtime.handle_) {
    check(pfJobCreate(runtime.get(), &desc, &job_));
  }
  Job(Runtime& runtime, const pfGraphJobDesc_t& desc) : runtime_(runtime.handle_) {
    check(pfJobCreateGraph(runtime.get(), &desc, &job_));
  }
  ~Job() { reset(); }
  Job(Job&& other) noexcept
      : runtime_(std::move(other.runtime_)), job_(std::exchange(other.job_, nullptr)) {}
  Job& operator=(Job&& other) noexcept {
    if (this != &other) {
      reset();
      runtime_ = std::move(other.runtime_);
      job_ = std::exchange(other.job_, nullptr);
    }
    return *this;
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pfJob_t get() const noexcept { return job_; }
  pfRuntime_t runtime() const noexcept { return runtime_ ? runtime_->runtime : nullptr; }

  pfJobInfo_t info() const {
    pfJobInfo_t i;
    check(pfJobGetStatus(job_, &i));
    return i;
  }
  pfJobStatus_t status() const { return static_cast<pfJobStatus_t>(info().status); }
  pfJobCostInfo_t cost_info() const {
    pfJobCostInfo_t c{};
    c.size = sizeof c;
    check(pfJobGetCostInfo(job_, &c));
    return c;
  }
  void cancel() { check(pfJobCancel(job_)); }
  // Throws Error(pfErrorTimeout / pfErrorJobFailed / pfErrorCancelled) when it did not complete
  // (timeout_us < 0: no limit).
  void wait(double timeout_us = -1.0) { check(pfJobWait(job_, timeout_us)); }
  // true when the job completed within timeout_us, false when the time ran out; throws when it
  // failed or was cancelled.
  bool wait_for(double timeout_us) {
    const pfResult_t r = pfJobWait(job_, timeout_us);
    if (r == pfErrorTimeout) return false;
    check(r);
    return true;
  }
  // Streaming jobs: only items < available may be claimed; end_input() ends the job there.
  void set_available(uint64_t available) { check(pfJobSetAvailable(job_, available)); }
  void end_input() { check(pfJobEndInput(job_)); }

 private:
  void reset() noexcept {
    if (job_ != nullptr) detail::record_destructor_error(pfJobDestroy(job_));
    job_ = nullptr;
    runtime_.reset();  // may destroy the runtime: after the job
  }
  std::shared_ptr<detail::RuntimeHandle> runtime_;
  pfJob_t job_ = nullptr;
};

inline Job Runtime::create_job(const pfJobDesc_t& desc) { return Job(*this, desc); }
inline Job Runtime::create_graph_job(const pfGraphJobDesc_t& desc) { return Job(*this, desc); }

// A stream the runtime made for the caller (a main-job stream or a graph capture stream),
// destroyed with pfStreamDestroy by the destructor. Keeps the runtime alive.
class OwnedStream {
 public:
  OwnedStream(OwnedStream&& other) noexcept
      : runtime_(std::move(other.runtime_)), stream_(std::exchange(other.stream_, nullptr)) {}
  OwnedStream& operator=(OwnedStream&& other) noexcept {
    if (this != &other) {
      reset();
      runtime_ = std::move(other.runtime_);
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() { reset(); }

  void* get() const noexcept { return stream_; }
  // Gives up ownership: the caller destroys it (Runtime::destroy_stream).
  void* release() noexcept { return std::exchange(stream_, nullptr); }

 private:
  friend class Runtime;
  OwnedStream(std::shared_ptr<detail::RuntimeHandle> runtime, void* stream) noexcept
      : runtime_(std::move(runtime)), stream_(stream) {}
  void reset() noexcept {
    if (stream_ != nullptr) {
      detail::record_destructor_error(pfStreamDestroy(runtime_->runtime, stream_));
    }
    stream_ = nullptr;
    runtime_.reset();
  }
  std::shared_ptr<detail::RuntimeHandle> runtime_;
  void* stream_ = nullptr;
};

inline OwnedStream Runtime::high_priority_stream() {
  return OwnedStream(handle_, create_high_priority_stream());
}
inline OwnedStream Runtime::graph_capture_stream() {
  void* s = nullptr;
  check(pfGraphCaptureStreamCreate(get(), &s));
  return OwnedStream(handle_, s);
}

// pfBubbleBegin in the constructor, pfBubbleEnd in the destructor: scope the recv wait with it.
// A stack scope: it must end before its runtime is destroyed (see the file comment).
class BubbleScope {
 public:
  BubbleScope(Runtime& runtime, void* stream, const pfBubbleHint_t* hint = nullptr)
      : runtime_(runtime.get()), stream_(stream) {
    check(pfBubbleBegin(runtime_, stream_, hint));
  }
  ~BubbleScope() { detail::record_destructor_error(pfBubbleEnd(runtime_, stream_)); }
  BubbleScope(const BubbleScope&) = delete;
  BubbleScope& operator=(const BubbleScope&) = delete;

 private:
  pfRuntime_t runtime_;
  void* stream_;
};

// pfGraphCaptureContextPush in the constructor, pfGraphCaptureContextPop in the destructor, on
// the same thread: capture a graph fill job's item inside it. Keeps the runtime alive.
class CaptureContextScope {
 public:
  CaptureContextScope(Runtime& runtime, const OwnedStream& capture_stream)
      : runtime_(runtime.handle_) {
    check(pfGraphCaptureContextPush(runtime.get(), capture_stream.get()));
  }
  ~CaptureContextScope() {
    detail::record_destructor_error(pfGraphCaptureContextPop(runtime_->runtime));
  }
  CaptureContextScope(const CaptureContextScope&) = delete;
  CaptureContextScope& operator=(const CaptureContextScope&) = delete;

 private:
  std::shared_ptr<detail::RuntimeHandle> runtime_;
};

}  // namespace pipefill

#include "pipefill/devices.hpp"  // NOLINT(build/include): the simulated and host devices' calls

#endif  // PIPEFILL_PIPEFILL_HPP_
