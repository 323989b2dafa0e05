// Error reporting shared by every layer: a result code plus a thread-local message, the way
// NCCL reports errors. Nothing here throws; the C boundary (src/capi) additionally catches
// every exception so none can cross it.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

#include "pipefill/pipefill.h"

namespace pipefill {

// Stores `message` as this thread's last error message and logs it at debug level.
// Returns `code` so callers can write `return set_error(...)`.
pfResult_t set_error(pfResult_t code, std::string message);

template <typename... Args>
pfResult_t fail(pfResult_t code, fmt::format_string<Args...> format, Args&&... args) {
  return set_error(code, fmt::format(format, std::forward<Args>(args)...));
}

// This thread's last error message ("" when none).
const std::string& last_error_message();
void clear_last_error();

const char* result_name(pfResult_t code);

}  // namespace pipefill

// Propagates a non-success result (the message is already set by the callee).
#define PF_TRY(expr)                               \
  do {                                             \
    const pfResult_t pf_try_result_ = (expr);      \
    if (pf_try_result_ != pfSuccess) return pf_try_result_; \
  } while (0)
