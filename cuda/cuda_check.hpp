// Result checking for every CUDA runtime, driver (through entry points), CUPTI and NCCL call of
// the backend. A failing call becomes a pfResult_t plus a thread-local message that names the
// call text, file:line and the library's error name, e.g.
//   "cudaMalloc(&ptr, bytes) failed at cuda/cuda_device_memory.cpp:120: cudaErrorMemoryAllocation (out of memory)"
// Nothing here throws; the macros return from the enclosing function.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.hpp"

namespace pipefill::cuda {

// Builds the message and stores it as the thread's last error; returns pfErrorCudaFailure.
// Also clears CUDA's non-sticky last error so a later cudaGetLastError does not re-report it.
pfResult_t cuda_failure(cudaError_t error, const char* call, const char* file, int line);
// Driver API results (CUresult values) reached through entry points; the name comes from
// cuGetErrorName when that entry point resolves, else the number is printed.
pfResult_t driver_failure(int result, const char* call, const char* file, int line);
// CUPTI results (CUptiResult values), named through cuptiGetResultString once CUPTI is loaded.
// The check macro of CUPTI calls is PF_CUPTI_CHECK in cupti_api.hpp (they go through its table).
pfResult_t cupti_failure(int result, const char* call, const char* file, int line);
// NCCL results (ncclResult_t values), named through the process's own ncclGetErrorString when
// NCCL is loaded (the library never loads it), else by the enum's name.
pfResult_t nccl_failure(int result, const char* call, const char* file, int line);
const char* nccl_result_name(int result);

// The driver's name for a CUresult ("CUDA_ERROR_INVALID_VALUE"), through cuGetErrorName when that
// entry point resolves, else "CUresult <number>".
std::string driver_result_name(int result);

// The file name relative to the source tree (for short messages).
const char* short_file_name(const char* file);

}  // namespace pipefill::cuda

#define PF_CUDA_CHECK(call)                                                              \
  do {                                                                                   \
    const cudaError_t pf_cuda_error_ = (call);                                           \
    if (pf_cuda_error_ != cudaSuccess)                                                   \
      return ::pipefill::cuda::cuda_failure(pf_cuda_error_, #call, __FILE__, __LINE__);  \
  } while (0)

// For driver entry points: `call` evaluates to a CUresult (an int-compatible enum).
#define PF_DRIVER_CHECK(call)                                                             \
  do {                                                                                    \
    const int pf_driver_result_ = static_cast<int>(call);                                 \
    if (pf_driver_result_ != 0)                                                           \
      return ::pipefill::cuda::driver_failure(pf_driver_result_, #call, __FILE__, __LINE__); \
  } while (0)

#define PF_NCCL_CHECK(call)                                                               \
  do {                                                                                    \
    const int pf_nccl_result_ = static_cast<int>(call);                                   \
    if (pf_nccl_result_ != 0)                                                             \
      return ::pipefill::cuda::nccl_failure(pf_nccl_result_, #call, __FILE__, __LINE__);  \
  } while (0)
