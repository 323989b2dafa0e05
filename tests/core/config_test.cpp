#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "core/config.hpp"
#include "core/fill_resources.hpp"

namespace pipefill {
namespace {

// Clears every PIPEFILL_* variable the resolver reads so tests do not depend on the caller's
// environment, and restores nothing (tests set what they need).
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
  static constexpr const char* kVars[] = {
      "PIPEFILL_BACKEND", "PIPEFILL_DEVICE", "PIPEFILL_STAGE_ID", "PIPEFILL_STAGE_COUNT",
      "PIPEFILL_RESERVED_SMS", "PIPEFILL_SAFETY_MARGIN_US", "PIPEFILL_SAFETY_MARGIN_FRACTION",
      "PIPEFILL_ARENA_BYTES", "PIPEFILL_QUANTILE", "PIPEFILL_MIN_SAMPLES", "PIPEFILL_POLICY",
      "PIPEFILL_DEBUG", "PIPEFILL_CUPTI", "PIPEFILL_SIM_SEED", "PIPEFILL_SIM_SMS",
      "PIPEFILL_SIM_MEMORY_BYTES", "PIPEFILL_GATED_QUANTILE", "PIPEFILL_TOO_SHORT_WARN_BUBBLES",
      "PIPEFILL_NOTICED_QUANTILE"};
};

TEST_F(ConfigTest, NullConfigGivesDefaults) {
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(nullptr, &o), pfSuccess);
  EXPECT_EQ(o.backend, pfBackendAuto);
  EXPECT_EQ(o.device, 0);
  EXPECT_EQ(o.stage_id, 0);
  EXPECT_EQ(o.stage_count, 1);
  EXPECT_EQ(o.reserved_sms, -1);
  EXPECT_DOUBLE_EQ(o.safety_margin_us, 20.0);
  EXPECT_DOUBLE_EQ(o.safety_margin_fraction, 0.05);
  EXPECT_EQ(o.arena_bytes, 0u);
  EXPECT_DOUBLE_EQ(o.prediction_quantile, 0.1);
  EXPECT_DOUBLE_EQ(o.gated_prediction_quantile, 0.5);  // the median, for gated work
  EXPECT_EQ(o.min_samples, 2);
  EXPECT_EQ(o.policy, pfPolicyFifo);
  EXPECT_EQ(o.log_level, pfLogWarn);
  EXPECT_FALSE(o.enable_cupti);
  EXPECT_EQ(o.sim_seed, 1u);
  EXPECT_EQ(o.sim_sm_count, 132);
  EXPECT_EQ(o.sim_memory_bytes, size_t{141} << 30);
}

TEST_F(ConfigTest, InitializerEqualsNull) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  RuntimeOptions a, b;
  ASSERT_EQ(resolve_config(&c, &a), pfSuccess);
  ASSERT_EQ(resolve_config(nullptr, &b), pfSuccess);
  EXPECT_EQ(a.min_samples, b.min_samples);
  EXPECT_EQ(a.arena_bytes, b.arena_bytes);
}

