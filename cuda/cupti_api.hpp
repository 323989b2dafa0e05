// CUPTI reached through a function table loaded at first use (lazy_library.hpp says why): only
// the calibration mode (enable_cupti) loads it, so a training process whose runtime never
// calibrates never maps libcupti, and one that profiles with torch.profiler shares its copy.
#pragma once

#include <cupti.h>

#include "cuda_check.hpp"
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

// Calls CUPTI's `function` with `args` (a parenthesised list) through `api`, a CuptiApi, and on a
// result other than CUPTI_SUCCESS returns from the enclosing function with cupti_failure's
// pfResult_t. The message names the call as CUPTI's API spells it, e.g.
//   "cuptiActivityEnable(kind) failed at cuda/cupti_collector.cpp:170: CUPTI_ERROR_... (N)",
// not as the table is reached.
#define PF_CUPTI_CHECK_IN(api, function, args)                                                \
  do {                                                                                        \
    const int pf_cupti_result_ = static_cast<int>((api).function args);                       \
    if (pf_cupti_result_ != 0)                                                                \
      return ::pipefill::cuda::cupti_failure(pf_cupti_result_, #function #args, __FILE__,     \
                                             __LINE__);                                       \
  } while (0)

// PF_CUPTI_CHECK_IN on the process's table (loaded at first use): PF_CUPTI_CHECK(cuptiActivityEnable, (kind)).
#define PF_CUPTI_CHECK(function, args) \
  PF_CUPTI_CHECK_IN(::pipefill::cuda::cupti_api(), function, args)
