// pfConfig_t's `size` is honoured both ways: pfRuntimeGetConfig writes only the bytes of the
// caller's layout; pfRuntimeCreate reads only those and defaults the rest.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

TEST(ConfigAbi, GetConfigIntoAnOlderSmallerStruct) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  // An older layout that ends before enable_cupti, in a buffer with guard bytes after it.
  const size_t older = offsetof(pfConfig_t, enable_cupti);
  std::vector<unsigned char> buffer(sizeof(pfConfig_t) + 64, 0xAB);
  pfConfig_t init = PF_CONFIG_INITIALIZER;
  std::memcpy(buffer.data(), &init, older);
  auto* config = reinterpret_cast<pfConfig_t*>(buffer.data());
  config->size = older;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, config));
  EXPECT_EQ(config->size, older);
  EXPECT_EQ(config->reserved_sms, stage.comm_sms);
  EXPECT_EQ(config->arena_bytes, size_t{64} << 20);
  EXPECT_EQ(config->backend, pfBackendSim);
  for (size_t i = older; i < buffer.size(); ++i) {
    ASSERT_EQ(buffer[i], 0xAB) << "byte " << i << " lies beyond the caller's size";
  }
  // Too small to hold even size and version.
  pfConfig_t tiny = PF_CONFIG_INITIALIZER;
  tiny.size = 4;
  EXPECT_EQ(pfRuntimeGetConfig(rt, &tiny), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("config->size = 4"), std::string::npos)
      << pfGetLastErrorMessage();
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(ConfigAbi, FullStructRoundTrips) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  pfConfig_t got = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &got));
  EXPECT_EQ(got.size, sizeof(pfConfig_t));
  EXPECT_EQ(got.version, PF_CONFIG_VERSION);
  got.sim_world = stage.world.get();
  got.stage_id = 0;
  pfRuntime_t again = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(&got, &again));  // a config read back is valid input
  PF_ASSERT_OK(pfRuntimeDestroy(again));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
