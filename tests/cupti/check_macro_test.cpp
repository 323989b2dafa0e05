// PF_CUPTI_CHECK's message names a failing CUPTI call as CUPTI's API spells it
// ("cuptiActivityEnable(kind) failed at ..."), not as the dlopen'ed table reaches it. Tested on
// CPU through a table whose entry fails (CUPTI is never loaded).
#include <gtest/gtest.h>

#include <string>

#include "common/error.hpp"
#include "cupti_api.hpp"

namespace pipefill::cuda {
namespace {

CUptiResult enable_not_initialized(CUpti_ActivityKind) { return CUPTI_ERROR_NOT_INITIALIZED; }
CUptiResult enable_succeeds(CUpti_ActivityKind) { return CUPTI_SUCCESS; }

pfResult_t enable_through(const CuptiApi& api, CUpti_ActivityKind kind) {
  PF_CUPTI_CHECK_IN(api, cuptiActivityEnable, (kind));
  return pfSuccess;
}

TEST(CuptiCheck, MessageNamesTheCuptiFunctionAndItsArguments) {
  CuptiApi api;
  api.cuptiActivityEnable = &enable_not_initialized;
  EXPECT_EQ(enable_through(api, CUPTI_ACTIVITY_KIND_MEMCPY), pfErrorCuptiFailure);
  const std::string message = last_error_message();
  EXPECT_EQ(message.rfind("cuptiActivityEnable(kind) failed at ", 0), 0u) << message;
  EXPECT_NE(message.find("check_macro_test.cpp:"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(static_cast<int>(CUPTI_ERROR_NOT_INITIALIZED))),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("cupti_api"), std::string::npos) << message;
  EXPECT_EQ(message.find("api."), std::string::npos) << message;
}

TEST(CuptiCheck, SuccessPassesThrough) {
  CuptiApi api;
  api.cuptiActivityEnable = &enable_succeeds;
  EXPECT_EQ(enable_through(api, CUPTI_ACTIVITY_KIND_MEMCPY), pfSuccess);
}

}  // namespace
}  // namespace pipefill::cuda
