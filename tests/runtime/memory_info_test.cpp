// pfRuntimeGetMemoryInfo: the arena's use by jobs and the device's free/total memory measured at
// the call (simulated and host backends), its versioned struct honoured both ways, and its
// refusals (NULL, short size, a bubble open on the calling thread) writing nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;

pfMemoryInfo_t query(pfRuntime_t rt) {
  pfMemoryInfo_t info{};
  info.size = sizeof info;
  EXPECT_EQ(pfRuntimeGetMemoryInfo(rt, &info), pfSuccess) << pfGetLastErrorMessage();
  return info;
}

TEST(MemoryInfo, SimulatedDeviceReportsArenaUseAndTheMainJobsMemory) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.arena_bytes = 64 * kMiB;
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);

  // The default simulated device has 141 GiB; its arena of 64 MiB is taken from it.
  pfMemoryInfo_t before = query(rt);
  EXPECT_EQ(before.size, sizeof(pfMemoryInfo_t));
  EXPECT_EQ(before.arena_bytes, 64 * kMiB);
  EXPECT_EQ(before.arena_used_bytes, 0u);
  EXPECT_EQ(before.arena_largest_free_bytes, 64 * kMiB);
  EXPECT_EQ(before.device_total_bytes, 141 * kGiB);
  EXPECT_EQ(before.device_free_bytes, 141 * kGiB - 64 * kMiB);

  // Measured at the call: the main job taking 100 GiB shows at once.
  ASSERT_EQ(pfSimSetMemoryUsed(stage.world.get(), 0, 100 * kGiB), pfSuccess);
  // A job's resident set is held in the arena while the job lives.
  CountingJob job;
  job.name = "resident";
  job.items = 1000;
  job.resident_bytes = 5 * kMiB;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  pfMemoryInfo_t during = query(rt);
  EXPECT_EQ(during.arena_bytes, 64 * kMiB);
  EXPECT_EQ(during.arena_used_bytes, 5 * kMiB);
  EXPECT_EQ(during.arena_largest_free_bytes, 59 * kMiB);
  EXPECT_EQ(during.device_free_bytes, 41 * kGiB - 64 * kMiB);
  EXPECT_EQ(during.device_total_bytes, 141 * kGiB);

  PF_ASSERT_OK(pfJobDestroy(handle));
  pfMemoryInfo_t after = query(rt);
  EXPECT_EQ(after.arena_used_bytes, 0u);
  EXPECT_EQ(after.arena_largest_free_bytes, 64 * kMiB);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(MemoryInfo, HostDeviceReportsItsMemoryAndTheArena) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendHost;
  c.arena_bytes = 2 * kMiB;
  c.log_level = pfLogWarn;
  pfRuntime_t rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
  pfMemoryInfo_t info = query(rt);
  // The host device reports 64 MiB by default (PIPEFILL_HOST_MEMORY_BYTES), less its arena.
  EXPECT_EQ(info.device_total_bytes, 64 * kMiB);
  EXPECT_EQ(info.device_free_bytes, 62 * kMiB);
  EXPECT_EQ(info.arena_bytes, 2 * kMiB);
  EXPECT_EQ(info.arena_used_bytes, 0u);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(MemoryInfo, ALargerStructGetsZeroesAfterThisLayout) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  struct Bigger {
    pfMemoryInfo_t info;
    unsigned char later_fields[24];
  } bigger;
  std::memset(&bigger, 0xAB, sizeof bigger);
  bigger.info.size = sizeof bigger;
  PF_ASSERT_OK(pfRuntimeGetMemoryInfo(rt, &bigger.info));
  EXPECT_EQ(bigger.info.size, sizeof(pfMemoryInfo_t));
  EXPECT_EQ(bigger.info.arena_bytes, 64 * kMiB);
  for (unsigned char byte : bigger.later_fields) EXPECT_EQ(byte, 0u);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(MemoryInfo, RefusalsWriteNothingAndNameTheProblem) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();

  EXPECT_EQ(pfRuntimeGetMemoryInfo(rt, nullptr), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("info is NULL"), std::string::npos);

  pfMemoryInfo_t shorter;
  std::memset(&shorter, 0xCD, sizeof shorter);
  shorter.size = sizeof(pfMemoryInfo_t) - 8;
  EXPECT_EQ(pfRuntimeGetMemoryInfo(rt, &shorter), pfErrorInvalidArgument);
  const std::string size_message = pfGetLastErrorMessage();
  EXPECT_NE(size_message.find("info->size = " + std::to_string(sizeof(pfMemoryInfo_t) - 8)),
            std::string::npos) << size_message;
  EXPECT_EQ(shorter.arena_bytes, ~size_t{0} / 0xFF * 0xCD);  // untouched

  // A bubble open on this thread: the device query may block, so it is refused.
  ASSERT_EQ(pfBubbleBegin(rt, stage.main, nullptr), pfSuccess) << pfGetLastErrorMessage();
  pfMemoryInfo_t inside;
  std::memset(&inside, 0xCD, sizeof inside);
  inside.size = sizeof inside;
  EXPECT_EQ(pfRuntimeGetMemoryInfo(rt, &inside), pfErrorInvalidState);
  const std::string bubble_message = pfGetLastErrorMessage();
  EXPECT_NE(bubble_message.find("pfRuntimeGetMemoryInfo"), std::string::npos) << bubble_message;
  EXPECT_NE(bubble_message.find("bubble"), std::string::npos) << bubble_message;
  EXPECT_EQ(inside.device_total_bytes, ~size_t{0} / 0xFF * 0xCD);
  ASSERT_EQ(pfBubbleEnd(rt, stage.main), pfSuccess);
  EXPECT_EQ(query(rt).arena_bytes, 64 * kMiB);  // fine again after the bubble

  EXPECT_EQ(pfRuntimeGetMemoryInfo(nullptr, &inside), pfErrorInvalidArgument);
  ASSERT_EQ(pfSimRunUntilIdle(stage.world.get()), pfSuccess);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// The service's agent queries from its own thread while the trainer's thread runs bubbles and
// creates and destroys jobs: every query succeeds and sees either no job or the whole job.
TEST(MemoryInfo, QueriesFromAnotherThreadWhileTheStageRuns) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  std::atomic<bool> done{false};
  std::atomic<int> queries{0}, bad{0};
  std::thread agent([&] {
    while (!done.load()) {
      pfMemoryInfo_t info{};
      info.size = sizeof info;
      if (pfRuntimeGetMemoryInfo(rt, &info) != pfSuccess ||
          (info.arena_used_bytes != 0 && info.arena_used_bytes != 2 * kMiB) ||
          info.arena_used_bytes + info.arena_largest_free_bytes != 64 * kMiB) {
        bad.fetch_add(1);
      }
      queries.fetch_add(1);
    }
  });
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int round = 0; round < 20 || queries.load() < 100; ++round) {
    CountingJob job;
    job.items = 50;
    job.resident_bytes = 2 * kMiB;
    pfJobDesc_t desc = job.desc();
    pfJob_t handle = nullptr;
    PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
    stage.step(rt, 100.0, &hint);
    PF_ASSERT_OK(pfJobDestroy(handle));
    if (round > 10000) break;  // the query thread never ran: the checks below say so
  }
  done.store(true);
  agent.join();
  EXPECT_GE(queries.load(), 100);
  EXPECT_EQ(bad.load(), 0);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
