// Pushing a stream's context for a scope under the mutex of that context (stream_context.hpp).
#include "stream_context.hpp"

#include <map>

#include "common/log.hpp"
#include "cuda_check.hpp"

namespace pipefill::cuda {
namespace {

std::shared_ptr<std::recursive_mutex> process_mutex() {
  static const auto mutex = std::make_shared<std::recursive_mutex>();
  return mutex;
}

struct PrivateContexts {
  std::mutex mutex;
  std::map<CUcontext, std::shared_ptr<std::recursive_mutex>> mutexes;
};
PrivateContexts& private_contexts() {
  static PrivateContexts registry;
  return registry;
}

// The mutex a push of `context` holds: its own when registered as private, else the process-wide one.
std::shared_ptr<std::recursive_mutex> mutex_for(CUcontext context) {
  PrivateContexts& registry = private_contexts();
  std::lock_guard lock(registry.mutex);
  const auto it = registry.mutexes.find(context);
  return it != registry.mutexes.end() ? it->second : process_mutex();
}

}  // namespace

std::recursive_mutex& context_push_mutex() { return *process_mutex(); }

void register_private_context(CUcontext context) {
  PrivateContexts& registry = private_contexts();
  std::lock_guard lock(registry.mutex);
  registry.mutexes.emplace(context, std::make_shared<std::recursive_mutex>());
}

void unregister_private_context(CUcontext context) {
  PrivateContexts& registry = private_contexts();
  std::lock_guard lock(registry.mutex);
  registry.mutexes.erase(context);
}

pfResult_t ScopedStreamContext::enter(void* stream) {
  if (pushed_) return fail(pfErrorInvalidState, "ScopedStreamContext::enter called twice");
  if (api_->stream_get_ctx == nullptr || api_->ctx_get_current == nullptr || api_->ctx_push_current == nullptr ||
      api_->ctx_pop_current == nullptr)
    return pfSuccess;
  CUcontext wanted = nullptr;
  PF_DRIVER_CHECK(api_->stream_get_ctx(static_cast<CUstream>(stream), &wanted));
  return enter_context(wanted);
}

pfResult_t ScopedStreamContext::enter_context(CUcontext wanted) {
  if (pushed_) return fail(pfErrorInvalidState, "ScopedStreamContext::enter called twice");
  if (api_->ctx_get_current == nullptr || api_->ctx_push_current == nullptr || api_->ctx_pop_current == nullptr)
    return pfSuccess;
  CUcontext current = nullptr;
  PF_DRIVER_CHECK(api_->ctx_get_current(&current));
  if (wanted == nullptr || wanted == current) return pfSuccess;
  std::shared_ptr<std::recursive_mutex> mutex = mutex_for(wanted);
  std::unique_lock lock(*mutex);
  PF_DRIVER_CHECK(api_->ctx_push_current(wanted));  // a failure unlocks on return
  mutex_ = std::move(mutex);
  lock_ = std::move(lock);
  pushed_ = true;
  return pfSuccess;
}

ScopedStreamContext::~ScopedStreamContext() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  const CUresult result = api_->ctx_pop_current(&popped);
  if (result != CUDA_SUCCESS) log::warn("cuCtxPopCurrent failed: {}", driver_result_name(result));
  // lock_ unlocks after the pop (member destruction follows this body), before mutex_ is released.
}

}  // namespace pipefill::cuda
