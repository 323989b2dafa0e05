// C misuse cases of issue 34 (item 9; label capi, its own small binary so that the ASan/UBSan
// tree builds it alone):
// each was accepted (or silently ignored) before and is now refused with a message naming the
// bad value, changing nothing. Also the planner's prediction in pfClassStats_t (item 8) and the
// bound on bubble event pairs (item 3).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "runtime/fixtures.hpp"
#include "support/api_checks.hpp"

namespace pipefill::testing {
namespace {

// Expects `result` == `code` and the message to contain every needle.
void expect_refused(pfResult_t result, pfResult_t code, const std::vector<std::string>& needles) {
  EXPECT_EQ(result, code) << pfGetErrorString(result) << ": " << pfGetLastErrorMessage();
  const std::string message = pfGetLastErrorMessage();
  for (const std::string& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos) << "'" << needle << "' not in: " << message;
  }
}

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)) {
    log::logger().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = log::logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  size_t count(const std::string& needle) const {
    const std::string t = text_.str();
    size_t n = 0;
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) ++n;
    return n;
  }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

pfConfig_t backend_config(pfBackend_t backend) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = backend;
  c.arena_bytes = size_t{1} << 20;
  return c;
}

TEST(ContractMisuse, ADeviceTheBackendDoesNotHaveIsRefused) {
  pfRuntime_t rt = nullptr;
  pfConfig_t c = backend_config(pfBackendSim);
  c.device = 3;
  expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                 {"config.device = 3", "private simulated world has one device"});
  EXPECT_EQ(rt, nullptr);
  c = backend_config(pfBackendHost);
  c.device = 3;
  expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                 {"config.device = 3", "host backend has one device"});
  EXPECT_EQ(rt, nullptr);
  {
    ScopedEnv env("PIPEFILL_DEVICE", "2");
    c = backend_config(pfBackendHost);
    expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, {"PIPEFILL_DEVICE=2"});
    EXPECT_EQ(rt, nullptr);
  }
  // Device 0 stays fine, and is reported back.
  c = backend_config(pfBackendHost);
  c.device = 0;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
  pfConfig_t got = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &got));
  EXPECT_EQ(got.device, 0);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(ContractMisuse, SimulatorFieldsABackendOrWorldIgnoresAreRefused) {
  WorldPtr world = make_world(2, 16);
  pfRuntime_t rt = nullptr;
  // A seed with a shared world: the world was seeded at pfSimWorldCreate.
  pfConfig_t c = sim_config(world.get(), 0, 1, 0);
  c.sim_seed = 7;
  expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                 {"config.sim_seed = 7", "shared simulated world"});
  EXPECT_EQ(rt, nullptr);
  // A world on the host backend.
  c = backend_config(pfBackendHost);
  c.sim_world = world.get();
  expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                 {"config.sim_world", "backend is host"});
  EXPECT_EQ(rt, nullptr);
  // A seed on the host backend.
  c = backend_config(pfBackendHost);
  c.sim_seed = 9;
  expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                 {"config.sim_seed = 9", "host backend"});
  EXPECT_EQ(rt, nullptr);
  // From the environment (set for every rank of a job): a warning, not an error.
  {
    ScopedEnv env("PIPEFILL_SIM_SEED", "5");
    LogCapture log;
    c = sim_config(world.get(), 1, 2, 0);
    PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
    EXPECT_EQ(log.count("PIPEFILL_SIM_SEED=5 is ignored"), 1u) << log.text();
    // What the runtime reports is valid input again: no seed for a shared world.
    pfConfig_t got = PF_CONFIG_INITIALIZER;
    PF_ASSERT_OK(pfRuntimeGetConfig(rt, &got));
    EXPECT_EQ(got.sim_seed, 0u);
    PF_ASSERT_OK(pfRuntimeDestroy(rt));
  }
}

