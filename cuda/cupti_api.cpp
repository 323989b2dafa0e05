// The CUPTI function table (cupti_api.hpp): loaded once, by the first calibration-mode collector.
#include "cupti_api.hpp"

#include <atomic>

namespace pipefill::cuda {
namespace {
std::atomic<const CuptiApi*> g_loaded{nullptr};
}  // namespace

const CuptiApi& cupti_api() {
  static const CuptiApi api = [] {
    CuptiApi a;
    const LazyLibrary lib = open_lazy_library(PIPEFILL_CUPTI_SONAME, PIPEFILL_CUPTI_FALLBACK);
    if (lib.handle == nullptr) {
      a.error = "CUPTI could not be loaded (" + lib.error + ")";
      return a;
    }
    std::string missing;
#define PF_CUPTI_RESOLVE(name) resolve_symbol(lib.handle, PF_LAZY_STR(name), &a.name, &missing);
    PF_CUPTI_FUNCTIONS(PF_CUPTI_RESOLVE)
#undef PF_CUPTI_RESOLVE
    a.where = lib.path;
    if (!missing.empty()) {
      a.error = "CUPTI from " + lib.path + " lacks " + missing;
      return a;
    }
    a.ok = true;
    return a;
  }();
  g_loaded.store(&api, std::memory_order_release);
  return api;
}

const CuptiApi* cupti_api_if_loaded() {
  const CuptiApi* api = g_loaded.load(std::memory_order_acquire);
  return api != nullptr && api->ok ? api : nullptr;
}

}  // namespace pipefill::cuda
