// The C handles of runtimes and jobs. A pfRuntime_t / pfJob_t is not an address but a key into a
// process-wide table of live objects, never reused: a handle used after its destroy, a handle of
// the other kind or a wild pointer is refused with pfErrorInvalidArgument instead of reading freed
// memory. Each object also carries a magic value, checked on every call (as NCCL does), so a
// corrupted object is reported rather than used.
//
// Lifetimes: acquiring a handle counts a call in flight on the runtime (a job's call counts on its
// runtime). pfRuntimeDestroy first unpublishes the handle, so no new call can start, then waits
// for the calls in flight to return before it frees anything. A job handle is unpublished by
// pfJobDestroy before the job is detached; a pfJobWait in flight keeps the job object alive and
// returns pfErrorCancelled.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "pipefill/pipefill.h"

namespace pipefill::core {

class Runtime;
struct JobState;
class JobRef;

inline constexpr uint64_t kRuntimeMagic = 0x50464c5254494d45ull;  // "PFLRTIME"
inline constexpr uint64_t kJobMagic = 0x50464c4a4f425354ull;      // "PFLJOBST"

// A call in flight on a runtime; releases it when destroyed.
class RuntimeRef {
 public:
  RuntimeRef() = default;
  RuntimeRef(const RuntimeRef&) = delete;
  RuntimeRef& operator=(const RuntimeRef&) = delete;
  ~RuntimeRef() { reset(); }
  Runtime* get() const { return runtime_; }
  Runtime* operator->() const { return runtime_; }
  void reset();

 private:
  friend pfResult_t acquire_runtime(pfRuntime_t, const char*, RuntimeRef*);
  friend pfResult_t acquire_job(pfJob_t, const char*, JobRef*);
  Runtime* runtime_ = nullptr;
};

// A call in flight on a job (and so on its runtime).
class JobRef {
 public:
  JobRef() = default;
  JobRef(const JobRef&) = delete;
  JobRef& operator=(const JobRef&) = delete;
  JobState* get() const { return job_.get(); }
  JobState* operator->() const { return job_.get(); }
  Runtime* runtime() const { return runtime_.get(); }

 private:
  friend pfResult_t acquire_job(pfJob_t, const char*, JobRef*);
  std::shared_ptr<JobState> job_;
  RuntimeRef runtime_;
};

// pfErrorInvalidState when called from inside a job callback (setup/launch/teardown, or a
// simulated on_item): such calls would deadlock or corrupt state. `function` names the caller.
pfResult_t refuse_inside_callback(const char* function);

// pfJobCancel from inside a callback: a launch or teardown callback cancelling its own job is
// ordinary (a fill job that hit its own error) - noted without any lock (the launch callback
// runs with the state lock held) and acted on once the callback returned; any other call from a
// callback is refused as above. Only call when CallbackScope::active().
pfResult_t cancel_from_callback(pfJob_t handle);
// pfJobDestroy from inside a callback: refused, with a message that says what to do instead
// when the job is the callback's own. Only call when CallbackScope::active().
pfResult_t refuse_destroy_from_callback(pfJob_t handle);

// Looks the handle up (and refuses calls from callbacks); the message names `function`.
pfResult_t acquire_runtime(pfRuntime_t handle, const char* function, RuntimeRef* out);
pfResult_t acquire_job(pfJob_t handle, const char* function, JobRef* out);

// The runtime's handle from now on (pfRuntimeCreate; tests that build a runtime in C++).
pfRuntime_t publish_runtime(std::unique_ptr<Runtime> runtime);
// pfRuntimeDestroy: unpublishes, waits for the calls in flight, shuts down and frees. When the
// shutdown refuses (pfErrorBusy, pfErrorInvalidState), the handle stays valid and nothing changed.
pfResult_t destroy_runtime(pfRuntime_t handle);

// The job's handle (set in job->handle), published before the job is attached; unpublished by
// pfJobDestroy.
pfJob_t publish_job(const std::shared_ptr<JobState>& job);
void unpublish_job(const JobState& job);
// Puts an unpublished job's handle back (a pfJobDestroy that failed changes nothing).
void republish_job(const std::shared_ptr<JobState>& job);

}  // namespace pipefill::core