TEST_F(ConfigTest, EnvironmentFillsUnsetFields) {
  setenv("PIPEFILL_BACKEND", "sim", 1);
  setenv("PIPEFILL_DEVICE", "3", 1);
  setenv("PIPEFILL_STAGE_COUNT", "4", 1);
  setenv("PIPEFILL_STAGE_ID", "2", 1);
  setenv("PIPEFILL_RESERVED_SMS", "16", 1);
  setenv("PIPEFILL_SAFETY_MARGIN_US", "7.5", 1);
  setenv("PIPEFILL_SAFETY_MARGIN_FRACTION", "0.25", 1);
  setenv("PIPEFILL_ARENA_BYTES", "64M", 1);
  setenv("PIPEFILL_QUANTILE", "0.5", 1);
  setenv("PIPEFILL_GATED_QUANTILE", "0.75", 1);
  setenv("PIPEFILL_MIN_SAMPLES", "5", 1);
  setenv("PIPEFILL_POLICY", "srpt", 1);
  setenv("PIPEFILL_DEBUG", "info", 1);
  setenv("PIPEFILL_CUPTI", "1", 1);
  setenv("PIPEFILL_SIM_SEED", "42", 1);
  setenv("PIPEFILL_SIM_SMS", "108", 1);
  setenv("PIPEFILL_SIM_MEMORY_BYTES", "80G", 1);
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(nullptr, &o), pfSuccess) << last_error_message();
  EXPECT_EQ(o.backend, pfBackendSim);
  EXPECT_EQ(o.device, 3);
  EXPECT_EQ(o.stage_count, 4);
  EXPECT_EQ(o.stage_id, 2);
  EXPECT_EQ(o.reserved_sms, 16);
  EXPECT_DOUBLE_EQ(o.safety_margin_us, 7.5);
  EXPECT_DOUBLE_EQ(o.safety_margin_fraction, 0.25);
  EXPECT_EQ(o.arena_bytes, size_t{64} << 20);
  EXPECT_DOUBLE_EQ(o.prediction_quantile, 0.5);
  EXPECT_DOUBLE_EQ(o.gated_prediction_quantile, 0.75);
  EXPECT_EQ(o.min_samples, 5);
  EXPECT_EQ(o.policy, pfPolicyShortestRemaining);
  EXPECT_EQ(o.log_level, pfLogInfo);
  EXPECT_TRUE(o.enable_cupti);
  EXPECT_EQ(o.sim_seed, 42u);
  EXPECT_EQ(o.sim_sm_count, 108);
  EXPECT_EQ(o.sim_memory_bytes, size_t{80} << 30);
}

TEST_F(ConfigTest, ConfigFieldWinsOverEnvironment) {
  setenv("PIPEFILL_MIN_SAMPLES", "5", 1);
  setenv("PIPEFILL_POLICY", "fair", 1);
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.min_samples = 9;
  c.policy = pfPolicyPriority;
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(&c, &o), pfSuccess);
  EXPECT_EQ(o.min_samples, 9);
  EXPECT_EQ(o.policy, pfPolicyPriority);
}

TEST_F(ConfigTest, ExportRoundTrips) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.stage_count = 8;
  c.stage_id = 7;
  c.arena_bytes = 12345;
  c.prediction_quantile = 0.3;
  c.gated_prediction_quantile = 0.7;
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(&c, &o), pfSuccess);
  pfConfig_t out = PF_CONFIG_INITIALIZER;
  ASSERT_EQ(export_config(o, &out), pfSuccess);
  EXPECT_EQ(out.size, sizeof(pfConfig_t));
  EXPECT_EQ(out.version, PF_CONFIG_VERSION);
  EXPECT_EQ(out.stage_count, 8);
  EXPECT_EQ(out.stage_id, 7);
  EXPECT_EQ(out.arena_bytes, 12345u);
  EXPECT_DOUBLE_EQ(out.prediction_quantile, 0.3);
  EXPECT_DOUBLE_EQ(out.gated_prediction_quantile, 0.7);
  RuntimeOptions again;
  ASSERT_EQ(resolve_config(&out, &again), pfSuccess);
  EXPECT_EQ(again.stage_id, 7);
  EXPECT_DOUBLE_EQ(again.gated_prediction_quantile, 0.7);
}

struct BadField {
  const char* name;
  void (*apply)(pfConfig_t*);
  const char* message_part;
};

class BadConfigTest : public ConfigTest, public ::testing::WithParamInterface<BadField> {};

TEST_P(BadConfigTest, RejectedWithFieldAndValue) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  GetParam().apply(&c);
  RuntimeOptions o;
  clear_last_error();
  EXPECT_EQ(resolve_config(&c, &o), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find(GetParam().message_part), std::string::npos)
      << last_error_message();
}

