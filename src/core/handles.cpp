#include "core/handles.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "common/mutex.hpp"
#include "core/job_state.hpp"
#include "core/runtime.hpp"

namespace pipefill::core {
namespace {

constexpr uintptr_t kRuntimeTag = 0x1;
constexpr uintptr_t kJobTag = 0x2;

struct Tables {
  Mutex mu;
  uint64_t next GUARDED_BY(mu) = 1;
  // A process has a handful of runtimes, looked up twice per bubble: a short vector scans faster
  // than a hash map finds.
  std::vector<std::pair<uintptr_t, Runtime*>> runtimes GUARDED_BY(mu);
  std::unordered_map<uintptr_t, std::shared_ptr<JobState>> jobs GUARDED_BY(mu);

  uintptr_t new_key(uintptr_t tag) REQUIRES(mu) { return static_cast<uintptr_t>(next++ << 4) | tag; }
  Runtime* find_runtime(uintptr_t key) REQUIRES(mu) {
    for (const auto& [k, runtime] : runtimes) {
      if (k == key) return runtime;
    }
    return nullptr;
  }
  bool erase_runtime(uintptr_t key) REQUIRES(mu) {
    const auto it = std::find_if(runtimes.begin(), runtimes.end(),
                                 [key](const auto& entry) { return entry.first == key; });
    if (it == runtimes.end()) return false;
    runtimes.erase(it);
    return true;
  }
};

Tables& tables() {
  static Tables* instance = new Tables();  // never destroyed: handles may outlive static dtors
  return *instance;
}

}  // namespace

void RuntimeRef::reset() {
  if (runtime_ != nullptr) runtime_->calls_in_flight().fetch_sub(1, std::memory_order_acq_rel);
  runtime_ = nullptr;
}

pfResult_t refuse_inside_callback(const char* function) {
  if (const char* callback = CallbackScope::active()) {
    return fail(pfErrorInvalidState,
                "{}: called from inside a {} callback; PipeFill runtime and job functions must not "
                "be called from callbacks (only the pfSim* launch helpers may, from launch)",
                function, callback);
  }
  return pfSuccess;
}

namespace {

// The job whose callback this thread is running, when `handle` is that job's handle (the job is
// alive: its callback is running); nullptr otherwise. Never dereferences `handle`.
JobState* own_job_of_callback(pfJob_t handle) {
  auto* job = static_cast<JobState*>(CallbackScope::subject());
  return job != nullptr && handle != nullptr && job->handle == handle ? job : nullptr;
}

}  // namespace

pfResult_t cancel_from_callback(pfJob_t handle) {
  JobState* job = own_job_of_callback(handle);
  if (job == nullptr) return refuse_inside_callback("pfJobCancel");
  // In teardown the job has ended already: the request changes nothing, as for any ended job.
  job->cancel_requested.store(true, std::memory_order_release);
  return pfSuccess;
}

pfResult_t refuse_destroy_from_callback(pfJob_t handle) {
  const char* callback = CallbackScope::active();
  if (own_job_of_callback(handle) != nullptr) {
    return fail(pfErrorInvalidState,
                "pfJobDestroy: job '{}' cannot be destroyed from its own {} callback (the "
                "runtime is running that callback and still owns the job); call pfJobCancel "
                "there, and pfJobDestroy after the callback returned",
                static_cast<JobState*>(CallbackScope::subject())->name, callback);
  }
  return refuse_inside_callback("pfJobDestroy");
}

pfResult_t acquire_runtime(pfRuntime_t handle, const char* function, RuntimeRef* out) {
  PF_TRY(refuse_inside_callback(function));
  if (handle == nullptr) return fail(pfErrorInvalidArgument, "{}: runtime is NULL", function);
  Tables& t = tables();
  MutexLock lock(t.mu);
  Runtime* runtime = t.find_runtime(reinterpret_cast<uintptr_t>(handle));
  if (runtime == nullptr) {
    return fail(pfErrorInvalidArgument,
                "{}: runtime {} is not a live runtime (destroyed, or not a pfRuntime_t)", function,
                static_cast<const void*>(handle));
  }
  if (runtime->magic() != kRuntimeMagic) {
    return fail(pfErrorInternal, "{}: runtime {} is corrupted (bad magic {:#x})", function,
                static_cast<const void*>(handle), runtime->magic());
  }
  runtime->calls_in_flight().fetch_add(1, std::memory_order_acq_rel);
  out->reset();
  out->runtime_ = runtime;
  return pfSuccess;
}

pfResult_t acquire_job(pfJob_t handle, const char* function, JobRef* out) {
  PF_TRY(refuse_inside_callback(function));
  if (handle == nullptr) return fail(pfErrorInvalidArgument, "{}: job is NULL", function);
  Tables& t = tables();
  MutexLock lock(t.mu);
  const auto it = t.jobs.find(reinterpret_cast<uintptr_t>(handle));
  if (it == t.jobs.end()) {
    return fail(pfErrorInvalidArgument,
                "{}: job {} is not a live job (destroyed, or not a pfJob_t)", function,
                static_cast<const void*>(handle));
  }
  const std::shared_ptr<JobState>& job = it->second;
  if (job->magic != kJobMagic) {
    return fail(pfErrorInternal, "{}: job {} is corrupted (bad magic {:#x})", function,
                static_cast<const void*>(handle), job->magic);
  }
  // A published job is attached, so its runtime is alive (it refuses to be destroyed while jobs
  // are attached, and a job is unpublished before it is detached).
  job->runtime->calls_in_flight().fetch_add(1, std::memory_order_acq_rel);
  out->runtime_.reset();
  out->runtime_.runtime_ = job->runtime;
  out->job_ = job;
  return pfSuccess;
}

pfRuntime_t publish_runtime(std::unique_ptr<Runtime> runtime) {
  Tables& t = tables();
  MutexLock lock(t.mu);
  const uintptr_t key = t.new_key(kRuntimeTag);
  t.runtimes.emplace_back(key, runtime.release());
  return reinterpret_cast<pfRuntime_t>(key);
}

pfResult_t destroy_runtime(pfRuntime_t handle) {
  RuntimeRef ref;
  PF_TRY(acquire_runtime(handle, "pfRuntimeDestroy", &ref));
  // Refuse early (attached jobs, an open bubble) so a refused destroy never waits for calls in
  // flight (e.g. a pfJobWait on an attached job).
  PF_TRY(ref->check_can_shut_down());
  Tables& t = tables();
  const uintptr_t key = reinterpret_cast<uintptr_t>(handle);
  {
    MutexLock lock(t.mu);
    if (!t.erase_runtime(key)) {
      return fail(pfErrorInvalidArgument,
                  "pfRuntimeDestroy: runtime {} is being destroyed by another thread",
                  static_cast<const void*>(handle));
    }
  }
  // No new call can find the runtime now; let those in flight return (this call is one).
  while (ref->calls_in_flight().load(std::memory_order_acquire) > 1) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  const pfResult_t result = ref->shutdown();
  if (result != pfSuccess) {
    MutexLock lock(t.mu);
    t.runtimes.emplace_back(key, ref.get());  // the refused destroy changes nothing
    return result;
  }
  Runtime* runtime = ref.get();
  ref.reset();
  delete runtime;
  return pfSuccess;
}

pfJob_t publish_job(const std::shared_ptr<JobState>& job) {
  Tables& t = tables();
  MutexLock lock(t.mu);
  const uintptr_t key = t.new_key(kJobTag);
  job->handle = reinterpret_cast<pfJob_t>(key);
  t.jobs.emplace(key, job);
  return job->handle;
}

void republish_job(const std::shared_ptr<JobState>& job) {
  Tables& t = tables();
  MutexLock lock(t.mu);
  t.jobs.emplace(reinterpret_cast<uintptr_t>(job->handle), job);
}

void unpublish_job(const JobState& job) {
  Tables& t = tables();
  MutexLock lock(t.mu);
  t.jobs.erase(reinterpret_cast<uintptr_t>(job.handle));
}

}  // namespace pipefill::core
