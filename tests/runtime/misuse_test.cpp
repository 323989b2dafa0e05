// Every misuse returns the documented code and a message naming the problem, and a rejected
// call never changes the training job's stream (compared on the simulator's activity log).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <cmath>
#include <cstdint>
#include <limits>

#include "analysis/activity.hpp"
#include "test_device.hpp"

namespace pipefill::testing {
namespace {

struct RunRecord {
  std::vector<ActivityRecord> main_activities;  // kernels/waits the simulator executed
  size_t main_operations = 0;  // event records and word writes the runtime enqueued on main
  size_t fill_operations = 0;  // ... and on its fill stream
};

// Runs 4 bubbles with a fill job; with `misuse`, rejected calls are interleaved everywhere.
RunRecord run(bool misuse) {
  ManualStage stage;
  stage.init();
  TestDevice* device = nullptr;
  pfRuntime_t rt = make_stage_test_runtime(stage, false, &device);
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
      expect_error(pfBubbleBegin(rt, nullptr, &hint), pfErrorInvalidArgument,
                   "stream is NULL (the sim backend has no default stream");
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
      expect_error(pfBubbleEnd(rt, nullptr), pfErrorInvalidArgument,
                   "stream is NULL (the sim backend has no default stream");
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
  RunRecord record;
  record.main_operations = device->operations_on(stage.main);
  record.fill_operations = device->operations_on_fill_streams();
  EXPECT_EQ(pfJobDestroy(handle), pfSuccess);
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
  const uint64_t main_id = sim::world_from_handle(stage.world.get())->stream_id(stage.main);
  for (const ActivityRecord& a : sim::world_from_handle(stage.world.get())->activities(0)) {
    if (a.stream == main_id) record.main_activities.push_back(a);
  }
  return record;
}

TEST(Misuse, RejectedCallsNeverChangeTheMainStream) {
  const RunRecord clean_run = run(false);
  const RunRecord misused_run = run(true);
  // 4 bubbles x (begin record + gate write + end record) from the runtime on the main stream.
  EXPECT_EQ(clean_run.main_operations, 4u * 3u);
  EXPECT_EQ(misused_run.main_operations, clean_run.main_operations);
  EXPECT_EQ(misused_run.fill_operations, clean_run.fill_operations);
  EXPECT_GT(clean_run.fill_operations, 0u);
  const std::vector<ActivityRecord>& clean = clean_run.main_activities;
  const std::vector<ActivityRecord>& misused = misused_run.main_activities;
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
  // A bad per-config cost is an error even when the description's hint could stand in for it
  // (only 0 means "use item_cost_hint_us").
  d.item_cost_hint_us = 5.0;
  configs[1].parallelism = 0;
  configs[1].item_cost_us = std::nan("");
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument,
               "configs[1].item_cost_us = nan");
  configs[1].item_cost_us = -5.0;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument,
               "configs[1].item_cost_us = -5");
  configs[1].item_cost_us = std::numeric_limits<double>::infinity();
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument,
               "configs[1].item_cost_us = inf");
  configs[1].item_cost_us = 0.0;  // takes the hint
  PF_ASSERT_OK(pfJobCreate(rt, &d, &handle));
  PF_ASSERT_OK(pfJobDestroy(handle));
  handle = nullptr;
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
  c.version = PF_CONFIG_VERSION + 1;
  expect_error(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument, "newer than this library");
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
  pfConfig_t got = PF_CONFIG_INITIALIZER;
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
    const size_t colon = text.find(':');
    ASSERT_NE(colon, std::string::npos) << text;
    EXPECT_GT(text.size(), colon + 2) << "a description follows the name: " << text;
  }
  EXPECT_NE(std::string(pfGetErrorString(static_cast<pfResult_t>(99))).find("Unknown"),
            std::string::npos);
  int version = 0;
  expect_error(pfGetVersion(nullptr), pfErrorInvalidArgument, "version is NULL");
  PF_ASSERT_OK(pfGetVersion(&version));
  EXPECT_EQ(version, PIPEFILL_VERSION_CODE);
  EXPECT_STREQ(pfGetLastErrorMessage(), "");  // a successful call clears it
  pfConfig_t c;
  PF_ASSERT_OK(pfConfigInit(&c));
  EXPECT_EQ(c.size, sizeof(pfConfig_t));
  EXPECT_EQ(c.backend, PF_UNSET_INT);
  EXPECT_EQ(c.arena_bytes, PF_UNSET_SIZE);
}

