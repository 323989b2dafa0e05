#include "device_context.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "cuda_check.hpp"

namespace pipefill::cuda {

pfResult_t DeviceContextScope::enter(CUcontext primary, CUdevice device, ContextNeed need) {
  if (pushed_ != nullptr) return fail(pfErrorInvalidState, "DeviceContextScope::enter called twice");
  const DriverApi& api = *api_;
  if (api.ctx_get_current == nullptr || api.ctx_push_current == nullptr || api.ctx_pop_current == nullptr ||
      primary == nullptr)
    return pfSuccess;
  CUcontext current = nullptr;
  PF_DRIVER_CHECK(api.ctx_get_current(&current));
  if (current == primary) return pfSuccess;
  if (need == ContextNeed::Any && current != nullptr && api.ctx_get_device != nullptr) {
    CUdevice current_device = 0;
    PF_DRIVER_CHECK(api.ctx_get_device(&current_device));
    if (current_device == device) return pfSuccess;
  }
  PF_DRIVER_CHECK(api.ctx_push_current(primary));
  pushed_ = primary;
  return pfSuccess;
}

DeviceContextScope::~DeviceContextScope() {
  if (pushed_ == nullptr) return;
  CUcontext popped = nullptr;
  const CUresult result = api_->ctx_pop_current(&popped);
  if (result != CUDA_SUCCESS) {
    log::warn("cuCtxPopCurrent failed: {}", driver_result_name(result));
  } else if (popped != pushed_) {
    log::warn("cuCtxPopCurrent returned context {}, not the device's primary context {} that PipeFill "
              "pushed: a call made inside a PipeFill call replaced the current context",
              static_cast<void*>(popped), static_cast<void*>(pushed_));
  }
}

pfResult_t caller_device_ordinal(const DriverApi& api, int device_count, int* ordinal, std::string* source) {
  if (ordinal == nullptr) return fail(pfErrorInvalidArgument, "caller_device_ordinal: ordinal is null");
  CUcontext current = nullptr;
  if (api.ctx_get_current != nullptr) PF_DRIVER_CHECK(api.ctx_get_current(&current));
  if (current == nullptr || api.ctx_get_device == nullptr || api.device_get == nullptr) {
    *ordinal = 0;
    if (source != nullptr)
      *source = current == nullptr ? "device 0: no CUDA context is current on the calling thread"
                                   : "device 0: the driver lacks cuCtxGetDevice/cuDeviceGet";
    return pfSuccess;
  }
  CUdevice device = 0;
  PF_DRIVER_CHECK(api.ctx_get_device(&device));
  for (int i = 0; i < device_count; ++i) {
    CUdevice candidate = 0;
    PF_DRIVER_CHECK(api.device_get(&candidate, i));
    if (candidate == device) {
      *ordinal = i;
      if (source != nullptr)
        *source = fmt::format("device {}: the device of the calling thread's current context {}", i,
                              static_cast<void*>(current));
      return pfSuccess;
    }
  }
  return fail(pfErrorInvalidState,
              "the calling thread's current CUDA context {} is on device handle {}, which is none of the "
              "{} visible device(s); set config.device (PIPEFILL_DEVICE)",
              static_cast<void*>(current), static_cast<int>(device), device_count);
}

}  // namespace pipefill::cuda
