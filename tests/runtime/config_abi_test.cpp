// pfConfig_t's `size` is honoured both ways: pfRuntimeGetConfig writes only the bytes of the
// caller's layout; pfRuntimeCreate reads only those and defaults the rest.
#include <gtest/gtest.h>

#include <algorithm>
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

// A caller built against the version 2 header (no fill_streams, no launch_mode): its struct is
// read only up to its size, the new fields take their defaults, and reading the config back into
// that layout writes nothing past it and says version 2.
TEST(ConfigAbi, Version2LayoutGetsDefaultsForTheAppendedFields) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  const size_t v2 = offsetof(pfConfig_t, fill_streams);
  std::vector<unsigned char> buffer(sizeof(pfConfig_t) + 64, 0x5A);  // garbage past the layout
  pfConfig_t base = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  base.size = v2;
  base.version = 2;
  std::memcpy(buffer.data(), &base, v2);
  pfRuntime_t rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(reinterpret_cast<pfConfig_t*>(buffer.data()), &rt));
  pfConfig_t full = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &full));
  EXPECT_EQ(full.fill_streams, 4);                 // the default, not the 0x5A bytes
  EXPECT_EQ(full.launch_mode, pfLaunchExecutor);   // auto on the simulator
  std::fill(buffer.begin(), buffer.end(), 0xAB);
  auto* older = reinterpret_cast<pfConfig_t*>(buffer.data());
  older->size = v2;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, older));
  EXPECT_EQ(older->version, 2);
  EXPECT_EQ(older->reserved_sms, stage.comm_sms);
  for (size_t i = v2; i < buffer.size(); ++i) {
    ASSERT_EQ(buffer[i], 0xAB) << "byte " << i << " lies beyond the caller's size";
  }
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// A caller built against the version 3 header (fill_streams and launch_mode, no
// gated_prediction_quantile): it keeps working, gets the default gated quantile (0.5), and reading
// the config back into its layout writes nothing past it and says version 3.
TEST(ConfigAbi, Version3LayoutGetsTheDefaultGatedQuantile) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  const size_t v3 = offsetof(pfConfig_t, launch_mode) + sizeof(int);
  ASSERT_EQ(v3, PF_CONFIG_V3_SIZE);
  std::vector<unsigned char> buffer(sizeof(pfConfig_t) + 64, 0x5A);  // garbage past the layout
  pfConfig_t base = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  base.size = v3;
  base.version = 3;
  base.fill_streams = 2;
  std::memcpy(buffer.data(), &base, v3);
  pfRuntime_t rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(reinterpret_cast<pfConfig_t*>(buffer.data()), &rt));
  pfConfig_t full = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &full));
  EXPECT_EQ(full.version, PF_CONFIG_VERSION);
  EXPECT_DOUBLE_EQ(full.gated_prediction_quantile, 0.5);  // the default, not the 0x5A bytes
  EXPECT_DOUBLE_EQ(full.prediction_quantile, 0.1);
  EXPECT_EQ(full.fill_streams, 2);                       // what the version-3 caller set
  std::fill(buffer.begin(), buffer.end(), 0xAB);
  auto* older = reinterpret_cast<pfConfig_t*>(buffer.data());
  older->size = v3;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, older));
  EXPECT_EQ(older->size, v3);
  EXPECT_EQ(older->version, 3);
  EXPECT_EQ(older->fill_streams, 2);
  for (size_t i = v3; i < buffer.size(); ++i) {
    ASSERT_EQ(buffer[i], 0xAB) << "byte " << i << " lies beyond the caller's size";
  }
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
  // pfConfigInitSized for that layout: version 3, nothing past it.
  std::fill(buffer.begin(), buffer.end(), 0xCD);
  PF_ASSERT_OK(pfConfigInitSized(reinterpret_cast<pfConfig_t*>(buffer.data()), v3));
  EXPECT_EQ(reinterpret_cast<pfConfig_t*>(buffer.data())->version, 3);
  EXPECT_EQ(reinterpret_cast<pfConfig_t*>(buffer.data())->size, v3);
  for (size_t i = v3; i < buffer.size(); ++i) ASSERT_EQ(buffer[i], 0xCD) << "byte " << i;
}