// The setup allocator's bounds check cannot be wrapped around: after allocate(256), a request of
// SIZE_MAX (or an alignment beyond the share) fails and later allocations never overlap.
TEST(Misuse, SetupAllocatorNeverWraps) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  struct Setup {
    void* first = nullptr;
    void* huge = nullptr;
    void* third = nullptr;
    pfResult_t huge_result = pfSuccess, aligned_result = pfSuccess, third_result = pfErrorInternal;
  } s;
  pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
  desc.name = "wrap";
  desc.item_count = 1;
  desc.item_cost_hint_us = 1.0;
  desc.resident_bytes = 4096;
  desc.user = &s;
  desc.launch = [](void*, const pfSliceDesc_t*, void*) { return pfSuccess; };
  desc.setup = [](void* user, const pfArenaAllocator_t* a, int) -> pfResult_t {
    auto* st = static_cast<Setup*>(user);
    if (a->allocate(a->context, 256, 256, &st->first) != pfSuccess) return pfErrorInternal;
    st->huge_result = a->allocate(a->context, SIZE_MAX, 256, &st->huge);
    void* aligned = nullptr;
    st->aligned_result = a->allocate(a->context, 16, size_t{1} << 63, &aligned);
    st->third_result = a->allocate(a->context, 256, 256, &st->third);
    return pfSuccess;
  };
  pfJob_t job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &job));
  EXPECT_EQ(s.huge_result, pfErrorOutOfMemory);
  EXPECT_EQ(s.huge, nullptr);
  EXPECT_EQ(s.aligned_result, pfErrorOutOfMemory);
  ASSERT_EQ(s.third_result, pfSuccess);
  const auto first = reinterpret_cast<uintptr_t>(s.first);
  const auto third = reinterpret_cast<uintptr_t>(s.third);
  EXPECT_GE(third, first + 256) << "the third block overlaps the first";
  PF_ASSERT_OK(pfJobDestroy(job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// Destroying the stream of an open bubble: pfStreamDestroy refuses it; a stream destroyed
// behind the runtime's back (pfSimStreamDestroy, cudaStreamDestroy) does not wedge it - the end
// reports the problem and closes the bubble, and later bubbles and the destroy work.
TEST(Misuse, DestroyingTheStreamOfAnOpenBubble) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  void* doomed = nullptr;
  PF_ASSERT_OK(pfStreamCreateHighPriority(rt, &doomed));
  PF_ASSERT_OK(pfBubbleBegin(rt, doomed, nullptr));
  expect_error(pfStreamDestroy(rt, doomed), pfErrorInvalidState, "bubble 1 is open");
  PF_ASSERT_OK(pfBubbleEnd(rt, doomed));
  PF_ASSERT_OK(pfStreamDestroy(rt, doomed));

  PF_ASSERT_OK(pfStreamCreateHighPriority(rt, &doomed));
  PF_ASSERT_OK(pfBubbleBegin(rt, doomed, nullptr));
  PF_ASSERT_OK(pfSimStreamDestroy(doomed));
  expect_error(pfBubbleEnd(rt, doomed), pfErrorInvalidArgument, "abandoned");
  // Not wedged: the next bubble on a live stream works, and so does the destroy.
  stage.step(rt, 100.0);
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, nullptr));
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t s;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.bubbles, 4u) << "the abandoned bubble counts, untimed (issue 34)";
  EXPECT_EQ(s.bubbles_skipped, s.bubbles - s.bubbles_filled);
  uint64_t counts[PF_SKIP_CAUSE_COUNT] = {};
  PF_ASSERT_OK(pfRuntimeGetSkipCounts(rt, counts, PF_SKIP_CAUSE_COUNT));
  EXPECT_EQ(counts[pfSkipUntimed], 1u) << "the abandoned bubble is not timed";
  // Destroy with a bubble open on a stream that died meanwhile.
  PF_ASSERT_OK(pfStreamCreateHighPriority(rt, &doomed));
  PF_ASSERT_OK(pfBubbleBegin(rt, doomed, nullptr));
  PF_ASSERT_OK(pfSimStreamDestroy(doomed));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// A stream destroyed with its bubble open whose handle still looks valid (on CUDA a cudaStream_t
