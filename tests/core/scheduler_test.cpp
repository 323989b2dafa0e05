#include <gtest/gtest.h>

#include <vector>

#include "core/scheduler.hpp"

namespace pipefill {
namespace {

JobSchedView job(uint64_t seq, int priority, double remaining, double received,
                 bool runnable = true) {
  JobSchedView v;
  v.sequence = seq;
  v.priority = priority;
  v.remaining_work_us = remaining;
  v.received_bubble_us = received;
  v.runnable = runnable;
  return v;
}

// Jobs listed out of creation order on purpose: index != sequence.
const std::vector<JobSchedView> kJobs = {
    job(3, 1, 50.0, 10.0),  // 0
    job(1, 5, 80.0, 30.0),  // 1
    job(2, 5, 50.0, 10.0),  // 2
    job(0, 1, 20.0, 0.0, /*runnable=*/false),  // 3: finished, never scheduled
    job(4, 0, 10.0, 30.0),  // 4
};

TEST(Scheduler, FifoIsCreationOrder) {
  EXPECT_EQ(schedule_order(pfPolicyFifo, kJobs), (std::vector<size_t>{1, 2, 0, 4}));
}

TEST(Scheduler, PriorityHighestFirstFifoAmongEquals) {
  EXPECT_EQ(schedule_order(pfPolicyPriority, kJobs), (std::vector<size_t>{1, 2, 0, 4}));
  std::vector<JobSchedView> jobs = kJobs;
  jobs[4].priority = 9;
  EXPECT_EQ(schedule_order(pfPolicyPriority, jobs), (std::vector<size_t>{4, 1, 2, 0}));
}

TEST(Scheduler, ShortestRemainingFirstFifoAmongEquals) {
  // remaining: 4:10, 2:50(seq2), 0:50(seq3), 1:80
  EXPECT_EQ(schedule_order(pfPolicyShortestRemaining, kJobs), (std::vector<size_t>{4, 2, 0, 1}));
}

TEST(Scheduler, FairShareLeastReceivedFirst) {
  // received: 2:10(seq2), 0:10(seq3), 1:30(seq1), 4:30(seq4)
  EXPECT_EQ(schedule_order(pfPolicyFairShare, kJobs), (std::vector<size_t>{2, 0, 1, 4}));
}

TEST(Scheduler, EmptyAndNoneRunnable) {
  EXPECT_TRUE(schedule_order(pfPolicyFifo, {}).empty());
  std::vector<JobSchedView> jobs = {job(0, 0, 1, 1, false)};
  EXPECT_TRUE(schedule_order(pfPolicyFairShare, jobs).empty());
}

TEST(Scheduler, PolicyNamesRoundTrip) {
  for (pfSchedulePolicy_t p :
       {pfPolicyFifo, pfPolicyPriority, pfPolicyShortestRemaining, pfPolicyFairShare}) {
    pfSchedulePolicy_t parsed = pfPolicyFifo;
    ASSERT_TRUE(parse_policy(policy_name(p), &parsed));
    EXPECT_EQ(parsed, p);
  }
  pfSchedulePolicy_t parsed = pfPolicyFifo;
  EXPECT_TRUE(parse_policy("shortest-remaining", &parsed));
  EXPECT_EQ(parsed, pfPolicyShortestRemaining);
  EXPECT_TRUE(parse_policy("FAIR-SHARE", &parsed));
  EXPECT_EQ(parsed, pfPolicyFairShare);
  EXPECT_FALSE(parse_policy("lifo", &parsed));
  EXPECT_FALSE(parse_policy(nullptr, &parsed));
}

}  // namespace
}  // namespace pipefill
