#include "stream_context.hpp"

#include "common/log.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"

namespace pipefill::cuda {

std::recursive_mutex& context_push_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

pfResult_t ScopedStreamContext::enter(void* stream) {
  if (pushed_) return fail(pfErrorInvalidState, "ScopedStreamContext::enter called twice");
  const DriverApi& api = driver_api();
  if (api.stream_get_ctx == nullptr || api.ctx_get_current == nullptr || api.ctx_push_current == nullptr ||
      api.ctx_pop_current == nullptr)
    return pfSuccess;
  CUcontext wanted = nullptr, current = nullptr;
  PF_DRIVER_CHECK(api.stream_get_ctx(static_cast<CUstream>(stream), &wanted));
  PF_DRIVER_CHECK(api.ctx_get_current(&current));
  if (wanted == nullptr || wanted == current) return pfSuccess;
  std::unique_lock lock(context_push_mutex());
  PF_DRIVER_CHECK(api.ctx_push_current(wanted));  // a failure unlocks on return
  lock_ = std::move(lock);
  pushed_ = true;
  return pfSuccess;
}

ScopedStreamContext::~ScopedStreamContext() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  const CUresult result = driver_api().ctx_pop_current(&popped);
  if (result != CUDA_SUCCESS) log::warn("cuCtxPopCurrent failed: {}", driver_result_name(result));
  // lock_ unlocks after the pop (member destruction follows this body).
}

}  // namespace pipefill::cuda