// handle is reused by the next stream created; a gate write on it reports success): the device's
// stream identity (cuStreamGetId) differs at the end, so pfBubbleEnd reports the stream by name
// with pfErrorInvalidArgument, the bubble is abandoned (not timed), and the runtime goes on.
TEST(Misuse, AStreamReplacedWhileItsBubbleWasOpenIsReportedAtTheEnd) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  TestDevice* device = nullptr;
  pfRuntime_t rt = make_stage_test_runtime(stage, false, &device);
  ASSERT_NE(rt, nullptr);
  stage.step(rt, 100.0);
  {
    std::lock_guard lock(device->identity_mutex);
    device->stream_identity[stage.main] = 41;
  }
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, nullptr));
  {
    std::lock_guard lock(device->identity_mutex);
    device->stream_identity[stage.main] = 42;  // destroyed, and the handle names a new stream
  }
  const size_t ops = device->operations_on(stage.main);
  const std::string name = fmt::format("{}", stage.main);
  expect_error(pfBubbleEnd(rt, stage.main), pfErrorInvalidArgument,
               "pfBubbleEnd: stream " + name + " is no longer a live main-job stream");
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("the bubble is abandoned"), std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_EQ(device->operations_on(stage.main), ops) << "no gate write or end event on the dead stream";
  expect_error(pfBubbleEnd(rt, stage.main), pfErrorInvalidState, "no bubble is open");
  // The new stream behind the handle works (its identity is taken at its own begin).
  stage.step(rt, 100.0);
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t s;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.bubbles, 3u) << "the abandoned bubble counts, untimed (issue 34)";
  EXPECT_NEAR(s.bubble_time_us, 2 * 100.0, 1e-6) << "the abandoned bubble is not timed";
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// A main stream the device cannot serve (CUDA: another device's context, or a context whose
// streams fail the event self-test) is refused by pfBubbleBegin before anything is enqueued.
TEST(Misuse, AMainStreamTheDeviceRefusesEnqueuesNothing) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  TestDevice* device = nullptr;
  pfRuntime_t rt = make_stage_test_runtime(stage, false, &device);
  ASSERT_NE(rt, nullptr);
  {
    std::lock_guard lock(device->identity_mutex);
    device->refused_main_streams.insert(stage.main);
  }
  const size_t ops = device->operations_on(stage.main);
  expect_error(pfBubbleBegin(rt, stage.main, nullptr), pfErrorNotSupported, "cannot serve main stream");
  EXPECT_EQ(device->operations_on(stage.main), ops);
  expect_error(pfBubbleEnd(rt, stage.main), pfErrorInvalidState, "no bubble is open");
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.peer, nullptr));  // another stream is served
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.peer));
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// A main stream being captured into a CUDA graph: bubble instructions are refused with
// pfErrorNotSupported and enqueue nothing (a captured gate write would replay with a stale
// bubble id, see docs/api.md "CUDA graphs").
TEST(Misuse, BubbleInstructionsDuringGraphCapture) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  TestDevice* device = nullptr;
  pfRuntime_t rt = make_stage_test_runtime(stage, false, &device);
  ASSERT_NE(rt, nullptr);
  {
    std::lock_guard lock(device->capture_mutex);
    device->capturing.insert(stage.main);
  }
  size_t ops = device->operations_on(stage.main);
  expect_error(pfBubbleBegin(rt, stage.main, nullptr), pfErrorNotSupported, "captured");
  EXPECT_EQ(device->operations_on(stage.main), ops);
  {
    std::lock_guard lock(device->capture_mutex);
    device->capturing.clear();
  }
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, nullptr));
  {
    std::lock_guard lock(device->capture_mutex);
    device->capturing.insert(stage.main);
  }
  ops = device->operations_on(stage.main);
  expect_error(pfBubbleEnd(rt, stage.main), pfErrorNotSupported, "captured");
  EXPECT_EQ(device->operations_on(stage.main), ops);
  {
    std::lock_guard lock(device->capture_mutex);
    device->capturing.clear();
  }
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));  // the bubble stayed open: end it now
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(Misuse, JobWaitOnTheSimulatorTimesOut) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  CountingJob job;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
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
