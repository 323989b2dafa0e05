// What every C entry point shares (capi.cpp, capi_stats.cpp): the exception guard that clears
// the thread's last error and turns any exception into a result code, and the check that refuses
// an implausible caller struct size before anything is written through it.
#pragma once

#include <cstddef>
#include <exception>
#include <new>

#include "common/error.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::capi {

template <typename Body>
pfResult_t guarded(const char* function, Body&& body) noexcept {
  try {
    pipefill::clear_last_error();
    return body();
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "{}: host memory allocation failed", function);
  } catch (const std::exception& e) {
    return fail(pfErrorInternal, "{}: internal error: {}", function, e.what());
  } catch (...) {
    return pfErrorInternal;
  }
}

// A caller's struct size (or byte count) above PF_MAX_STRUCT_SIZE is not a later header's layout
// but an uninitialised or corrupt value: refused before anything is written through it.
inline pfResult_t check_plausible_size(const char* what, size_t size) {
  if (size <= PF_MAX_STRUCT_SIZE) return pfSuccess;
  return fail(pfErrorInvalidArgument,
              "{} = {} is implausible (above PF_MAX_STRUCT_SIZE = {}): set it to the sizeof of "
              "the struct (start from its initializer)",
              what, size, PF_MAX_STRUCT_SIZE);
}

}  // namespace pipefill::capi
