#include "driver_api.hpp"

#include <cuda_runtime_api.h>

#include <mutex>

#include "common/log.hpp"

namespace pipefill::cuda {
namespace {

// Looks up `symbol` at the ABI version `version`; leaves `out` null when the driver lacks it.
template <typename Fn>
void resolve(const char* symbol, unsigned version, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &status);
  if (error != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();  // not sticky; keep the runtime's last-error slot clean
    log::debug("driver entry point {} (v{}) unavailable: {} / status {}", symbol, version,
               cudaGetErrorName(error), static_cast<int>(status));
    *out = nullptr;
    return;
  }
  *out = reinterpret_cast<Fn>(fn);
}

DriverApi load() {
  DriverApi api;
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    version = 0;
  }
  api.driver_version = version;
  if (version == 0) return api;  // no driver: every entry point stays null
  resolve("cuGetErrorName", 6000, &api.get_error_name);
  resolve("cuDeviceGet", 2000, &api.device_get);
  if (version >= kStreamWriteValue64DriverVersion)
    resolve("cuStreamWriteValue64", 11070, &api.stream_write_value64);
  if (version >= kGreenContextDriverVersion) {
    resolve("cuDeviceGetDevResource", 12040, &api.device_get_dev_resource);
    resolve("cuDevSmResourceSplitByCount", 12040, &api.dev_sm_resource_split_by_count);
    resolve("cuDevResourceGenerateDesc", 12040, &api.dev_resource_generate_desc);
    resolve("cuGreenCtxCreate", 12040, &api.green_ctx_create);
    resolve("cuGreenCtxStreamCreate", 12040, &api.green_ctx_stream_create);
    resolve("cuGreenCtxDestroy", 12040, &api.green_ctx_destroy);
  }
  return api;
}

}  // namespace

const char* DriverApi::green_context_absence_reason() const {
  if (driver_version == 0) return "no CUDA driver";
  if (driver_version < kGreenContextDriverVersion) return "driver older than 12.4";
  if (!has_green_contexts()) return "green-context entry points missing from the driver";
  return "";
}

const DriverApi& driver_api() {
  static std::once_flag once;
  static DriverApi api;
  std::call_once(once, [] { api = load(); });
  return api;
}

}  // namespace pipefill::cuda
