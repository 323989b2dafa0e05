// pipefill::Device on a CUDA GPU: creation (make_cuda_device, init), identity, launch callbacks
// and shutdown; cuda_device_impl.hpp lists the files that own the rest. See docs/cuda-backend.md
// for the design; in short:
//  - fill streams at the lowest priority, inside a green context holding all SMs but R when the
//    driver supports it (grid-cap mode otherwise); main-job streams at any valid priority;
//  - event timings relative to a reference event recorded at creation (re-based every few
//    seconds so float milliseconds keep sub-microsecond precision), never a blocking sync;
//  - the gate close is a stream-ordered write (cuStreamWriteValue64, or a copy from a pinned
//    slot ring), never a wait-value operation;
//  - device memory only at setup: words, pinned words, one arena allocation.
#include "cuda_device_impl.hpp"

#include <cstdlib>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/config.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "fill_kernels.hpp"

namespace pipefill::cuda {

const char* gate_write_mode_name(GateWriteMode mode) {
  return mode == GateWriteMode::StreamWriteValue ? "cuStreamWriteValue64" : "pinned-copy";
}

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && (std::strcmp(value, "1") == 0 || std::strcmp(value, "true") == 0);
}

bool env_off(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && (std::strcmp(value, "0") == 0 || std::strcmp(value, "false") == 0 ||
                              std::strcmp(value, "off") == 0);
}

// `ordinal`: the device (config.device, or the caller's current one); `source` says which.
pfResult_t CudaDevice::init(const RuntimeOptions& options, int ordinal, const std::string& source) {
  ordinal_ = ordinal;
  origin_ = std::chrono::steady_clock::now();  // the device clock's origin (CUPTI aligns to it)
  // The device's primary context, held for the device's life and pushed per call where a call
  // needs it (device_context.hpp): the caller's current context and device never change.
  const DriverApi& api = driver_api();
  if (api.device_get == nullptr || api.device_primary_ctx_retain == nullptr ||
      api.device_primary_ctx_release == nullptr || api.ctx_get_current == nullptr ||
      api.ctx_push_current == nullptr || api.ctx_pop_current == nullptr)
    return fail(pfErrorNotSupported,
                "the CUDA driver ({}) lacks cuDeviceGet, cuDevicePrimaryCtxRetain@7000, "
                "cuDevicePrimaryCtxRelease@11000 or the cuCtx push/pop calls: the runtime reaches "
                "its device only through the device's primary context, never by changing the "
                "caller's current device",
                api.driver_version);
  PF_DRIVER_CHECK(api.device_get(&cu_device_, ordinal_));
  PF_DRIVER_CHECK(api.device_primary_ctx_retain(&primary_, cu_device_));
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  // CUPTI first: activity must be enabled before the work it should see.
  if (options.enable_cupti || env_flag("PIPEFILL_CUPTI")) {
    if (start_cupti_collector([this] { return now_us(); }, &collector_) != pfSuccess) {
      collector_.reset();  // warned once inside; events only
      clear_last_error();
    }
  }
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
  log::info("CUDA device {} '{}' ({}): {} SMs, stream priorities {}..{} (lowest..highest), gate "
            "write {}, CUDA_DEVICE_MAX_CONNECTIONS={}, CUPTI {}",
            ordinal_, name_, source, sm_count_, lowest_priority_, highest_priority_,
            gate_write_mode_name(gate_mode_), connections ? connections : "unset",
            collector_ ? "on" : "off");
  return pfSuccess;
}

bool CudaDevice::enter_launch_context() {
  const DriverApi& api = driver_api();
  CUcontext current = nullptr;
  if (api.ctx_get_current == nullptr || api.ctx_get_current(&current) != CUDA_SUCCESS) return false;
  if (current == primary_) return false;
  const CUresult pushed = api.ctx_push_current(primary_);
  if (pushed != CUDA_SUCCESS) {
    log::warn("a launch callback runs without the device's primary context current: cuCtxPushCurrent "
              "failed: {}", driver_result_name(pushed));
    return false;
  }
  return true;
}

void CudaDevice::leave_launch_context() {
  CUcontext popped = nullptr;
  const CUresult result = driver_api().ctx_pop_current(&popped);
  if (result != CUDA_SUCCESS) log::warn("cuCtxPopCurrent after a launch callback failed: {}", driver_result_name(result));
}

pfResult_t CudaDevice::collect_activity(std::vector<ActivityRecord>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "collect_activity: out is null");
  if (!collector_)
    return fail(pfErrorNotSupported,
                "collect_activity: calibration mode is off (PIPEFILL_CUPTI=1) or CUPTI could not start");
  return collector_->flush(out);
}

double CudaDevice::now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void CudaDevice::shutdown() {
  // Best effort: the device is going away; failures are logged, never thrown.
  if (ordinal_ < 0 || primary_ == nullptr) return;
  shutdown_in_primary_context();
  const CUresult released = driver_api().device_primary_ctx_release(cu_device_);
  if (released != CUDA_SUCCESS) log::warn("cuDevicePrimaryCtxRelease failed: {}", driver_result_name(released));
  primary_ = nullptr;
}

void CudaDevice::shutdown_in_primary_context() {
  DeviceContextScope scope;
  if (scope.enter(primary_, cu_device_, ContextNeed::Primary) != pfSuccess) clear_last_error();
  for (cudaStream_t stream : fill_streams_) (void)cudaStreamDestroy(stream);
  for (cudaStream_t stream : main_streams_) (void)cudaStreamDestroy(stream);
  for (void* words : device_words_) (void)cudaFree(words);
  for (void* words : host_words_) (void)cudaFreeHost(words);
  for (auto& [base, bytes] : arenas_) (void)cudaFree(base);
  {
    MutexLock lock(twins_mutex_);
    for (auto& [event, twin] : twins_) (void)cudaEventDestroy(twin.event);  // events left behind
    twins_.clear();
  }
  if (reference_.pending) (void)cudaEventDestroy(reference_.pending);
  if (reference_.event) (void)cudaEventDestroy(reference_.event);
  if (control_stream_) (void)cudaStreamDestroy(control_stream_);
  if (gate_slots_) (void)cudaFreeHost(gate_slots_);
  destroy_capture_contexts();  // after their streams
  destroy_green_context();     // after its streams
  collector_.reset();
  (void)cudaGetLastError();
}

}  // namespace pipefill::cuda

namespace pipefill {

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
  int ordinal = options.device;
  std::string source = "config.device / PIPEFILL_DEVICE";
  if (!options.device_given) {
    PF_TRY(cuda::caller_device_ordinal(cuda::driver_api(), count, &ordinal, &source));
  } else if (options.device < 0 || options.device >= count) {
    return fail(pfErrorInvalidArgument, "device={} is out of range: {} CUDA device(s) visible", options.device,
                count);
  }
  auto device = std::make_unique<cuda::CudaDevice>();
  PF_TRY(device->init(options, ordinal, source));
  *out = std::move(device);
  return pfSuccess;
}

}  // namespace pipefill