TEST(ContractMisuse, ImplausibleStructSizesAreRefused) {
  pfRuntime_t rt = nullptr;
  pfConfig_t c = backend_config(pfBackendSim);
  c.size = SIZE_MAX;
  expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                 {"config.size = " + std::to_string(SIZE_MAX), "implausible"});
  EXPECT_EQ(rt, nullptr);
  c.size = PF_MAX_STRUCT_SIZE + 1;
  expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, {"implausible"});
  // A later header's larger layout (within the bound) is still accepted.
  c.size = sizeof(pfConfig_t) + 64;
  struct Larger {
    pfConfig_t config;
    char tail[64];
  } larger{};
  larger.config = c;
  PF_ASSERT_OK(pfRuntimeCreate(&larger.config, &rt));

  // Out-structs: nothing is written through a corrupt size.
  pfClassStats_t stats{};
  stats.size = SIZE_MAX;
  expect_refused(pfRuntimeGetClassStats(rt, 0, &stats), pfErrorInvalidArgument,
                 {"stats->size", "implausible"});
  pfMemoryInfo_t memory{};
  memory.size = SIZE_MAX;
  expect_refused(pfRuntimeGetMemoryInfo(rt, &memory), pfErrorInvalidArgument,
                 {"info->size", "implausible"});
  pfStats_t all{};
  expect_refused(pfRuntimeGetStatsV2(rt, &all, SIZE_MAX), pfErrorInvalidArgument,
                 {"stats_size", "implausible"});
  uint64_t counts[PF_SKIP_CAUSE_COUNT] = {};
  expect_refused(pfRuntimeGetSkipCounts(rt, counts, SIZE_MAX / 8), pfErrorInvalidArgument,
                 {"count", "implausible"});
  pfConfig_t init{};
  expect_refused(pfConfigInitSized(&init, SIZE_MAX), pfErrorInvalidArgument,
                 {"config_size", "implausible"});
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(ContractMisuse, EnvironmentMessagesNameTheVariable) {
  pfRuntime_t rt = nullptr;
  {
    // The host device has 8 SMs by default (PIPEFILL_HOST_SMS).
    ScopedEnv env("PIPEFILL_RESERVED_SMS", "8");
    pfConfig_t c = backend_config(pfBackendHost);
    expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                   {"PIPEFILL_RESERVED_SMS=8", "leaves no SM"});
    EXPECT_EQ(rt, nullptr);
  }
  {
    // The host device has 64 MiB by default (PIPEFILL_HOST_MEMORY_BYTES).
    ScopedEnv env("PIPEFILL_ARENA_BYTES", "2G");
    pfConfig_t c = PF_CONFIG_INITIALIZER;
    c.backend = pfBackendHost;
    expect_refused(pfRuntimeCreate(&c, &rt), pfErrorOutOfMemory, {"PIPEFILL_ARENA_BYTES=2G"});
    EXPECT_EQ(rt, nullptr);
  }
  {
    ScopedEnv env("PIPEFILL_BUBBLE_EVENT_PAIRS", "0");
    pfConfig_t c = backend_config(pfBackendSim);
    expect_refused(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument,
                   {"PIPEFILL_BUBBLE_EVENT_PAIRS = 0"});
    EXPECT_EQ(rt, nullptr);
  }
}

// The stream an open bubble began on cannot be destroyed (the simulated backend; the host one is
// tests/host/contract_test.cpp).
TEST(ContractMisuse, TheOpenBubblesStreamCannotBeDestroyed) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  ASSERT_NE(rt, nullptr);
  void* stream = nullptr;
  PF_ASSERT_OK(pfStreamCreateHighPriority(rt, &stream));
  PF_ASSERT_OK(pfBubbleBegin(rt, stream, nullptr));
  expect_refused(pfStreamDestroy(rt, stream), pfErrorInvalidState,
                 {fmt::format("is open on stream {}", stream)});
  PF_ASSERT_OK(pfBubbleEnd(rt, stream));
  PF_ASSERT_OK(pfStreamDestroy(rt, stream));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// Bubbles past the event pairs in flight: one warning with the numbers, counted as bubbles and
// as untimed skips (bubbles_skipped <= bubbles); PIPEFILL_BUBBLE_EVENT_PAIRS raises the bound.
void many_bubbles_without_running(ManualStage& stage, pfRuntime_t rt, int bubbles) {
  for (int i = 0; i < bubbles; ++i) {
    ASSERT_EQ(pfSimStreamDelay(stage.peer, 20.0), pfSuccess);
    ASSERT_EQ(pfSimEventRecord(stage.ready, stage.peer), pfSuccess);
    ASSERT_EQ(pfBubbleBegin(rt, stage.main, nullptr), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms), pfSuccess);
    ASSERT_EQ(pfBubbleEnd(rt, stage.main), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(pfIterationEnd(rt), pfSuccess);
  }
  ASSERT_EQ(pfSimRunUntilIdle(stage.world.get()), pfSuccess) << pfGetLastErrorMessage();
  ASSERT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
}

