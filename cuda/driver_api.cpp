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
  // Symbols newer than the driver are not asked for at all (they would only log a miss).
#define PIPEFILL_RESOLVE_ENTRY_POINT(member, symbol, symbol_version, group) \
  if (version >= symbol_version) resolve(#symbol, symbol_version, &api.member);
  PIPEFILL_DRIVER_ENTRY_POINTS(PIPEFILL_RESOLVE_ENTRY_POINT)
#undef PIPEFILL_RESOLVE_ENTRY_POINT
  return api;
}

}  // namespace

std::string DriverApi::missing_entry_points(EntryPointGroup wanted) const {
  std::string missing;
#define PIPEFILL_LIST_MISSING(member, symbol, symbol_version, group)   \
  if (EntryPointGroup::group == wanted && member == nullptr) {         \
    if (!missing.empty()) missing += ", ";                             \
    missing += #symbol "@" #symbol_version;                            \
  }
  PIPEFILL_DRIVER_ENTRY_POINTS(PIPEFILL_LIST_MISSING)
#undef PIPEFILL_LIST_MISSING
  return missing;
}

const char* DriverApi::green_context_absence_reason() const {
  if (driver_version == 0) return "no CUDA driver";
  if (driver_version < kGreenContextDriverVersion) return "driver older than 12.5 (green contexts need cuGreenCtxStreamCreate)";
  if (!has_green_contexts()) return "green-context entry points missing from a >= 12.5 driver";
  return "";
}

const DriverApi& driver_api() {
  static std::once_flag once;
  static DriverApi api;
  std::call_once(once, [] { api = load(); });
  return api;
}

}  // namespace pipefill::cuda
