// The C boundary's exception guard (src/common/c_boundary.hpp), shared by pf*, pfHost* and
// pfSim*: every exception becomes a result code and a last-error message naming the function;
// before it was shared, the runtime's copy returned pfErrorInternal with no message for a
// non-standard exception.
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <string>

#include "common/c_boundary.hpp"
#include "pipefill/pipefill.h"

namespace pipefill {
namespace {

std::string last_message() { return pfGetLastErrorMessage(); }

TEST(CBoundary, ANonStandardExceptionIsAnInternalErrorWithAMessage) {
  EXPECT_EQ(c_boundary("pfSomething", []() -> pfResult_t { throw 42; }), pfErrorInternal);
  EXPECT_NE(last_message().find("pfSomething"), std::string::npos) << last_message();
  EXPECT_NE(last_message().find("non-standard exception"), std::string::npos) << last_message();
}

TEST(CBoundary, AStandardExceptionKeepsItsText) {
  EXPECT_EQ(c_boundary("pfOther", []() -> pfResult_t { throw std::runtime_error("disk on fire"); }),
            pfErrorInternal);
  EXPECT_NE(last_message().find("pfOther: internal error: disk on fire"), std::string::npos)
      << last_message();
}

TEST(CBoundary, BadAllocIsOutOfMemory) {
  EXPECT_EQ(c_boundary("pfAlloc", []() -> pfResult_t { throw std::bad_alloc(); }),
            pfErrorOutOfMemory);
  EXPECT_NE(last_message().find("pfAlloc"), std::string::npos) << last_message();
}

TEST(CBoundary, ASuccessClearsTheLastError) {
  (void)c_boundary("pfFails", []() -> pfResult_t { throw 1; });
  EXPECT_EQ(c_boundary("pfWorks", []() -> pfResult_t { return pfSuccess; }), pfSuccess);
  EXPECT_EQ(last_message(), "");
}

}  // namespace
}  // namespace pipefill
