// The C++ layer's lifetime rule (include/pipefill/pipefill.hpp): jobs, streams and capture scopes
// keep their runtime alive, a runtime keeps its simulated world alive, move-assignment releases
// the old runtime properly, destructor failures are kept with their message and can be cleared.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "pipefill/pipefill.hpp"
#include "runtime/fixtures.hpp"

namespace pipefill::testing {
namespace {

pfConfig_t quiet_sim_config() {
  pfConfig_t config = default_config();
  config.backend = pfBackendSim;
  config.sim_sm_count = 16;
  config.arena_bytes = size_t{1} << 20;
  config.log_level = pfLogError;
  return config;
}

// Whether `rt` is a live C runtime (the C API refuses dead handles: "not a live runtime").
bool runtime_alive(pfRuntime_t rt) {
  pfBackend_t backend = pfBackendAuto;
  return pfRuntimeGetBackend(rt, &backend) == pfSuccess;
}

class CxxLifetimes : public ::testing::Test {
 protected:
  void SetUp() override { clear_destructor_error(); }
  void TearDown() override {
    EXPECT_EQ(last_destructor_error(), pfSuccess) << last_destructor_error_message();
  }
};

TEST_F(CxxLifetimes, RuntimeDestroyedBeforeItsJobLivesUntilTheJobGoes) {
  CountingJob counting;
  counting.items = 100;
  pfRuntime_t raw = nullptr;
  std::unique_ptr<Job> job;
  {
    Runtime rt(quiet_sim_config());
    raw = rt.get();
    job = std::make_unique<Job>(rt.create_job(counting.desc()));
  }  // the Runtime object goes first: no pfErrorBusy, nothing leaked
  EXPECT_EQ(last_destructor_error(), pfSuccess) << last_destructor_error_message();
  EXPECT_TRUE(runtime_alive(raw));
  EXPECT_EQ(job->runtime(), raw);
  EXPECT_EQ(job->status(), pfJobPending);
  job->cancel();
  job.reset();  // the last owner: destroys the job, then the runtime
  EXPECT_FALSE(runtime_alive(raw));
  EXPECT_EQ(counting.teardowns, 1);
}

TEST_F(CxxLifetimes, MoveAssignmentReleasesTheOldRuntimeAndLeavesTheSourceEmpty) {
  Runtime a(quiet_sim_config());
  Runtime b(quiet_sim_config());
  const pfRuntime_t raw_a = a.get();
  const pfRuntime_t raw_b = b.get();
  a = std::move(b);
  EXPECT_FALSE(runtime_alive(raw_a));  // destroyed, not leaked
  EXPECT_EQ(a.get(), raw_b);
  EXPECT_EQ(b.get(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  try {
    b.iteration_end();  // NOLINT(bugprone-use-after-move)
    FAIL() << "a moved-from Runtime must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), pfErrorInvalidArgument);
  }
  a = std::move(a);  // self-move: still the same runtime
  EXPECT_TRUE(runtime_alive(raw_b));
}

TEST_F(CxxLifetimes, MoveAssignmentOverARuntimeWithALiveJobKeepsItForTheJob) {
  CountingJob counting;
  Runtime rt(quiet_sim_config());
  const pfRuntime_t old_raw = rt.get();
  Job job = rt.create_job(counting.desc());
  rt = Runtime(quiet_sim_config());
  EXPECT_NE(rt.get(), old_raw);
  EXPECT_TRUE(runtime_alive(old_raw));  // the job still holds it
  EXPECT_EQ(job.runtime(), old_raw);
  Job other = rt.create_job(counting.desc());
  job = std::move(other);  // destroys the first job and, with it, the old runtime
  EXPECT_FALSE(runtime_alive(old_raw));
  EXPECT_EQ(job.runtime(), rt.get());
  EXPECT_EQ(counting.teardowns, 1);
}

TEST_F(CxxLifetimes, ARuntimeKeepsItsSimWorldAlive) {
  std::unique_ptr<Runtime> rt;
  pfSimWorld_t raw_world = nullptr;
  {
    SimWorld world(1);
    raw_world = world.get();
    pfConfig_t config = quiet_sim_config();
    config.sim_sm_count = PF_UNSET_INT;  // the world's device decides (a private world's field)
    rt = std::make_unique<Runtime>(config, world);
  }  // the SimWorld object goes first; the runtime still runs in the world
  EXPECT_EQ(rt->sim_world().get(), raw_world);
  OwnedStream main = rt->high_priority_stream();
  {
    BubbleScope bubble(*rt, main.get());
    sim_device::stream_delay(main.get(), 50.0);
  }
  rt->iteration_end();
  rt->sim_world().run_until_idle();
  rt->synchronize();
  EXPECT_EQ(rt->stats().bubbles, 1u);
  EXPECT_DOUBLE_EQ(rt->stats().bubble_time_us, 50.0);
  rt.reset();  // the runtime, then the world it kept: both destroyed without an error (TearDown),
              // none leaked (the ASan run's leak check); a world destroyed first would have
              // failed with pfErrorBusy (a runtime attached)
}

TEST_F(CxxLifetimes, OwnedStreamsAreDestroyedWithTheirObject) {
  Runtime rt(quiet_sim_config());
  void* raw = nullptr;
  {
    OwnedStream main = rt.high_priority_stream();
    raw = main.get();
    OwnedStream moved = std::move(main);
    EXPECT_EQ(main.get(), nullptr);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(moved.get(), raw);
  }
  EXPECT_EQ(pfStreamDestroy(rt.get(), raw), pfErrorInvalidArgument);  // already destroyed
  OwnedStream kept = rt.high_priority_stream();
  void* released = kept.release();
  EXPECT_NO_THROW(rt.destroy_stream(released));
}

TEST_F(CxxLifetimes, AFailingDestructorKeepsCodeAndMessageUntilCleared) {
  Runtime rt(quiet_sim_config());
  OwnedStream main = rt.high_priority_stream();
  void* raw = main.get();
  rt.bubble_begin(raw);
  { OwnedStream doomed = std::move(main); }  // pfStreamDestroy of the open bubble's stream: refused
  EXPECT_EQ(last_destructor_error(), pfErrorInvalidState);
  EXPECT_NE(last_destructor_error_message().find("bubble"), std::string::npos)
      << last_destructor_error_message();
  clear_destructor_error();
  EXPECT_EQ(last_destructor_error(), pfSuccess);
  EXPECT_TRUE(last_destructor_error_message().empty());
  rt.bubble_end(raw);
  rt.destroy_stream(raw);  // the refused destroy left it alive
}

TEST_F(CxxLifetimes, CaptureContextScopePairsPushAndPop) {
  Runtime rt(quiet_sim_config());
  OwnedStream capture = rt.graph_capture_stream();
  { CaptureContextScope scope(rt, capture); }
  EXPECT_EQ(pfGraphCaptureContextPop(rt.get()), pfErrorInvalidState);  // the scope popped it
}

TEST(CxxToResult, ExceptionsBecomeResultCodes) {
  EXPECT_EQ(to_result([] {}), pfSuccess);
  EXPECT_EQ(to_result([] { throw Error(pfErrorOutOfMemory, "no room"); }), pfErrorOutOfMemory);
  EXPECT_EQ(to_result([] { throw std::runtime_error("boom"); }), pfErrorJobFailed);
}

}  // namespace
}  // namespace pipefill::testing