// The gated quantile set by a caller reaches the runtime and comes back; a bad one is refused
// with the field and the value named, and nothing is created.
TEST(ConfigAbi, GatedQuantileIsValidatedAndExported) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t c = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  c.gated_prediction_quantile = 0.8;
  pfRuntime_t rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
  pfConfig_t got = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &got));
  EXPECT_DOUBLE_EQ(got.gated_prediction_quantile, 0.8);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
  c.gated_prediction_quantile = 1.5;
  rt = nullptr;
  EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument);
  EXPECT_EQ(rt, nullptr);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("config.gated_prediction_quantile = 1.5"),
            std::string::npos)
      << pfGetLastErrorMessage();
}

// pfConfigInit as a binary built against the 0.2 header calls it (the exported symbol, not
// this header's macro): it fills the version-2 layout and writes nothing past it. (Python's
// ctypes test harness, laid out from the 0.2 header, crashed when it wrote the whole struct.)
TEST(ConfigAbi, ExportedConfigInitWritesOnlyTheVersion2Layout) {
  std::vector<unsigned char> buffer(sizeof(pfConfig_t) + 64, 0xAB);
  auto* config = reinterpret_cast<pfConfig_t*>(buffer.data());
  PF_ASSERT_OK((pfConfigInit)(config));  // the parentheses bypass the macro
  EXPECT_EQ(config->size, PF_CONFIG_V2_SIZE);
  EXPECT_EQ(config->version, 2);
  const pfConfig_t init = PF_CONFIG_INITIALIZER;
  EXPECT_EQ(config->reserved_sms, init.reserved_sms);
  EXPECT_EQ(config->sim_memory_bytes, init.sim_memory_bytes);
  for (size_t i = PF_CONFIG_V2_SIZE; i < buffer.size(); ++i) {
    ASSERT_EQ(buffer[i], 0xAB) << "byte " << i << " lies beyond the version-2 layout";
  }
  // What it wrote is valid input: the appended fields take their defaults.
  config->backend = pfBackendSim;
  pfRuntime_t rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(config, &rt));
  pfConfig_t got = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &got));
  EXPECT_EQ(got.fill_streams, 4);
  EXPECT_EQ(got.launch_mode, pfLaunchExecutor);  // auto on a simulated (multi-queue) device
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(ConfigAbi, SizedConfigInitFillsTheCallersLayout) {
  // The header's pfConfigInit: the whole current struct, byte for byte the initializer.
  pfConfig_t full;
  std::memset(&full, 0x5A, sizeof full);
  PF_ASSERT_OK(pfConfigInit(&full));
  const pfConfig_t init = PF_CONFIG_INITIALIZER;
  EXPECT_EQ(full.size, sizeof(pfConfig_t));
  EXPECT_EQ(full.version, PF_CONFIG_VERSION);
  EXPECT_EQ(full.fill_streams, init.fill_streams);
  EXPECT_EQ(full.launch_mode, init.launch_mode);
  EXPECT_EQ(full.sim_world, nullptr);
  // A layout between versions gets the version-2 header values and nothing past its size.
  std::vector<unsigned char> buffer(sizeof(pfConfig_t) + 16, 0xCD);
  auto* config = reinterpret_cast<pfConfig_t*>(buffer.data());
  const size_t between = PF_CONFIG_V2_SIZE + sizeof(int);
  PF_ASSERT_OK(pfConfigInitSized(config, between));
  EXPECT_EQ(config->size, between);
  EXPECT_EQ(config->version, 2);
  for (size_t i = between; i < buffer.size(); ++i) ASSERT_EQ(buffer[i], 0xCD) << "byte " << i;
  // Too small for any layout: refused, nothing written.
  std::vector<unsigned char> small(64, 0xEE);
  EXPECT_EQ(pfConfigInitSized(reinterpret_cast<pfConfig_t*>(small.data()), 8),
            pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("config_size = 8"), std::string::npos)
      << pfGetLastErrorMessage();
  for (unsigned char b : small) ASSERT_EQ(b, 0xEE);
  EXPECT_EQ(pfConfigInitSized(nullptr, sizeof(pfConfig_t)), pfErrorInvalidArgument);
}

}  // namespace
}  // namespace pipefill::testing
