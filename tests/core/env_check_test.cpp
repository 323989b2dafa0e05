// Unknown PIPEFILL_* environment variables: found in an environ-style array and matched to the
// nearest known name (core/env_check.hpp), so pfRuntimeCreate can warn about a typo instead of
// ignoring it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/env_check.hpp"

namespace pipefill::core {
namespace {

TEST(EnvCheck, TyposGetTheNearestKnownName) {
  EXPECT_EQ(nearest_environment_variable("PIPEFILL_RESERVED_SM"), "PIPEFILL_RESERVED_SMS");
  EXPECT_EQ(nearest_environment_variable("PIPEFILL_BAKEND"), "PIPEFILL_BACKEND");
  EXPECT_EQ(nearest_environment_variable("PIPEFILL_MIN_SAMPLE"), "PIPEFILL_MIN_SAMPLES");
  EXPECT_EQ(nearest_environment_variable("PIPEFILL_STAGEID"), "PIPEFILL_STAGE_ID");
  // Nothing close: no suggestion rather than a misleading one.
  EXPECT_EQ(nearest_environment_variable("PIPEFILL_COMPLETELY_DIFFERENT_THING"), "");
}

TEST(EnvCheck, OnlyUnknownPipefillNamesAreReported) {
  const char* environment[] = {"PATH=/usr/bin",          "PIPEFILL_BACKEND=sim",
                               "PIPEFILL_RESERVED_SM=8", "PIPEFILL_DEBUG=trace",
                               "PIPEFILL_BAKEND",        "XPIPEFILL_FOO=1",
                               nullptr};
  const std::vector<std::string> unknown = unknown_environment_variables(environment);
  EXPECT_EQ(unknown, (std::vector<std::string>{"PIPEFILL_RESERVED_SM", "PIPEFILL_BAKEND"}));
  EXPECT_TRUE(unknown_environment_variables(nullptr).empty());
}

TEST(EnvCheck, EveryVariableTheConfigReadsIsKnown) {
  // Unknown names would be warned about although the library reads them.
  const char* environment[] = {
      "PIPEFILL_ARENA_BYTES=1",        "PIPEFILL_CUPTI=0",          "PIPEFILL_DEVICE=0",
      "PIPEFILL_FILL_STREAMS=2",       "PIPEFILL_GATED_QUANTILE=1", "PIPEFILL_LAUNCH=auto",
      "PIPEFILL_POLICY=fifo",          "PIPEFILL_QUANTILE=0.1",     "PIPEFILL_SIM_SEED=1",
      "PIPEFILL_SAFETY_MARGIN_US=1",   "PIPEFILL_SAFETY_MARGIN_FRACTION=0",
      "PIPEFILL_SIM_SMS=8",            "PIPEFILL_SIM_MEMORY_BYTES=1G",
      "PIPEFILL_STAGE_COUNT=2",        "PIPEFILL_FILL_OPTIMIZER_BUBBLES=1",
      "PIPEFILL_HOST_SMS=4",           "PIPEFILL_HOST_MEMORY_BYTES=1G",
      "PIPEFILL_GREEN_CONTEXT=0",      "PIPEFILL_NOTICED_QUANTILE=1",
      "PIPEFILL_HOST_TIME_BUDGET=1",   nullptr};
  EXPECT_TRUE(unknown_environment_variables(environment).empty());
}

}  // namespace
}  // namespace pipefill::core
