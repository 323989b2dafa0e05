// The exception guard of every C entry point (the runtime's pf*, the host device's pfHost*, the
// simulator's pfSim*): it clears the thread's last error, runs the body and turns any exception
// into a result code with a message that names the function - a non-standard exception too, so
// no failure leaves pfGetLastErrorMessage empty. One guard for the three, as faiss's c_api does.
#pragma once

#include <exception>
#include <new>

#include "common/error.hpp"
#include "pipefill/pipefill.h"

namespace pipefill {

template <typename Body>
pfResult_t c_boundary(const char* function, Body&& body) noexcept {
  try {
    clear_last_error();
    return body();
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "{}: host memory allocation failed", function);
  } catch (const std::exception& e) {
    return fail(pfErrorInternal, "{}: internal error: {}", function, e.what());
  } catch (...) {
    return fail(pfErrorInternal, "{}: internal error: a non-standard exception", function);
  }
}

}  // namespace pipefill
