// What every C entry point shares (capi.cpp, capi_stats.cpp): the exception guard (the one of
// common/c_boundary.hpp) and the check that refuses an implausible caller struct size before
// anything is written through it.
#pragma once

#include <cstddef>

#include "common/c_boundary.hpp"
#include "common/error.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::capi {

// The C boundary's exception guard (common/c_boundary.hpp, shared with pfHost* and pfSim*).
template <typename Body>
pfResult_t guarded(const char* function, Body&& body) noexcept {
  return c_boundary(function, static_cast<Body&&>(body));
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