INSTANTIATE_TEST_SUITE_P(
    EveryBadValue, BadConfigTest,
    ::testing::Values(
        BadField{"size", [](pfConfig_t* c) { c->size = 8; }, "config.size = 8"},
        BadField{"version", [](pfConfig_t* c) { c->version = 99; }, "config.version = 99"},
        BadField{"backend", [](pfConfig_t* c) { c->backend = 7; }, "config.backend = 7"},
        BadField{"device", [](pfConfig_t* c) { c->device = -3; }, "config.device = -3"},
        BadField{"stage_count", [](pfConfig_t* c) { c->stage_count = 0; },
                 "config.stage_count = 0"},
        BadField{"stage_id_high",
                 [](pfConfig_t* c) {
                   c->stage_count = 4;
                   c->stage_id = 4;
                 },
                 "config.stage_id = 4 is outside [0, stage_count=4)"},
        BadField{"stage_id_negative", [](pfConfig_t* c) { c->stage_id = -2; },
                 "config.stage_id = -2"},
        BadField{"reserved", [](pfConfig_t* c) { c->reserved_sms = -5; },
                 "config.reserved_sms = -5"},
        BadField{"reserved_all_sms",
                 [](pfConfig_t* c) {
                   c->backend = pfBackendSim;
                   c->sim_sm_count = 16;
                   c->reserved_sms = 16;
                 },
                 "reserved_sms = 16 leaves no SM"},
        BadField{"margin", [](pfConfig_t* c) { c->safety_margin_us = -5.0; },
                 "config.safety_margin_us = -5"},
        BadField{"fraction", [](pfConfig_t* c) { c->safety_margin_fraction = 1.0; },
                 "config.safety_margin_fraction = 1"},
        BadField{"quantile_zero", [](pfConfig_t* c) { c->prediction_quantile = 0.0; },
                 "config.prediction_quantile = 0"},
        BadField{"quantile_high", [](pfConfig_t* c) { c->prediction_quantile = 1.5; },
                 "config.prediction_quantile = 1.5"},
        BadField{"gated_quantile_zero", [](pfConfig_t* c) { c->gated_prediction_quantile = 0.0; },
                 "config.gated_prediction_quantile = 0 is outside (0, 1]"},
        BadField{"gated_quantile_high",
                 [](pfConfig_t* c) { c->gated_prediction_quantile = 1.25; },
                 "config.gated_prediction_quantile = 1.25 is outside (0, 1]"},
        BadField{"gated_quantile_negative",
                 [](pfConfig_t* c) { c->gated_prediction_quantile = -1.0; },
                 "config.gated_prediction_quantile = -1"},
        BadField{"gated_quantile_nan",
                 [](pfConfig_t* c) { c->gated_prediction_quantile = std::nan(""); },
                 "config.gated_prediction_quantile = nan is not a finite number"},
        BadField{"min_samples", [](pfConfig_t* c) { c->min_samples = -4; },
                 "config.min_samples = -4"},
        BadField{"policy", [](pfConfig_t* c) { c->policy = 9; }, "config.policy = 9"},
        BadField{"log_level", [](pfConfig_t* c) { c->log_level = 6; }, "config.log_level = 6"},
        BadField{"cupti", [](pfConfig_t* c) { c->enable_cupti = 2; }, "config.enable_cupti = 2"},
        BadField{"sim_sms", [](pfConfig_t* c) { c->sim_sm_count = 0; },
                 "config.sim_sm_count = 0"},
        BadField{"sim_memory", [](pfConfig_t* c) { c->sim_memory_bytes = 0; },
                 "config.sim_memory_bytes = 0"}),
    [](const ::testing::TestParamInfo<BadField>& info) { return std::string(info.param.name); });

struct BadEnv {
  const char* var;
  const char* value;
};

class BadEnvTest : public ConfigTest, public ::testing::WithParamInterface<BadEnv> {};

