// Every misuse returns the documented code and a message naming the problem, and a rejected
// call never changes the training job's stream (compared on the simulator's activity log).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/activity.hpp"
#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

void expect_error(pfResult_t got, pfResult_t want, const char* message_part) {
  EXPECT_EQ(got, want) << pfGetErrorString(got) << " / " << pfGetLastErrorMessage();
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find(message_part), std::string::npos)
      << "message '" << message << "' lacks '" << message_part << "'";
}

// Runs 4 bubbles with a fill job; with `misuse`, rejected calls are interleaved everywhere.
std::vector<ActivityRecord> run(bool misuse) {
  ManualStage stage;
  stage.init();
  pfRuntime_t rt = stage.runtime();
  CountingJob job;
  job.items = 100000;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  EXPECT_EQ(pfJobCreate(rt, &desc, &handle), pfSuccess);
  auto other_world = make_world(1, 8);
  void* foreign_stream = nullptr;
  EXPECT_EQ(pfSimStreamCreate(other_world.get(), 0, 0, &foreign_stream), pfSuccess);
  int not_a_stream = 0;

  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int i = 0; i < 4; ++i) {
    double start = 0.0;
    EXPECT_EQ(pfSimNow(stage.world.get(), &start), pfSuccess);
    EXPECT_EQ(pfSimStreamDelay(stage.peer, 100.0), pfSuccess);
    EXPECT_EQ(pfSimEventRecord(stage.ready, stage.peer), pfSuccess);
    if (misuse) {
      expect_error(pfBubbleEnd(rt, stage.main), pfErrorInvalidState, "no bubble is open");
      pfBubbleHint_t bad = hint;
      bad.kind = 42;
      expect_error(pfBubbleBegin(rt, stage.main, &bad), pfErrorInvalidArgument,
                   "hint->kind = 42");
      bad = hint;
      bad.lent_bytes = 4096;
      expect_error(pfBubbleBegin(rt, stage.main, &bad), pfErrorInvalidArgument,
                   "hint->lent_bytes = 4096");
      expect_error(pfBubbleBegin(rt, foreign_stream, &hint), pfErrorInvalidArgument,
                   "not a main-job stream");
      expect_error(pfBubbleBegin(rt, &not_a_stream, &hint), pfErrorInvalidArgument,
                   "not a main-job stream");
      expect_error(pfBubbleBegin(rt, nullptr, &hint), pfErrorInvalidArgument, "stream is NULL");
      expect_error(pfBubbleBegin(nullptr, stage.main, &hint), pfErrorInvalidArgument,
                   "runtime is NULL");
    }
    EXPECT_EQ(pfBubbleBegin(rt, stage.main, &hint), pfSuccess) << pfGetLastErrorMessage();
    if (misuse) {
      expect_error(pfBubbleBegin(rt, stage.main, &hint), pfErrorInvalidState, "nested");
      expect_error(pfBubbleBegin(rt, stage.peer, &hint), pfErrorInvalidState, "still open");
      expect_error(pfIterationEnd(rt), pfErrorInvalidState, "still open");
      expect_error(pfRuntimeDestroy(rt), pfErrorBusy, "'infer'");
    }
    EXPECT_EQ(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms), pfSuccess);
    if (misuse) {
      expect_error(pfBubbleEnd(rt, stage.peer), pfErrorInvalidState, "is not the stream");
      expect_error(pfBubbleEnd(rt, nullptr), pfErrorInvalidArgument, "stream is NULL");
      expect_error(pfBubbleEnd(nullptr, stage.main), pfErrorInvalidArgument, "runtime is NULL");
    }
    EXPECT_EQ(pfBubbleEnd(rt, stage.main), pfSuccess) << pfGetLastErrorMessage();
    if (misuse) {
      expect_error(pfBubbleEnd(rt, stage.main), pfErrorInvalidState, "no bubble is open");
    }
    EXPECT_EQ(pfSimLaunchKernel(stage.main, 50.0, stage.sms), pfSuccess);
    EXPECT_EQ(pfIterationEnd(rt), pfSuccess);
    EXPECT_EQ(pfSimRunUntilIdle(stage.world.get()), pfSuccess);
  }
  EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess);
  pfStats_t stats;
  EXPECT_EQ(pfRuntimeGetStats(rt, &stats), pfSuccess);
  EXPECT_EQ(stats.bubbles, 4u);
  EXPECT_EQ(stats.bubbles_filled, 4u);
  EXPECT_EQ(pfJobDestroy(handle), pfSuccess);
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
  const uint64_t main_id = sim::world_from_handle(stage.world.get())->stream_id(stage.main);
  std::vector<ActivityRecord> main_stream;
  for (const ActivityRecord& a : sim::world_from_handle(stage.world.get())->activities(0)) {
    if (a.stream == main_id) main_stream.push_back(a);
  }
  return main_stream;
}

