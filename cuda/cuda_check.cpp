#include "cuda_check.hpp"

#include <dlfcn.h>

#include <cstring>
#include <iterator>

#include "cupti_api.hpp"
#include "driver_api.hpp"

namespace pipefill::cuda {

const char* short_file_name(const char* file) {
  if (file == nullptr) return "?";
  // Paths inside the source tree are shown relative to it ("cuda/x.cpp", "tests/cuda/t.cpp").
#ifdef PIPEFILL_SOURCE_PREFIX
  constexpr const char* kPrefix = PIPEFILL_SOURCE_PREFIX;
  const size_t prefix_length = std::strlen(kPrefix);
  if (std::strncmp(file, kPrefix, prefix_length) == 0) return file + prefix_length;
#endif
  // A path relative to the build folder (compiler launchers such as ccache with base_dir pass
  // relative paths): "../tests/cuda/t.cpp" -> "tests/cuda/t.cpp".
  if (file[0] == '.') {
    const char* rest = file;
    while (std::strncmp(rest, "../", 3) == 0 || std::strncmp(rest, "./", 2) == 0) rest += rest[1] == '/' ? 2 : 3;
    if (rest != file && *rest != '\0') return rest;
  }
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
  // CUPTI is loaded only in calibration mode (cupti_api.hpp); a CUPTI result exists only after a
  // CUPTI call, so the table is there to name it - but never load CUPTI just to name an error.
  const char* name = nullptr;
  const CuptiApi* api = cupti_api_if_loaded();
  if (api == nullptr || api->cuptiGetResultString(static_cast<CUptiResult>(result), &name) != CUPTI_SUCCESS ||
      name == nullptr)
    name = "CUptiResult";
  return fail(pfErrorCuptiFailure, "{} failed at {}:{}: {} ({})", call, short_file_name(file),
              line, name, result);
}

const char* nccl_result_name(int result) {
  // The library never links or loads NCCL (the training process chooses its NCCL): ask the copy
  // the process already has, if any, else name the ncclResult_t value ourselves (nccl.h's enum,
  // stable since NCCL 2.0; 7 since 2.14).
  using GetErrorString = const char* (*)(int);
  if (auto* get = reinterpret_cast<GetErrorString>(dlsym(RTLD_DEFAULT, "ncclGetErrorString")))
    if (const char* name = get(result)) return name;
  static constexpr const char* kNames[] = {"ncclSuccess",         "ncclUnhandledCudaError",
                                           "ncclSystemError",     "ncclInternalError",
                                           "ncclInvalidArgument", "ncclInvalidUsage",
                                           "ncclRemoteError",     "ncclInProgress"};
  if (result >= 0 && result < static_cast<int>(std::size(kNames))) return kNames[result];
  return "ncclResult_t";
}

pfResult_t nccl_failure(int result, const char* call, const char* file, int line) {
  return fail(pfErrorNcclFailure, "{} failed at {}:{}: {} ({})", call, short_file_name(file),
              line, nccl_result_name(result), result);
}

}  // namespace pipefill::cuda
