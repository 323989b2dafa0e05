// PipeFill C++ layer: header-only RAII wrappers over the C API (pipefill.h). Every failing call
// throws pipefill::Error carrying the pfResult_t and the library's message. Destructors never
// throw; a failure there is reported through pipefill::last_destructor_error().
//
//   pipefill::Runtime rt;                                  // defaults + PIPEFILL_* environment
//   pipefill::Job job(rt, desc);
//   { pipefill::BubbleScope bubble(rt, stream); enqueue_recv_wait(stream); }
//   rt.iteration_end();
#ifndef PIPEFILL_PIPEFILL_HPP_
#define PIPEFILL_PIPEFILL_HPP_

#include <stdexcept>
#include <string>
#include <utility>

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

// The last error a destructor swallowed on this thread (pfSuccess when none).
inline pfResult_t& last_destructor_error() {
  static thread_local pfResult_t error = pfSuccess;
  return error;
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

// A simulated world (owning). Use SimWorld::view() for one the runtime owns.
class SimWorld {
 public:
  explicit SimWorld(int device_count = 1, const pfSimDeviceDesc_t* desc = nullptr,
                    uint64_t seed = 1) {
    check(pfSimWorldCreate(device_count, desc, seed, &world_));
    owned_ = true;
  }
  static SimWorld view(pfSimWorld_t world) { return SimWorld(world, false); }
  ~SimWorld() { reset(); }
  SimWorld(SimWorld&& other) noexcept
      : world_(std::exchange(other.world_, nullptr)), owned_(other.owned_) {}
  SimWorld& operator=(SimWorld&& other) noexcept {
    if (this != &other) {
      reset();
      world_ = std::exchange(other.world_, nullptr);
      owned_ = other.owned_;
    }
    return *this;
  }
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  pfSimWorld_t get() const noexcept { return world_; }
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

 private:
  SimWorld(pfSimWorld_t world, bool owned) : world_(world), owned_(owned) {}
  void reset() noexcept {
    if (owned_ && world_ != nullptr) {
      const pfResult_t r = pfSimWorldDestroy(world_);
      if (r != pfSuccess) last_destructor_error() = r;
    }
    world_ = nullptr;
  }
  pfSimWorld_t world_ = nullptr;
  bool owned_ = false;
};

class Runtime {
 public:
  // config == nullptr: defaults and PIPEFILL_* environment variables.
  explicit Runtime(const pfConfig_t* config = nullptr) { check(pfRuntimeCreate(config, &rt_)); }
  explicit Runtime(const pfConfig_t& config) : Runtime(&config) {}
  // Destroying a runtime with live Job objects fails (pfErrorBusy): destroy the jobs first.
  ~Runtime() {
    if (rt_ != nullptr) {
      const pfResult_t r = pfRuntimeDestroy(rt_);
      if (r != pfSuccess) last_destructor_error() = r;
    }
  }
  Runtime(Runtime&& other) noexcept : rt_(std::exchange(other.rt_, nullptr)) {}
  Runtime& operator=(Runtime&& other) noexcept {
    if (this != &other) {
      this->~Runtime();
      rt_ = std::exchange(other.rt_, nullptr);
    }
    return *this;
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  pfRuntime_t get() const noexcept { return rt_; }

  void bubble_begin(void* stream, const pfBubbleHint_t* hint = nullptr) {
    check(pfBubbleBegin(rt_, stream, hint));
  }
  void bubble_end(void* stream) { check(pfBubbleEnd(rt_, stream)); }
  void iteration_end() { check(pfIterationEnd(rt_)); }
  void synchronize() { check(pfRuntimeSynchronize(rt_)); }

  pfStats_t stats() const {
    pfStats_t s;
    check(pfRuntimeGetStatsV2(rt_, &s, sizeof s));  // every field this header knows
    return s;
  }
  pfConfig_t config() const {
    pfConfig_t c = PF_CONFIG_INITIALIZER;  // size: the layout this header knows
    check(pfRuntimeGetConfig(rt_, &c));
    return c;
  }
  pfBackend_t backend() const {
    pfBackend_t b = pfBackendAuto;
    check(pfRuntimeGetBackend(rt_, &b));
    return b;
  }
  pfResult_t async_error() const {
    pfResult_t e = pfSuccess;
    check(pfRuntimeGetAsyncError(rt_, &e));
    return e;
  }
  void write_trace(const std::string& path) const { check(pfTraceWrite(rt_, path.c_str())); }
  // The simulated world the runtime runs in (not owned).
  SimWorld sim_world() const {
    pfSimWorld_t w = nullptr;
    check(pfRuntimeGetSimWorld(rt_, &w));
    return SimWorld::view(w);
  }
  void* create_high_priority_stream() {
    void* s = nullptr;
    check(pfStreamCreateHighPriority(rt_, &s));
    return s;
  }
  void destroy_stream(void* stream) { check(pfStreamDestroy(rt_, stream)); }

 private:
  pfRuntime_t rt_ = nullptr;
};

class Job {
 public:
  Job(Runtime& runtime, const pfJobDesc_t& desc) { check(pfJobCreate(runtime.get(), &desc, &job_)); }
  ~Job() {
    if (job_ != nullptr) {
      const pfResult_t r = pfJobDestroy(job_);
      if (r != pfSuccess) last_destructor_error() = r;
    }
  }
  Job(Job&& other) noexcept : job_(std::exchange(other.job_, nullptr)) {}
  Job& operator=(Job&& other) noexcept {
    if (this != &other) {
      this->~Job();
      job_ = std::exchange(other.job_, nullptr);
    }
    return *this;
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pfJob_t get() const noexcept { return job_; }
  pfJobInfo_t info() const {
    pfJobInfo_t i;
    check(pfJobGetStatus(job_, &i));
    return i;
  }
  void cancel() { check(pfJobCancel(job_)); }
  // Throws Error(pfErrorTimeout / pfErrorJobFailed / pfErrorCancelled) when it did not complete.
  void wait(double timeout_us = -1.0) { check(pfJobWait(job_, timeout_us)); }

 private:
  pfJob_t job_ = nullptr;
};

// pfBubbleBegin in the constructor, pfBubbleEnd in the destructor: scope the recv wait with it.
class BubbleScope {
 public:
  BubbleScope(Runtime& runtime, void* stream, const pfBubbleHint_t* hint = nullptr)
      : runtime_(runtime.get()), stream_(stream) {
    check(pfBubbleBegin(runtime_, stream_, hint));
  }
  ~BubbleScope() {
    const pfResult_t r = pfBubbleEnd(runtime_, stream_);
    if (r != pfSuccess) last_destructor_error() = r;
  }
  BubbleScope(const BubbleScope&) = delete;
  BubbleScope& operator=(const BubbleScope&) = delete;

 private:
  pfRuntime_t runtime_;
  void* stream_;
};

}  // namespace pipefill

#endif  // PIPEFILL_PIPEFILL_HPP_