TEST_P(BadEnvTest, RejectedWithVariableAndValue) {
  setenv(GetParam().var, GetParam().value, 1);
  RuntimeOptions o;
  EXPECT_EQ(resolve_config(nullptr, &o), pfErrorInvalidArgument);
  const std::string& m = last_error_message();
  EXPECT_NE(m.find(GetParam().var), std::string::npos) << m;
  EXPECT_NE(m.find(GetParam().value), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(
    EveryBadVariable, BadEnvTest,
    ::testing::Values(BadEnv{"PIPEFILL_BACKEND", "tpu"}, BadEnv{"PIPEFILL_DEVICE", "x1"},
                      BadEnv{"PIPEFILL_DEVICE", "-1"}, BadEnv{"PIPEFILL_STAGE_ID", "1.5"},
                      BadEnv{"PIPEFILL_STAGE_COUNT", "0"}, BadEnv{"PIPEFILL_RESERVED_SMS", "many"},
                      BadEnv{"PIPEFILL_SAFETY_MARGIN_US", "-3"},
                      BadEnv{"PIPEFILL_SAFETY_MARGIN_FRACTION", "abc"},
                      BadEnv{"PIPEFILL_ARENA_BYTES", "12Q"}, BadEnv{"PIPEFILL_QUANTILE", "2"},
                      BadEnv{"PIPEFILL_GATED_QUANTILE", "0"},
                      BadEnv{"PIPEFILL_GATED_QUANTILE", "1.5"},
                      BadEnv{"PIPEFILL_GATED_QUANTILE", "median"},
                      BadEnv{"PIPEFILL_MIN_SAMPLES", "-1"}, BadEnv{"PIPEFILL_POLICY", "lifo"},
                      BadEnv{"PIPEFILL_DEBUG", "loud"}, BadEnv{"PIPEFILL_CUPTI", "3"},
                      BadEnv{"PIPEFILL_SIM_SEED", "-7"}, BadEnv{"PIPEFILL_SIM_SMS", "0"},
                      BadEnv{"PIPEFILL_SIM_MEMORY_BYTES", "lots"},
                      BadEnv{"PIPEFILL_TOO_SHORT_WARN_BUBBLES", "0"},
                      BadEnv{"PIPEFILL_TOO_SHORT_WARN_BUBBLES", "often"},
                      BadEnv{"PIPEFILL_NOTICED_QUANTILE", "0"},
                      BadEnv{"PIPEFILL_NOTICED_QUANTILE", "1.5"},
                      BadEnv{"PIPEFILL_NOTICED_QUANTILE", "max"}));

TEST_F(ConfigTest, NoticedQuantileFromTheEnvironment) {
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(nullptr, &o), pfSuccess);
  EXPECT_EQ(o.noticed_prediction_quantile, 1.0);  // the default: the longest of the window
  setenv("PIPEFILL_NOTICED_QUANTILE", "0.9", 1);
  ASSERT_EQ(resolve_config(nullptr, &o), pfSuccess);
  EXPECT_EQ(o.noticed_prediction_quantile, 0.9);
}

TEST_F(ConfigTest, TooShortWarningStreakFromTheEnvironment) {
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(nullptr, &o), pfSuccess);
  EXPECT_EQ(o.too_short_warn_bubbles, 32);
  setenv("PIPEFILL_TOO_SHORT_WARN_BUBBLES", "5", 1);
  ASSERT_EQ(resolve_config(nullptr, &o), pfSuccess) << last_error_message();
  EXPECT_EQ(o.too_short_warn_bubbles, 5);
}

// The 0.1.0 header (config version 1) marked unset fields with -1 / -1.0; such a config still
// resolves to the defaults.
TEST_F(ConfigTest, VersionOneSentinelsStillMeanUnset) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.version = 1;
  c.backend = c.device = c.stage_id = c.stage_count = c.reserved_sms = -1;
  c.min_samples = c.policy = c.log_level = c.enable_cupti = c.sim_sm_count = -1;
  c.safety_margin_us = c.safety_margin_fraction = c.prediction_quantile = -1.0;
  RuntimeOptions o, defaults;
  ASSERT_EQ(resolve_config(&c, &o), pfSuccess) << last_error_message();
  ASSERT_EQ(resolve_config(nullptr, &defaults), pfSuccess);
  EXPECT_EQ(o.backend, defaults.backend);
  EXPECT_EQ(o.device, 0);
  EXPECT_EQ(o.stage_count, 1);
  EXPECT_EQ(o.reserved_sms, -1);
  EXPECT_DOUBLE_EQ(o.safety_margin_us, 20.0);
  EXPECT_DOUBLE_EQ(o.safety_margin_fraction, 0.05);
  EXPECT_DOUBLE_EQ(o.prediction_quantile, 0.1);
  EXPECT_EQ(o.min_samples, 2);
  EXPECT_EQ(o.sim_sm_count, 132);
}

