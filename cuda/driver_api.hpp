// Driver-API functions the backend needs, reached through cudaGetDriverEntryPointByVersion so
// that nothing links libcuda: binaries start on machines without a driver, and each function is
// simply absent (nullptr) when the installed driver is too old to provide it. <cuda.h> is
// included for its types only.
#pragma once

#include <cuda.h>

namespace pipefill::cuda {

struct DriverApi {
  int driver_version = 0;  // cudaDriverGetVersion (0: no driver)

  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  // Stream memory operation used to close the gate (a write, never a wait).
  CUresult (*stream_write_value64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int) = nullptr;
  // Green contexts (driver 12.4+).
  CUresult (*device_get_dev_resource)(CUdevice, CUdevResource*, CUdevResourceType) = nullptr;
  CUresult (*dev_sm_resource_split_by_count)(CUdevResource*, unsigned int*, const CUdevResource*,
                                             CUdevResource*, unsigned int, unsigned int) = nullptr;
  CUresult (*dev_resource_generate_desc)(CUdevResourceDesc*, CUdevResource*, unsigned int) = nullptr;
  CUresult (*green_ctx_create)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned int) = nullptr;
  CUresult (*green_ctx_stream_create)(CUstream*, CUgreenCtx, unsigned int, int) = nullptr;
  CUresult (*green_ctx_destroy)(CUgreenCtx) = nullptr;

  bool has_green_contexts() const {
    return device_get && device_get_dev_resource && dev_sm_resource_split_by_count &&
           dev_resource_generate_desc && green_ctx_create && green_ctx_stream_create &&
           green_ctx_destroy;
  }
  // Why green contexts are unavailable ("" when they are available).
  const char* green_context_absence_reason() const;
};

// Resolved once per process (thread-safe); every pointer may be null.
const DriverApi& driver_api();

// Oldest driver with each feature (CUDA version encoding, e.g. 12040 = 12.4).
inline constexpr int kGreenContextDriverVersion = 12040;
inline constexpr int kStreamWriteValue64DriverVersion = 11070;

}  // namespace pipefill::cuda
