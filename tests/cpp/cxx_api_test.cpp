// The header-only C++ layer: RAII lifetimes, exceptions carrying code and message, BubbleScope.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "runtime/fixtures.hpp"
#include "pipefill/pipefill.hpp"

namespace pipefill::testing {
namespace {

TEST(CxxApi, RuntimeJobAndBubbleScope) {
  pfConfig_t config = default_config();
  config.backend = pfBackendSim;
  config.sim_sm_count = 32;
  config.reserved_sms = 4;
  config.safety_margin_us = 0.0;
  config.safety_margin_fraction = 0.0;
  config.arena_bytes = size_t{1} << 20;
  Runtime rt(config);
  EXPECT_EQ(rt.backend(), pfBackendSim);
  EXPECT_EQ(rt.config().reserved_sms, 4);
  SimWorld world = rt.sim_world();  // a view: the runtime owns its private world
  void* main = rt.create_high_priority_stream();
  void* peer = world.create_stream(0, 0);
  pfSimEvent_t ready = nullptr;
  check(pfSimEventCreate(world.get(), &ready));

  CountingJob counting;
  counting.items = 500;
  pfJobDesc_t desc = counting.desc();
  {
    Job job(rt, desc);
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 100.0;
    for (int i = 0; i < 3; ++i) {
      check(pfSimStreamDelay(peer, 100.0));
      check(pfSimEventRecord(ready, peer));
      {
        BubbleScope bubble(rt, main, &hint);
        check(pfSimStreamWaitEvent(main, ready, 0.0, 4));
      }
      check(pfSimLaunchKernel(main, 50.0, 32));
      rt.iteration_end();
      world.run_until_idle();
    }
    rt.synchronize();
    EXPECT_EQ(job.info().status, pfJobCompleted);
    EXPECT_NO_THROW(job.wait(0.0));
    EXPECT_EQ(rt.stats().bubbles, 3u);
    EXPECT_TRUE(counting.every_item_once());
    EXPECT_EQ(rt.async_error(), pfSuccess);
  }
  EXPECT_EQ(counting.teardowns, 1);
  rt.destroy_stream(main);
}

// Runtime::set_class_margin reaches pfRuntimeSetClassMargin: accepted for a class that does not
// exist yet and removable, refused (an exception naming the value) for a non-finite margin.
TEST(CxxApi, ClassMarginsAreSetRemovedAndChecked) {
  pfConfig_t config = default_config();
  config.backend = pfBackendSim;
  Runtime rt(config);
  EXPECT_NO_THROW(rt.set_class_margin("#3", 0.0));
  EXPECT_NO_THROW(rt.set_class_margin("#3", -1.0));  // removes it
  try {
    rt.set_class_margin("#3", std::numeric_limits<double>::quiet_NaN());
    FAIL() << "expected pipefill::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), pfErrorInvalidArgument);
    EXPECT_NE(e.message().find("margin_us = nan"), std::string::npos) << e.message();
  }
  EXPECT_THROW(rt.set_class_margin("", 10.0), Error);
}

TEST(CxxApi, ErrorsCarryCodeAndMessage) {
  pfConfig_t config = default_config();
  config.backend = pfBackendSim;
  config.prediction_quantile = 2.0;
  try {
    Runtime rt(config);
    FAIL() << "expected pipefill::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), pfErrorInvalidArgument);
    EXPECT_NE(e.message().find("prediction_quantile = 2"), std::string::npos) << e.message();
    EXPECT_NE(std::string(e.what()).find("pfErrorInvalidArgument"), std::string::npos);
  }
  config = default_config();
  config.backend = pfBackendSim;
  Runtime rt(config);
  try {
    rt.bubble_end(rt.create_high_priority_stream());
    FAIL() << "expected pipefill::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), pfErrorInvalidState);
  }
  pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
  EXPECT_THROW(Job(rt, desc), Error);
  EXPECT_EQ(version(), PIPEFILL_VERSION_CODE);
}

}  // namespace
}  // namespace pipefill::testing