// In the current version -1 is an ordinary value: a negative margin is an error, not "default".
TEST_F(ConfigTest, MinusOneIsNoLongerUnset) {
  struct Case {
    void (*apply)(pfConfig_t*);
    const char* message_part;
  };
  const Case cases[] = {
      {[](pfConfig_t* c) { c->safety_margin_us = -1.0; }, "config.safety_margin_us = -1"},
      {[](pfConfig_t* c) { c->prediction_quantile = -1.0; }, "config.prediction_quantile = -1"},
      {[](pfConfig_t* c) { c->device = -1; }, "config.device = -1"},
      {[](pfConfig_t* c) { c->reserved_sms = -1; }, "config.reserved_sms = -1"},
      {[](pfConfig_t* c) { c->min_samples = -1; }, "config.min_samples = -1"},
  };
  for (const Case& k : cases) {
    pfConfig_t c = PF_CONFIG_INITIALIZER;
    k.apply(&c);
    RuntimeOptions o;
    EXPECT_EQ(resolve_config(&c, &o), pfErrorInvalidArgument) << k.message_part;
    EXPECT_NE(last_error_message().find(k.message_part), std::string::npos)
        << last_error_message();
  }
}

TEST_F(ConfigTest, SizeAndVersionAreChecked) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.version = PF_CONFIG_VERSION + 1;
  RuntimeOptions o;
  EXPECT_EQ(resolve_config(&c, &o), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("newer than this library"), std::string::npos)
      << last_error_message();
  c = PF_CONFIG_INITIALIZER;
  c.size = sizeof(pfConfig_t) - 8;  // a version-2 layout is never that short
  EXPECT_EQ(resolve_config(&c, &o), pfErrorInvalidArgument);
  // A larger struct (from a newer header with the same version) is read up to our layout.
  struct Bigger {
    pfConfig_t config;
    uint64_t future_field;
  } bigger{};
  bigger.config = pfConfig_t PF_CONFIG_INITIALIZER;
  bigger.config.size = sizeof(Bigger);
  bigger.config.min_samples = 7;
  bigger.future_field = 0xdeadbeef;
  ASSERT_EQ(resolve_config(&bigger.config, &o), pfSuccess) << last_error_message();
  EXPECT_EQ(o.min_samples, 7);
}

TEST_F(ConfigTest, ExportWritesOnlyTheCallersSize) {
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(nullptr, &o), pfSuccess);
  o.min_samples = 5;
  o.sim_sm_count = 64;
  unsigned char buffer[sizeof(pfConfig_t)];
  std::memset(buffer, 0xAB, sizeof(buffer));
  auto* out = reinterpret_cast<pfConfig_t*>(buffer);
  const size_t older = offsetof(pfConfig_t, policy);
  out->size = older;
  out->version = PF_CONFIG_VERSION;
  ASSERT_EQ(export_config(o, out), pfSuccess) << last_error_message();
  EXPECT_EQ(out->size, older);
  EXPECT_EQ(out->min_samples, 5);
  for (size_t i = older; i < sizeof(buffer); ++i) ASSERT_EQ(buffer[i], 0xAB) << i;
  out->size = 0;
  EXPECT_EQ(export_config(o, out), pfErrorInvalidArgument);
}

