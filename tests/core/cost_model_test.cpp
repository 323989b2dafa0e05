// The learned item cost's rules (core/cost_model.hpp) and the planner's one-item probe, with
// hand-computed cases: the window's quantiles, its ring, per-worker rounds, the probe back-off.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <random>
#include <vector>

#include "core/cost_model.hpp"
#include "core/planner.hpp"

namespace pipefill::core {
namespace {

TEST(CostWindow, NearestRankQuantilesOfTheKeptSamples) {
  CostWindow w;
  EXPECT_EQ(w.quantile(0.5), 0.0);  // no sample: no estimate
  for (double v : {30.0, 10.0, 20.0, 50.0, 40.0}) w.add(v);
  EXPECT_EQ(w.kept(), 5u);
  EXPECT_DOUBLE_EQ(w.quantile(0.5), 30.0);  // rank ceil(2.5) = 3 of 10,20,30,40,50
  EXPECT_DOUBLE_EQ(w.quantile(0.9), 50.0);  // rank ceil(4.5) = 5
  EXPECT_DOUBLE_EQ(w.quantile(0.1), 10.0);
}

TEST(CostWindow, KeepsOnlyTheLastSamplesAndIgnoresNonsense) {
  CostWindow w;
  for (size_t i = 0; i < CostWindow::kCapacity; ++i) w.add(100.0);
  for (size_t i = 0; i < CostWindow::kCapacity; ++i) w.add(5.0);  // the load dropped
  w.add(0.0);
  w.add(-3.0);
  EXPECT_EQ(w.kept(), CostWindow::kCapacity);
  EXPECT_EQ(w.total(), 2 * CostWindow::kCapacity);
  EXPECT_DOUBLE_EQ(w.quantile(1.0), 5.0);  // every 100 us sample has left the window
}

TEST(JobCostModel, PriorUntilMeasuredThenPerWorkerRounds) {
  JobCostModel m;
  m.init(/*gated_kind=*/true);
  EXPECT_DOUBLE_EQ(m.estimate(0, 250.0), 250.0);
  // 7 items on 3 workers: ceil(7/3) = 3 rounds in 31.5 us -> 10.5 us per item per worker.
  EXPECT_DOUBLE_EQ(m.add_slice(0, 31.5, 7, 3, 250.0), 10.5);
  EXPECT_DOUBLE_EQ(m.estimate(0, 250.0), 10.5);
  EXPECT_DOUBLE_EQ(m.estimate(1, 40.0), 40.0);  // another configuration keeps its prior
}

// One slice as a ticket kernel runs it: `workers` blocks claim the next of `items` items from
// one cursor whenever they are free, each item costing `cost_us` x (1 + `jitter` x N(0, 1)); the
// slice's busy time is when the last block finishes. Adds every item's cost to *total_us.
double jittered_ticket_slice(std::mt19937_64& rng, int workers, uint64_t items, double cost_us,
                             double jitter, double* total_us) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int w = 0; w < workers; ++w) free_at.push(0.0);
  double busy = 0.0;
  for (uint64_t i = 0; i < items; ++i) {
    const double item = cost_us * std::max(0.05, 1.0 + jitter * normal(rng));
    *total_us += item;
    const double end = free_at.top() + item;
    free_at.pop();
    free_at.push(end);
    busy = std::max(busy, end);
  }
  return busy;
}

// Issue 32: a slice's busy time is set by the slowest of its parallel workers, so busy / rounds
// learned 14.1-14.7 us for a 13.98 us item in BM_PeersEngineSim and the planner lost rounds.
// The learned cost of a gated job must be the per-item cost. The bubbles vary (5-20 rounds of
// 124 workers, 5% jitter as the engine bench's kernels): the estimate is within 2% of the mean
// item cost (the slope keeps the part of the tail that grows with the rounds: the workers drift
// apart as sqrt(rounds) until they are an item apart; 1.5% here), where busy / rounds alone
// overstates it by the whole tail (3.4% here, > 3% asserted).
TEST(JobCostModel, GatedEstimateIsThePerItemCostNotTheSlowestWorkersRound) {
  std::mt19937_64 rng(32);
  const int workers = 124;
  const double cost_us = 13.98;
  JobCostModel m;
  m.init(/*gated_kind=*/true);
  double total_us = 0.0;
  uint64_t total_items = 0;
  double per_round_sum = 0.0;
  for (int slice = 0; slice < 30; ++slice) {
    const uint64_t rounds = 5 + static_cast<uint64_t>(slice * 7 % 16);  // 5..20, varied
    const uint64_t items = rounds * workers;
    const double busy = jittered_ticket_slice(rng, workers, items, cost_us, 0.05, &total_us);
    total_items += items;
    if (slice >= 15) per_round_sum += busy / static_cast<double>(rounds);
    m.add_slice(0, busy, items, workers, 100.0);
  }
  const double true_cost = total_us / static_cast<double>(total_items);
  EXPECT_NEAR(true_cost, cost_us, 0.01 * cost_us);  // the draws are what the test says they are
  // The old rule's estimate (the window's per-round times) is far off: the bias this fixes.
  EXPECT_GT(per_round_sum / 15.0, 1.03 * true_cost);
  EXPECT_NEAR(m.estimate(0, 100.0), true_cost, 0.02 * true_cost);
}

