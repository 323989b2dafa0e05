// CUPTI reached through a function table loaded at first use (lazy_library.hpp says why): only
// the calibration mode (enable_cupti) loads it, so a training process whose runtime never
// calibrates never maps libcupti, and one that profiles with torch.profiler shares its copy.
#pragma once

#include <cupti.h>

#include "lazy_library.hpp"

#define PF_CUPTI_FUNCTIONS(X)                                                                  \
  X(cuptiActivityDisable) X(cuptiActivityEnable) X(cuptiActivityFlushAll)                      \
  X(cuptiActivityGetNextRecord) X(cuptiActivityGetNumDroppedRecords)                           \
  X(cuptiActivityRegisterCallbacks) X(cuptiGetContextId) X(cuptiGetStreamIdEx)                 \
  X(cuptiGetTimestamp) X(cuptiGetResultString)

#ifndef PIPEFILL_CUPTI_SONAME
#define PIPEFILL_CUPTI_SONAME "libcupti.so"
#endif
#ifndef PIPEFILL_CUPTI_FALLBACK
#define PIPEFILL_CUPTI_FALLBACK ""
#endif

namespace pipefill::cuda {

struct CuptiApi {
#define PF_CUPTI_FIELD(name) decltype(&::name) name = nullptr;
  PF_CUPTI_FUNCTIONS(PF_CUPTI_FIELD)
#undef PF_CUPTI_FIELD
  bool ok = false;
  std::string where;
  std::string error;
};

// Loads CUPTI on the first call (thread-safe).
const CuptiApi& cupti_api();
// The table if CUPTI was already loaded by cupti_api(), else null (error naming never loads it).
const CuptiApi* cupti_api_if_loaded();

}  // namespace pipefill::cuda