// A caller built against the version-3 header (no gated_prediction_quantile): its struct is read
// only up to PF_CONFIG_V3_SIZE (the bytes after it are garbage), the field takes its default (or
// PIPEFILL_GATED_QUANTILE), and exporting into that layout says version 3 and writes nothing past it.
TEST_F(ConfigTest, Version3LayoutGetsTheGatedQuantileDefault) {
  static_assert(PF_CONFIG_V3_SIZE == offsetof(pfConfig_t, launch_mode) + sizeof(int));
  static_assert(PF_CONFIG_V3_SIZE > PF_CONFIG_V2_SIZE && PF_CONFIG_V3_SIZE < sizeof(pfConfig_t));
  unsigned char buffer[sizeof(pfConfig_t) + 16];
  std::memset(buffer, 0x7F, sizeof(buffer));  // 0x7F7F... read as a double: 3.4e+306, invalid
  pfConfig_t v3 = PF_CONFIG_INITIALIZER;
  v3.size = PF_CONFIG_V3_SIZE;
  v3.version = 3;
  v3.prediction_quantile = 0.2;
  v3.fill_streams = 2;
  std::memcpy(buffer, &v3, PF_CONFIG_V3_SIZE);
  auto* config = reinterpret_cast<pfConfig_t*>(buffer);
  RuntimeOptions o;
  ASSERT_EQ(resolve_config(config, &o), pfSuccess) << last_error_message();
  EXPECT_DOUBLE_EQ(o.gated_prediction_quantile, 0.5);
  // The bytes past the v3 layout (0x7F7F7F7F, not 0 or 1) are never read: the default holds.
  EXPECT_FALSE(o.fill_optimizer_bubbles);
  EXPECT_DOUBLE_EQ(o.prediction_quantile, 0.2);
  EXPECT_EQ(o.fill_streams, 2);
  setenv("PIPEFILL_GATED_QUANTILE", "0.9", 1);
  ASSERT_EQ(resolve_config(config, &o), pfSuccess) << last_error_message();
  EXPECT_DOUBLE_EQ(o.gated_prediction_quantile, 0.9);
  // Version 4 with the version-3 size is a caller that lies about its layout: refused.
  config->version = 4;
  EXPECT_EQ(resolve_config(config, &o), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("version 4"), std::string::npos) << last_error_message();

  std::memset(buffer, 0xAB, sizeof(buffer));
  config->size = PF_CONFIG_V3_SIZE;
  o.gated_prediction_quantile = 0.6;
  o.fill_streams = 3;
  ASSERT_EQ(export_config(o, config), pfSuccess) << last_error_message();
  EXPECT_EQ(config->size, PF_CONFIG_V3_SIZE);
  EXPECT_EQ(config->version, 3);
  EXPECT_EQ(config->fill_streams, 3);
  for (size_t i = PF_CONFIG_V3_SIZE; i < sizeof(buffer); ++i) ASSERT_EQ(buffer[i], 0xAB) << i;
  // The full layout gets it, and version 4.
  pfConfig_t full = PF_CONFIG_INITIALIZER;
  ASSERT_EQ(export_config(o, &full), pfSuccess);
  EXPECT_EQ(full.version, 4);
  EXPECT_DOUBLE_EQ(full.gated_prediction_quantile, 0.6);
  EXPECT_EQ(full.fill_optimizer_bubbles, 0);
  o.fill_optimizer_bubbles = true;
  ASSERT_EQ(export_config(o, &full), pfSuccess);
  EXPECT_EQ(full.fill_optimizer_bubbles, 1);
}

// Unset arena_bytes: CUDA min(2 GiB, free / 8); the other devices min(1 GiB, free).
TEST(DefaultArena, IsAnEighthOfFreeMemoryUpToTwoGiB) {
  constexpr size_t GiB = size_t{1} << 30;
  EXPECT_EQ(core::default_arena_bytes(pfBackendCuda, 120 * GiB, 141 * GiB), 2 * GiB);
  EXPECT_EQ(core::default_arena_bytes(pfBackendCuda, 16 * GiB, 141 * GiB), 2 * GiB);
  EXPECT_EQ(core::default_arena_bytes(pfBackendCuda, 8 * GiB, 80 * GiB), 1 * GiB);
  EXPECT_EQ(core::default_arena_bytes(pfBackendCuda, 800, 80 * GiB), 100u);
  EXPECT_EQ(core::default_arena_bytes(pfBackendCuda, 0, 80 * GiB), 0u);
  EXPECT_EQ(core::default_arena_bytes(pfBackendSim, 141 * GiB, 141 * GiB), 1 * GiB);
  EXPECT_EQ(core::default_arena_bytes(pfBackendSim, GiB / 2, 141 * GiB), GiB / 2);
  EXPECT_EQ(core::default_arena_bytes(pfBackendHost, 64 * GiB, 128 * GiB), 1 * GiB);
}

TEST(ParseSize, UnitsAndErrors) {
  size_t v = 0;
  EXPECT_TRUE(parse_size("512", &v));
  EXPECT_EQ(v, 512u);
  EXPECT_TRUE(parse_size("64K", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(parse_size("2m", &v));
  EXPECT_EQ(v, size_t{2} << 20);
  EXPECT_TRUE(parse_size("1.5G", &v));
  EXPECT_EQ(v, size_t{3} << 29);
  EXPECT_TRUE(parse_size("4KiB", &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_FALSE(parse_size("", &v));
  EXPECT_FALSE(parse_size("1.5", &v));
  EXPECT_FALSE(parse_size("-1K", &v));
  EXPECT_FALSE(parse_size("10X", &v));
  EXPECT_FALSE(parse_size("10KX", &v));
  EXPECT_FALSE(parse_size(nullptr, &v));
}

}  // namespace
}  // namespace pipefill
