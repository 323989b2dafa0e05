#include "cuda_check.hpp"

#include <cupti.h>

#include <cstring>

#include "driver_api.hpp"
#ifdef PIPEFILL_WITH_NCCL
#include <nccl.h>
#endif

namespace pipefill::cuda {

const char* short_file_name(const char* file) {
  if (file == nullptr) return "?";
  // Paths inside the source tree are shown relative to it ("cuda/x.cpp", "tests/cuda/t.cpp").
#ifdef PIPEFILL_SOURCE_PREFIX
  constexpr const char* kPrefix = PIPEFILL_SOURCE_PREFIX;
  const size_t prefix_length = std::strlen(kPrefix);
  if (std::strncmp(file, kPrefix, prefix_length) == 0) return file + prefix_length;
#endif
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

pfResult_t cuda_failure(cudaError_t error, const char* call, const char* file, int line) {
  // Reading the error resets CUDA's per-thread last error when it is not sticky; a sticky error
  // (the context is dead) keeps being reported by every later call, which is what we want.
  (void)cudaGetLastError();
  return fail(pfErrorCudaFailure, "{} failed at {}:{}: {} ({})", call, short_file_name(file),
              line, cudaGetErrorName(error), cudaGetErrorString(error));
}

pfResult_t driver_failure(int result, const char* call, const char* file, int line) {
  const char* name = nullptr;
  const auto& api = driver_api();
  if (api.get_error_name == nullptr ||
      api.get_error_name(static_cast<CUresult>(result), &name) != CUDA_SUCCESS || name == nullptr)
    name = "CUresult";
  return fail(pfErrorCudaFailure, "{} failed at {}:{}: {} ({})", call, short_file_name(file),
              line, name, result);
}

std::string driver_result_name(int result) {
  const char* name = nullptr;
  const auto& api = driver_api();
  if (api.get_error_name != nullptr &&
      api.get_error_name(static_cast<CUresult>(result), &name) == CUDA_SUCCESS && name != nullptr)
    return name;
  return "CUresult " + std::to_string(result);
}

pfResult_t cupti_failure(int result, const char* call, const char* file, int line) {
  const char* name = nullptr;
  if (cuptiGetResultString(static_cast<CUptiResult>(result), &name) != CUPTI_SUCCESS ||
      name == nullptr)
    name = "CUPTI_ERROR_UNKNOWN";
  return fail(pfErrorCuptiFailure, "{} failed at {}:{}: {} ({})", call, short_file_name(file),
              line, name, result);
}

pfResult_t nccl_failure(int result, const char* call, const char* file, int line) {
#ifdef PIPEFILL_WITH_NCCL
  const char* name = ncclGetErrorString(static_cast<ncclResult_t>(result));
#else
  const char* name = "ncclResult_t";
#endif
  return fail(pfErrorNcclFailure, "{} failed at {}:{}: {} ({})", call, short_file_name(file),
              line, name ? name : "?", result);
}

}  // namespace pipefill::cuda
