// Each scheduling policy orders jobs as documented, end to end: which job's slices fill the
// bubbles, in order.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

std::vector<std::string>* g_launch_log = nullptr;

struct LoggingJob : CountingJob {
  static pfResult_t launch_logged(void* user, const pfSliceDesc_t* slice, void* stream) {
    // pfJobCreate's warm-up (an empty slice) is not a bubble's slice: not logged.
    if (slice->max_items > 0) g_launch_log->push_back(static_cast<LoggingJob*>(user)->name);
    return CountingJob::launch(user, slice, stream);
  }
};

std::vector<std::string> run_policy(pfSchedulePolicy_t policy, int bubbles) {
  std::vector<std::string> log;
  g_launch_log = &log;
  ManualStage stage;
  stage.init();
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.policy = policy;
  pfRuntime_t rt = stage.runtime(&config);
  // A: oldest, most work; B: highest priority; C: least work. One job's slice fills a whole
  // 100 µs bubble (28 fill SMs x 10 items).
  LoggingJob jobs[3];
  const char* names[3] = {"A", "B", "C"};
  const int priorities[3] = {0, 5, 1};
  const uint64_t items[3] = {5000, 3000, 1000};
  pfJob_t handles[3] = {};
  for (int i = 0; i < 3; ++i) {
    jobs[i].name = names[i];
    jobs[i].priority = priorities[i];
    jobs[i].items = items[i];
    pfJobDesc_t d = jobs[i].desc();
    d.launch = &LoggingJob::launch_logged;
    EXPECT_EQ(pfJobCreate(rt, &d, &handles[i]), pfSuccess) << pfGetLastErrorMessage();
  }
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int b = 0; b < bubbles; ++b) stage.step(rt, 100.0, &hint);
  EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess);
  for (pfJob_t h : handles) EXPECT_EQ(pfJobDestroy(h), pfSuccess);
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
  g_launch_log = nullptr;
  return log;
}

using Log = std::vector<std::string>;

TEST(Policies, FifoServesCreationOrder) {
  EXPECT_EQ(run_policy(pfPolicyFifo, 4), (Log{"A", "A", "A", "A"}));
}

TEST(Policies, PriorityServesHighestFirst) {
  EXPECT_EQ(run_policy(pfPolicyPriority, 4), (Log{"B", "B", "B", "B"}));
}

TEST(Policies, ShortestRemainingServesLeastWorkFirst) {
  // C (1000 items) needs 280+280+280+160: its last slice leaves 40 µs, which goes to B (3000
  // items of remaining work < A's 5000).
  EXPECT_EQ(run_policy(pfPolicyShortestRemaining, 5), (Log{"C", "C", "C", "C", "B", "B"}));
}

TEST(Policies, FairShareRotatesByReceivedBubbleTime) {
  EXPECT_EQ(run_policy(pfPolicyFairShare, 4), (Log{"A", "B", "C", "A"}));
}

}  // namespace
}  // namespace pipefill::testing