// Slices all of the same rounds give no slope: the estimate stays the median per-round time.
TEST(JobCostModel, GatedEstimateWithoutVaryingRoundsIsTheMedianPerRoundTime) {
  JobCostModel m;
  m.init(true);
  for (int i = 0; i < 5; ++i) m.add_slice(0, 31.5 + i, 7, 3, 250.0);  // 3 rounds each
  EXPECT_DOUBLE_EQ(m.estimate(0, 250.0), 33.5 / 3.0);                 // the median, 33.5 us
  // Three slices of 2, 4 and 6 rounds on one line busy = 10 x rounds + 5 (a 5 us tail): the
  // slope, 10 us, is the item cost; busy / rounds would say 11.25 (the median of 12.5, 11.25,
  // 10.83).
  JobCostModel line;
  line.init(true);
  line.add_slice(0, 25.0, 2, 1, 250.0);
  line.add_slice(0, 45.0, 4, 1, 250.0);
  line.add_slice(0, 65.0, 6, 1, 250.0);
  EXPECT_DOUBLE_EQ(line.estimate(0, 250.0), 10.0);
  EXPECT_DOUBLE_EQ(line.slice_tail(0), 5.0);  // the intercept: what the planner keeps free
  EXPECT_DOUBLE_EQ(m.slice_tail(0), 0.0);     // no slope, no tail: busy / rounds holds it
  // A job whose items are a host thread's own work keeps the fastest sample (no slope).
  JobCostModel host;
  host.init(true);
  host.fastest = true;
  host.add_slice(0, 25.0, 2, 1, 250.0);
  host.add_slice(0, 45.0, 4, 1, 250.0);
  host.add_slice(0, 65.0, 6, 1, 250.0);
  EXPECT_DOUBLE_EQ(host.estimate(0, 250.0), 65.0 / 6.0);
  EXPECT_DOUBLE_EQ(host.slice_tail(0), 0.0);
}

// The planner counts rounds in the budget left after the learned tail: a 100 us budget of 10 us
// items is 10 rounds, 9 when the slice's last round spreads 5 us past rounds x cost.
TEST(PlanSlice, TheLearnedTailComesOutOfTheBudgetBeforeTheRounds) {
  std::vector<JobConfigModel> configs(1);
  configs[0].item_cost_us = 10.0;
  PlanRequest r;
  r.predicted_us = 100.0;
  r.fill_sms = 4;
  r.free_bytes = 1024;
  r.remaining_items = 1000;
  SlicePlan p = plan_slice(r, configs);
  ASSERT_TRUE(p.fill) << p.reason;
  EXPECT_EQ(p.items, 40u);  // 4 workers x 10 rounds
  configs[0].slice_tail_us = 5.0;
  p = plan_slice(r, configs);
  ASSERT_TRUE(p.fill) << p.reason;
  EXPECT_EQ(p.items, 36u);  // 4 workers x floor(95 / 10) rounds
}

TEST(JobCostModel, OneSlowFirstSliceDoesNotRaiseAGatedEstimate) {
  JobCostModel gated, opaque;
  gated.init(true);
  opaque.init(false);
  // The prior says 100 us; the first slices measure 3700 us (a cold start, a loaded machine).
  EXPECT_DOUBLE_EQ(gated.add_slice(0, 3700.0, 1, 1, 100.0), 100.0);
  EXPECT_DOUBLE_EQ(gated.add_slice(0, 3700.0, 1, 1, 100.0), 100.0);
  // Three samples agree: now the estimate follows them.
  EXPECT_DOUBLE_EQ(gated.add_slice(0, 3700.0, 1, 1, 100.0), 3700.0);
  // Opaque work is not stopped by the gate: its estimate rises with the first sample.
  EXPECT_DOUBLE_EQ(opaque.add_slice(0, 3700.0, 1, 1, 100.0), 3700.0);
  // Lowering needs one sample, gated or not (a prior 25x too large is the common case).
  JobCostModel low;
  low.init(true);
  EXPECT_DOUBLE_EQ(low.add_slice(0, 4.0, 1, 1, 100.0), 4.0);
}