TEST(ContractMisuse, BubblesPastTheEventPairsAreWarnedOnceAndCounted) {
  for (const char* pairs : {static_cast<const char*>(nullptr), "1024"}) {
    SCOPED_TRACE(pairs == nullptr ? "default bound" : "PIPEFILL_BUBBLE_EVENT_PAIRS=1024");
    std::unique_ptr<ScopedEnv> env;
    if (pairs != nullptr) env = std::make_unique<ScopedEnv>("PIPEFILL_BUBBLE_EVENT_PAIRS", pairs);
    ManualStage stage;
    ASSERT_NO_FATAL_FAILURE(stage.init());
    LogCapture log;
    pfRuntime_t rt = stage.runtime();
    ASSERT_NE(rt, nullptr);
    ASSERT_NO_FATAL_FAILURE(many_bubbles_without_running(stage, rt, 700));
    pfStats_t s{};
    PF_ASSERT_OK(pfRuntimeGetStatsV2(rt, &s, sizeof s));
    uint64_t counts[PF_SKIP_CAUSE_COUNT] = {};
    PF_ASSERT_OK(pfRuntimeGetSkipCounts(rt, counts, PF_SKIP_CAUSE_COUNT));
    EXPECT_EQ(s.bubbles, 700u);
    EXPECT_LE(s.bubbles_skipped, s.bubbles);
    if (pairs == nullptr) {
      EXPECT_EQ(counts[pfSkipUntimed], 700u - 512u);
      EXPECT_EQ(log.count("all 512 bubble event pairs are in flight"), 1u) << log.text();
      EXPECT_EQ(log.count("PIPEFILL_BUBBLE_EVENT_PAIRS"), 1u) << log.text();
    } else {
      EXPECT_EQ(counts[pfSkipUntimed], 0u);
      EXPECT_EQ(log.count("event pairs are in flight"), 0u) << log.text();
    }
    PF_ASSERT_OK(pfRuntimeDestroy(rt));
  }
}

// The planner's prediction is readable (pfClassStats_t's appended fields), and a caller of the
// first layout gets only that layout.
TEST(ContractMisuse, ClassStatsCarryThePlannersPrediction) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  ASSERT_NE(rt, nullptr);
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.label = "recv";
  // Five bubbles of 100, 200, 300, 400, 500 us in one class: the median is 300.
  for (int i = 1; i <= 5; ++i) stage.step(rt, 100.0 * i, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfClassStats_t c{};
  c.size = sizeof c;
  PF_ASSERT_OK(pfRuntimeGetClassStats(rt, 0, &c));
  EXPECT_STREQ(c.key, "recv");
  EXPECT_EQ(c.samples, 5u);
  EXPECT_NEAR(c.p50_us, 300.0, 1e-6);
  EXPECT_NEAR(c.gated_predicted_us, 300.0, 1e-6) << "the default gated quantile is the median";
  EXPECT_NEAR(c.ungated_predicted_us, 100.0, 1e-6) << "the default quantile is 0.1";
  EXPECT_EQ(c.late_backoffs, 0u);
  // The first layout: its bytes only, the appended fields left as the caller had them.
  struct {
    pfClassStats_t stats;
  } old{};
  std::memset(&old, 0xAB, sizeof old);
  old.stats.size = PF_CLASS_STATS_V1_SIZE;
  PF_ASSERT_OK(pfRuntimeGetClassStats(rt, 0, &old.stats));
  EXPECT_EQ(old.stats.size, PF_CLASS_STATS_V1_SIZE);
  EXPECT_STREQ(old.stats.key, "recv");
  uint64_t untouched = 0;
  std::memcpy(&untouched, &old.stats.samples, sizeof untouched);
  EXPECT_EQ(untouched, 0xABABABABABABABABull) << "written past the caller's layout";
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
