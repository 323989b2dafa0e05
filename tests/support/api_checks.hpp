// Checks of C API results shared by the C++ test areas (runtime, graph, host, executor): a call
// that must succeed, and a call that must fail with a given code and a message naming the
// problem. Header-only; tests/support holds no test of its own.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "pipefill/pipefill.h"

// Asserts that `expr` returns pfSuccess; the failure shows the call and the library's message.
#define PF_ASSERT_OK(expr)                                                   \
  do {                                                                       \
    const pfResult_t pf_r_ = (expr);                                         \
    ASSERT_EQ(pf_r_, pfSuccess) << #expr << ": " << pfGetLastErrorMessage(); \
  } while (0)

namespace pipefill::testing {

// Expects `got` to be `want` and the thread's last error message to contain `message_part`
// (the message is read right after the call, before anything else can replace it).
inline void expect_error(pfResult_t got, pfResult_t want, const std::string& message_part) {
  const std::string message = pfGetLastErrorMessage();
  EXPECT_EQ(got, want) << pfGetErrorString(got) << " / " << message;
  EXPECT_NE(message.find(message_part), std::string::npos)
      << "message '" << message << "' lacks '" << message_part << "'";
}

}  // namespace pipefill::testing

// expect_error on `call`, with the call's text and line in the failure (SCOPED_TRACE).
#define EXPECT_FAILS_WITH(call, code, needle)                  \
  do {                                                         \
    SCOPED_TRACE(#call);                                       \
    ::pipefill::testing::expect_error((call), (code), (needle)); \
  } while (0)