TEST(JobCostModel, ConfigurationsBeyondTheLearnedOnesKeepTheirPriorAndCountNoSample) {
  JobCostModel m;
  m.init(true);
  const size_t beyond = JobCostModel::kMaxConfigs;  // a job may have more configurations
  EXPECT_DOUBLE_EQ(m.add_slice(beyond, 10.0, 1, 1, 70.0), 70.0);
  EXPECT_EQ(m.samples(beyond), 0u);
  m.add_slice(0, 10.0, 1, 1, 70.0);
  EXPECT_EQ(m.samples(0), 1u);
}

TEST(JobCostModel, GatedMedianIgnoresOutliersOpaqueTakesTheSlowEnd) {
  JobCostModel gated, opaque;
  gated.init(true);
  opaque.init(false);
  for (int i = 0; i < 12; ++i) {
    gated.add_slice(0, 10.0, 1, 1, 1.0);
    opaque.add_slice(0, 10.0, 1, 1, 1.0);
  }
  for (int i = 0; i < 3; ++i) {  // three slices 5x slower (a busy rank)
    gated.add_slice(0, 50.0, 1, 1, 1.0);
    opaque.add_slice(0, 50.0, 1, 1, 1.0);
  }
  EXPECT_DOUBLE_EQ(gated.estimate(0, 1.0), 10.0);
  // 15 samples, rank ceil(13.5) = 14: one of the slow ones. Nothing bounds opaque overrun.
  EXPECT_DOUBLE_EQ(opaque.estimate(0, 1.0), 50.0);
}

TEST(JobCostModel, ProbesBackOffWhileTooShortAndResetOnceTheJobFits) {
  JobCostModel m;
  m.init(true);
  std::vector<uint32_t> probed_at;
  for (uint32_t bubble = 1; bubble <= 40; ++bubble) {
    const bool probe = m.probe_due();  // planned before the bubble, from the harvested streak
    m.note_too_short(100.0, 95.0);
    if (probe) {
      probed_at.push_back(bubble);
      m.note_probe();
    }
  }
  // The streak before bubble b is b - 1. Due at streak 2 (bubble 3); each probe's bubble ends on
  // streak b and sets the next at b + 4, 8, 16: bubbles 8, 17, 34.
  EXPECT_EQ(probed_at, (std::vector<uint32_t>{3, 8, 17, 34}));
  EXPECT_EQ(m.probes, 4u);
  EXPECT_EQ(m.too_short_streak, 40u);
  double predicted[kRecentTooShort]{}, budget[kRecentTooShort]{};
  EXPECT_EQ(m.recent(predicted, budget), kRecentTooShort);
  EXPECT_DOUBLE_EQ(budget[0], 95.0);
  m.note_fitted();
  EXPECT_EQ(m.too_short_streak, 0u);
  EXPECT_EQ(m.too_short_bubbles, 40u);
  EXPECT_FALSE(m.probe_due());
}

TEST(PlanProbe, OneItemOnOneWorkerWithTheWholeBudget) {
  std::vector<JobConfigModel> configs(1);
  configs[0].item_cost_us = 250.0;
  configs[0].workspace_bytes_per_item = 64;
  PlanRequest r;
  r.predicted_us = 100.0;
  r.launch_overhead_us = 5.0;
  r.fill_sms = 28;
  r.free_bytes = 1024;
  r.remaining_items = 1000;
  // The regular plan finds no item that fits: the probe is what makes the job measurable.
  EXPECT_FALSE(plan_slice(r, configs).fill);
  const SlicePlan p = plan_probe(r, configs, 0);
  ASSERT_TRUE(p.fill) << p.reason;
  EXPECT_TRUE(p.probe);
  EXPECT_EQ(p.items, 1u);
  EXPECT_EQ(p.workers, 1);
  EXPECT_EQ(p.sms, 1);
  EXPECT_DOUBLE_EQ(p.expected_us, 95.0);
  EXPECT_EQ(p.workspace_bytes, 64u);
  r.free_bytes = 63;  // one item's workspace no longer fits
  EXPECT_FALSE(plan_probe(r, configs, 0).fill);
  r.free_bytes = 1024;
  r.predicted_us = 5.0;  // no time at all
  EXPECT_FALSE(plan_probe(r, configs, 0).fill);
  r.predicted_us = 100.0;
  EXPECT_FALSE(plan_probe(r, configs, 3).fill);  // no such configuration
  EXPECT_TRUE(plan_probe(r, configs, 0).fill);
}

}  // namespace
}  // namespace pipefill::core