TEST(Misuse, RejectedCallsNeverChangeTheMainStream) {
  const std::vector<ActivityRecord> clean = run(false);
  const std::vector<ActivityRecord> misused = run(true);
  ASSERT_FALSE(clean.empty());
  ASSERT_EQ(clean.size(), misused.size());
  for (size_t i = 0; i < clean.size(); ++i) {
    EXPECT_EQ(clean[i].kind, misused[i].kind) << i;
    EXPECT_EQ(clean[i].name, misused[i].name) << i;
    EXPECT_DOUBLE_EQ(clean[i].start_us, misused[i].start_us) << i;
    EXPECT_DOUBLE_EQ(clean[i].end_us, misused[i].end_us) << i;
  }
}

TEST(Misuse, NullHandlesAndOutputs) {
  expect_error(pfRuntimeCreate(nullptr, nullptr), pfErrorInvalidArgument, "runtime (output)");
  expect_error(pfRuntimeDestroy(nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfRuntimeGetConfig(nullptr, nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfRuntimeGetBackend(nullptr, nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfRuntimeSynchronize(nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfRuntimeGetStats(nullptr, nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfRuntimeGetAsyncError(nullptr, nullptr), pfErrorInvalidArgument,
               "runtime is NULL");
  expect_error(pfRuntimeGetSimWorld(nullptr, nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfTraceWrite(nullptr, "x"), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfIterationEnd(nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfJobCreate(nullptr, nullptr, nullptr), pfErrorInvalidArgument, "runtime is NULL");
  expect_error(pfJobGetStatus(nullptr, nullptr), pfErrorInvalidArgument, "job is NULL");
  expect_error(pfJobCancel(nullptr), pfErrorInvalidArgument, "job is NULL");
  expect_error(pfJobWait(nullptr, 0.0), pfErrorInvalidArgument, "job is NULL");
  expect_error(pfJobDestroy(nullptr), pfErrorInvalidArgument, "job is NULL");
  expect_error(pfGetVersion(nullptr), pfErrorInvalidArgument, "version is NULL");
  expect_error(pfConfigInit(nullptr), pfErrorInvalidArgument, "config is NULL");
  expect_error(pfStreamCreateHighPriority(nullptr, nullptr), pfErrorInvalidArgument,
               "runtime is NULL");

  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  expect_error(pfRuntimeGetStats(rt, nullptr), pfErrorInvalidArgument, "stats is NULL");
  expect_error(pfRuntimeGetConfig(rt, nullptr), pfErrorInvalidArgument, "config is NULL");
  expect_error(pfTraceWrite(rt, nullptr), pfErrorInvalidArgument, "path is NULL");
  expect_error(pfTraceWrite(rt, "/nonexistent-dir/trace.json"), pfErrorIo,
               "/nonexistent-dir/trace.json");
  expect_error(pfJobCreate(rt, nullptr, nullptr), pfErrorInvalidArgument, "desc is NULL");
  expect_error(pfStreamDestroy(rt, nullptr), pfErrorInvalidArgument, "stream is NULL");
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(Misuse, BadJobDescriptions) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  CountingJob job;
  pfJob_t handle = nullptr;
  pfJobDesc_t d = job.desc();
  d.launch = nullptr;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "launch is NULL");
  d = job.desc();
  d.item_count = 0;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "item_count = 0");
  d = job.desc();
  d.kind = 7;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "kind = 7");
  d = job.desc();
  d.config_count = -1;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "config_count = -1");
  d = job.desc();
  d.config_count = 2;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "configs is NULL");
  d = job.desc();
  d.item_cost_hint_us = 0.0;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "item_cost_hint_us = 0");
  pfJobConfig_t configs[2] = {{"fast", 5.0, 0, 0, 0, 0.0}, {"bad", -1.0, 0, 0, 0, 0.0}};
  d = job.desc();
  d.item_cost_hint_us = 0.0;
  d.configs = configs;
  d.config_count = 2;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "configs[1].item_cost_us = -1");
  configs[1].item_cost_us = 2.0;
  configs[1].parallelism = -3;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "configs[1].parallelism = -3");
  EXPECT_EQ(handle, nullptr);
  // A failing setup refuses the job with pfErrorJobFailed.
  d = job.desc();
  d.setup = [](void*, const pfArenaAllocator_t*, int) { return pfErrorInternal; };
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorJobFailed, "setup returned pfErrorInternal");
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(Misuse, BadRuntimeConfigurations) {
  auto world = make_world(2, 16);
  pfRuntime_t rt = nullptr;
  pfConfig_t c = sim_config(world.get(), 0, 4, 0);
  c.stage_id = 4;
  expect_error(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, "stage_id = 4");
  c = sim_config(world.get(), 0, 1, 16);
  expect_error(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, "16");
  c = sim_config(world.get(), 0, 1, 0);
  c.prediction_quantile = 0.0;
  expect_error(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, "prediction_quantile = 0");
  c = sim_config(world.get(), 0, 1, 0);
  c.safety_margin_us = -3.0;
  expect_error(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, "safety_margin_us = -3");
  c = sim_config(world.get(), 0, 1, 0);
  c.size = 16;
  expect_error(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, "config.size = 16");
  c = sim_config(world.get(), 0, 1, 0);
  c.version = 2;
  expect_error(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, "config.version = 2");
  c = sim_config(world.get(), 5, 1, 0);
  c.stage_id = 0;
  EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument) << pfGetLastErrorMessage();
  c = sim_config(world.get(), 0, 1, 0);
  c.arena_bytes = size_t{1} << 50;
  EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfErrorOutOfMemory) << pfGetLastErrorMessage();
  EXPECT_EQ(rt, nullptr);
  // A valid one resolves and reports what is in force.
  c = sim_config(world.get(), 1, 2, 3);
  c.stage_id = 1;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
  pfConfig_t got;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &got));
  EXPECT_EQ(got.backend, pfBackendSim);
  EXPECT_EQ(got.device, 1);
  EXPECT_EQ(got.reserved_sms, 3);
  EXPECT_EQ(got.arena_bytes, size_t{64} << 20);
  pfBackend_t backend = pfBackendAuto;
  PF_ASSERT_OK(pfRuntimeGetBackend(rt, &backend));
  EXPECT_EQ(backend, pfBackendSim);
  pfSimWorld_t w = nullptr;
  PF_ASSERT_OK(pfRuntimeGetSimWorld(rt, &w));
  EXPECT_EQ(w, world.get());
  void* high = nullptr;
  PF_ASSERT_OK(pfStreamCreateHighPriority(rt, &high));
  PF_ASSERT_OK(pfStreamDestroy(rt, high));
  // The world refuses to go away while the runtime is attached.
  EXPECT_EQ(pfSimWorldDestroy(world.get()), pfErrorBusy);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(Misuse, ErrorStringsAndVersion) {
  for (int r = 0; r < pfResultCount; ++r) {
    const char* s = pfGetErrorString(static_cast<pfResult_t>(r));
    ASSERT_NE(s, nullptr);
    const std::string text = s;
    EXPECT_EQ(text.rfind(r == 0 ? "pfSuccess" : "pfError", 0), 0u) << text;
    EXPECT_GT(text.find(':'), 0u);
  }
  EXPECT_NE(std::string(pfGetErrorString(static_cast<pfResult_t>(99))).find("Unknown"),
            std::string::npos);
  int version = 0;
  PF_ASSERT_OK(pfGetVersion(&version));
  EXPECT_EQ(version, PIPEFILL_VERSION_CODE);
  EXPECT_STREQ(pfGetLastErrorMessage(), "");  // a successful call clears it
  pfConfig_t c;
  PF_ASSERT_OK(pfConfigInit(&c));
  EXPECT_EQ(c.size, sizeof(pfConfig_t));
  EXPECT_EQ(c.backend, PF_UNSET_INT);
  EXPECT_EQ(c.arena_bytes, PF_UNSET_SIZE);
}

TEST(Misuse, JobWaitOnTheSimulatorTimesOut) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  CountingJob job;
  pfJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &handle));
  expect_error(pfJobWait(handle, 1000.0), pfErrorTimeout, "only advances while the world runs");
  PF_ASSERT_OK(pfJobCancel(handle));
  expect_error(pfJobWait(handle, -1.0), pfErrorCancelled, "was cancelled");
  EXPECT_EQ(info_of(handle).status, pfJobCancelled);
  EXPECT_EQ(job.teardowns, 1);
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(job.teardowns, 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
