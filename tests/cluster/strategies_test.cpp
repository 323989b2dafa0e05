// Fill strategies of the cluster simulator (strategies.hpp): each peer's defining behaviour on a
// hand-computed bubble, and the side-by-side comparison (compare.hpp) on a small cluster.
#include "cluster/strategies.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cluster/cluster_sim.hpp"
#include "cluster/compare.hpp"
#include "cluster/quantile_sketch.hpp"
#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

// One job with a fixed planner answer; records every run the strategy makes.
class OneJob final : public JobSource {
 public:
  explicit OneJob(JobView v, PlannedSegment seg = {}) : view_(v), seg_(seg) {}
  bool current(double, JobView* out) override {
    if (view_.remaining_work <= 0) return false;
    *out = view_;
    return true;
  }
  PlannedSegment plan(double) override { return seg_; }
  void consume(double work, double) override { view_.remaining_work -= work; }
  void record(double start, double end, double items) override { runs.push_back({start, end, items}); }
  struct Run {
    double start, end, items;
  };
  std::vector<Run> runs;

 private:
  JobView view_;
  PlannedSegment seg_;
};

JobView job(double item_us, double dedicated_us = 100.0) {
  JobView v;
  v.item_us = item_us;
  v.dedicated_item_us = dedicated_us;
  v.work_per_item = 1.0;
  v.remaining_work = 1e9;
  v.mem_intensity = 0.5;
  v.block_us = 20.0;
  v.kernel_us = 50.0;
  return v;
}

StrategyParams params(FillStrategy s, InterferenceModel m = {0.0, 0.0}) {
  StrategyParams p;
  p.strategy = s;
  p.sm_count = 132;
  p.launch_overhead_us = 10.0;
  p.gate_visibility_us = 2.0;
  p.interference = m;
  return effective_params(p);
}

BubbleInput bubble(double actual, double predicted) {
  BubbleInput b;
  b.actual_us = actual;
  b.predicted_us = predicted;
  return b;
}

TEST(Strategies, NaiveSlowsTheMainJobByTheClosedFormAmount) {
  // Items launched back to back from launch L while the host has not seen the end A; the item in
  // flight at A runs to completion and the main job (same queue) waits for it:
  // delay = L + ceil((A - L) / c) c - A, whatever beta is (it never co-runs).
  const double L = 10.0, c = 300.0;
  for (double A : {400.0, 1000.0, 1234.5, 310.0}) {
    for (double beta : {0.0, 0.6}) {
      OneJob jobs(job(c, 255.0));
      Rng rng(1);
      const BubbleOutcome o = simulate_bubble(params(FillStrategy::Naive, {beta, 0.0}), bubble(A, A), jobs, rng);
      const double items = std::ceil((A - L) / c);
      const double expected = L + items * c - A;
      EXPECT_NEAR(o.main_delay_us(), expected, 1e-9) << "A=" << A;
      EXPECT_NEAR(o.sm_own_us, expected, 1e-9);
      EXPECT_NEAR(o.post_us, expected, 1e-9);
      EXPECT_NEAR(o.work_dedicated_us, items * 255.0, 1e-9);
      EXPECT_NEAR(o.filled_us, A, 1e-9);
    }
  }
}

TEST(Strategies, FreeRideNeverStartsAStepThatDoesNotFitThePredictedEnd) {
  // 12 ms steps: admission = ceil(12 / 10) x 10 ms x 1.2 = 24 ms (run_side_task.py); with the
  // host polls at zero, steps start at 0, 12, ..., 72 ms (100 - 72 = 28 > 24; 100 - 84 = 16 is
  // not): 7 steps, and the last ends at 84 ms, past an actual end of 80 ms (the host only knows
  // the prediction): 4 ms on the main job's time.
  StrategyParams p = params(FillStrategy::FreeRide);
  p.freeride.scheduler_poll_us = 0.0;
  p.freeride.task_poll_us = 0.0;
  OneJob jobs(job(12000.0, 10000.0));
  Rng rng(1);
  const BubbleOutcome o = simulate_bubble(p, bubble(80000.0, 100000.0), jobs, rng);
  ASSERT_EQ(jobs.runs.size(), 7u);
  EXPECT_DOUBLE_EQ(jobs.runs.back().start, 72000.0);
  EXPECT_DOUBLE_EQ(o.post_us, 4000.0);
  EXPECT_DOUBLE_EQ(o.work_dedicated_us, 7 * 10000.0);
  EXPECT_TRUE(o.overran);

  // Ideal: no rounding, no polling: admission 14.4 ms, so a step at 84 ms (16 > 14.4) starts too.
  OneJob ideal_jobs(job(12000.0, 10000.0));
  const BubbleOutcome ideal =
      simulate_bubble(params(FillStrategy::FreeRideIdeal), bubble(80000.0, 100000.0), ideal_jobs, rng);
  EXPECT_EQ(ideal_jobs.runs.size(), 8u);
  EXPECT_DOUBLE_EQ(ideal.post_us, 96000.0 - 80000.0);

  // As coded (10 ms scheduler and 5 ms task polls): whatever the polls drew, no step starts
  // with the predicted time left at or under the admission duration, and steps are 5 ms apart.
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    OneJob coded(job(12000.0, 10000.0));
    Rng r(seed);
    simulate_bubble(params(FillStrategy::FreeRide), bubble(80000.0, 100000.0), coded, r);
    for (size_t i = 0; i < coded.runs.size(); ++i) {
      EXPECT_GT(100000.0 - coded.runs[i].start, 24000.0) << "seed " << seed;
      EXPECT_LE(coded.runs[i].start, 15000.0 + i * 17000.0 + 1e-9);
      if (i > 0) EXPECT_NEAR(coded.runs[i].start - coded.runs[i - 1].end, 5000.0, 1e-9);
    }
  }
}

TEST(Strategies, TallyOverrunsByAtMostItsRetreatLatency) {
  // Persistent blocks on every SM run until the retreat flag (set signal_us after the real end)
  // and then finish their task: the main kernel owns its SMs signal + min(block, budget) after
  // the end, however long the fill job is and however the bubble was predicted.
  for (double block : {20.0, 500.0}) {
    for (double A : {1000.0, 5000.0, 123456.0}) {
      JobView v = job(300.0);
      v.block_us = block;
      OneJob jobs(v);
      Rng rng(1);
      const BubbleOutcome o = simulate_bubble(params(FillStrategy::Tally), bubble(A, 1.0), jobs, rng);
      const double task = std::min(block, 100.0);  // PRIORITY_MAX_ALLOWED_PER_BLOCK_LATENCY_MS = 0.1
      EXPECT_DOUBLE_EQ(o.sm_own_us, 10.0 + task) << "block " << block << " A " << A;
      EXPECT_LE(o.post_us, 10.0 + task);
      EXPECT_GT(o.work_dedicated_us, 0.0);
    }
  }
  // As coded, the next main kernel is intercepted at the bubble begin (CPU run-ahead): it
  // retreats before it starts, so nothing is filled and nothing is lost.
  OneJob jobs(job(300.0));
  Rng rng(1);
  const BubbleOutcome o = simulate_bubble(params(FillStrategy::TallyAsCoded), bubble(5000.0, 5000.0), jobs, rng);
  EXPECT_EQ(o.work_dedicated_us, 0.0);
  EXPECT_EQ(o.filled_us, 0.0);
  EXPECT_EQ(o.main_delay_us(), 0.0);
}

TEST(Strategies, OursStopsAtTheGateAndThePaperStyleRunsItsWholePiece) {
  // Both get the planner's 10 items of 300 µs; the bubble really ends at 1000 µs.
  PlannedSegment seg;
  seg.fill = true;
  seg.items = 10;
  seg.item_us = 300.0;
  seg.dedicated_item_us = 255.0;
  const InterferenceModel beta{0.6, 0.0};
  StrategyParams ours = params(FillStrategy::Ours, beta);
  ours.fill_sm_share = 116.0 / 132.0;
  ours.reserved = true;
  OneJob a(job(300.0, 255.0), seg);
  Rng rng(1);
  const BubbleOutcome o = simulate_bubble(ours, bubble(1000.0, 4000.0), a, rng);
  // Gate seen at 1002: items starting at 10, 310, 610, 910 run; the fourth ends at 1210.
  ASSERT_EQ(a.runs.size(), 1u);
  EXPECT_DOUBLE_EQ(a.runs[0].items, 4.0);
  EXPECT_DOUBLE_EQ(o.post_us, 210.0);
  EXPECT_LE(o.post_us, seg.item_us + ours.gate_visibility_us);
  EXPECT_DOUBLE_EQ(o.first_block_us, 0.0);  // reserved SMs are free at the end
  EXPECT_DOUBLE_EQ(o.sm_own_us, 20.0);      // one fill block drains
  EXPECT_NEAR(o.corun_us, 0.6 * (116.0 / 132.0) * 0.5 * 210.0, 1e-9);

  OneJob b(job(300.0, 255.0), seg);
  const BubbleOutcome paper = simulate_bubble(params(FillStrategy::PaperStyle, beta), bubble(1000.0, 4000.0), b, rng);
  EXPECT_DOUBLE_EQ(b.runs[0].items, 10.0);
  EXPECT_DOUBLE_EQ(paper.post_us, 10.0 + 3000.0 - 1000.0);
  EXPECT_NEAR(paper.corun_us, 0.6 * 1.0 * 0.5 * 2010.0, 1e-9);
  EXPECT_GT(paper.first_block_us, 0.0);  // no reservation: waits for the first fill block
  EXPECT_GT(paper.main_delay_us(), o.main_delay_us());
}

TEST(Strategies, TransfersBesideFillAreStretchedByGamma) {
  // Exact fit (no overrun): the only cost is gamma on the fill's overlap with the transfers that
  // open and close the bubble: gamma x f x I x (overlap with [0, out) + overlap with [A - in, A)).
  PlannedSegment seg;
  seg.fill = true;
  seg.items = 3;
  seg.item_us = 330.0;
  seg.dedicated_item_us = 300.0;
  BubbleInput b = bubble(1000.0, 1000.0);
  b.transfer_out_us = 50.0;
  b.transfer_in_us = 40.0;
  OneJob jobs(job(330.0), seg);
  Rng rng(1);
  const BubbleOutcome o = simulate_bubble(params(FillStrategy::Ours, {0.6, 0.5}), b, jobs, rng);
  // Fill kernels hold SMs on [10, 1000): overlap 40 with the send and 40 with the receive.
  EXPECT_NEAR(o.comm_us, 0.5 * 1.0 * 0.5 * (40.0 + 40.0), 1e-9);
  EXPECT_EQ(o.post_us, 0.0);
  EXPECT_EQ(o.corun_us, 0.0);
}

TEST(Strategies, PartitionSpeedIsAmdahlOverMemoryIntensity) {
  EXPECT_DOUBLE_EQ(partition_speed(0.5, 0.4), 1.0 / (0.6 / 0.5 + 0.4));
  EXPECT_DOUBLE_EQ(partition_speed(1.0, 0.7), 1.0);
  EXPECT_DOUBLE_EQ(partition_speed(0.25, 1.0), 1.0);  // bandwidth-bound: SMs do not matter
  EXPECT_DOUBLE_EQ(partition_speed(0.25, 0.0), 0.25);
}

TEST(QuantileSketch, NearestRankExactThenWithinOneBin) {
  // Exact phase: nearest rank against a sorted copy; zeros only counted.
  QuantileSketch q;
  std::vector<double> v;
  Rng rng(3);
  for (int i = 0; i < 1000; ++i) {
    const double x = i % 4 == 0 ? 0.0 : 1.0 + 100.0 * rng.uniform();
    q.add(x);
    v.push_back(x);
  }
  std::sort(v.begin(), v.end());
  for (double p : {0.1, 0.25, 0.5, 0.9, 0.99, 1.0}) {
    const size_t rank = static_cast<size_t>(std::ceil(p * v.size()));
    EXPECT_DOUBLE_EQ(q.quantile(p), v[rank - 1]) << p;
  }
  EXPECT_EQ(q.count(), 1000u);
  // Binned phase (more than 65,536 values): the answer is its bin's upper edge, at most one
  // 1%-wide log bin (2.3%) above the exact value and never below it.
  QuantileSketch big;
  std::vector<double> w;
  for (int i = 0; i < 100000; ++i) {
    const double x = 0.5 + 1000.0 * rng.uniform();
    big.add(x);
    w.push_back(x);
  }
  std::sort(w.begin(), w.end());
  for (double p : {0.5, 0.99}) {
    const double exact = w[static_cast<size_t>(std::ceil(p * w.size())) - 1];
    EXPECT_GE(big.quantile(p), exact);
    EXPECT_LE(big.quantile(p), exact * 1.024);
  }
}

TEST(Strategies, NamesRoundTrip) {
  for (FillStrategy s : all_strategies()) {
    FillStrategy back;
    ASSERT_TRUE(parse_strategy(strategy_name(s), &back));
    EXPECT_EQ(back, s);
  }
  FillStrategy x;
  EXPECT_FALSE(parse_strategy("freerider", &x));
}

// A small cluster (the cluster_sim_test shape), inference jobs of 400 µs items.
ClusterSimSpec small_cluster() {
  ClusterSimSpec s;
  TrainingSpec& t = s.training;
  t.model.layers = 8;
  t.model.hidden = 512;
  t.model.heads = 8;
  t.model.sequence = 512;
  t.model.vocabulary = 1000;
  t.parallel.tensor = 2;
  t.parallel.pipeline = 4;
  t.parallel.data = 2;
  t.parallel.micro_batch = 1;
  t.parallel.global_batch = 16;
  t.gpu.peak_tflops = 10.0;
  t.gpu.achieved_fraction = 0.5;
  t.gpu.memory_gib = 16.0;
  t.gpu.memory_reserve_gib = 1.0;
  s.fill.jitter = 0.3;
  s.fill.prediction_quantile = 1.0;  // predict the longest: bubbles end early on purpose
  s.fill.gated_prediction_quantile = 1.0;  // ours (gated) plans to this one
  s.fill.warmup_iterations = 2;
  s.fill.reserved_sms = 16;
  s.workload.initial_jobs_per_gpu = 2.0;
  s.workload.arrivals_per_gpu_hour = 0.0;
  FillJobType j;
  j.name = "inf";
  j.kind = "inference";
  j.size_median = 1e12;
  j.size_sigma = 0.0;
  FillConfigSpec c;
  c.item_us = 400.0;
  c.work_per_item = 1.0;
  c.resident_bytes = 100u << 20;
  j.configs.push_back(c);
  s.job_types = {j};
  s.iterations = 12;
  return s;
}

TEST(Comparison, OneRunPerStrategyOnTheSameWorkload) {
  Comparison c;
  ASSERT_EQ(run_comparison(small_cluster(), true, &c), pfSuccess) << last_error_message();
  ASSERT_EQ(c.rows.size(), 1 + all_strategies().size());
  const ComparisonRow& none = c.rows.front();
  EXPECT_FALSE(none.fill);
  EXPECT_EQ(none.result.filled_us, 0.0);
  EXPECT_EQ(none.result.slowdown_fraction, 0.0);
  for (const auto& row : c.rows) {
    if (row.fill) EXPECT_EQ(row.result.jobs_generated, c.find("ours")->result.jobs_generated) << row.name;
    EXPECT_EQ(row.result.fillable_bubble_us, none.result.fillable_bubble_us) << row.name;  // same jitter draws
  }
  EXPECT_EQ(c.find("tally-as-coded")->result.filled_us, 0.0);
  EXPECT_GT(c.find("naive")->result.slowdown_fraction, c.find("ours")->result.slowdown_fraction);
  EXPECT_GT(c.find("ours")->result.filled_us, 0.0);
  ASSERT_EQ(c.sensitivity.size(), interference_sensitivity_points().size());
  // Interference changes what the main job loses, never how much fill work is done.
  const ClusterResult& zero = c.sensitivity.front().rows.front().result;  // ours at (0, 0)
  const ClusterResult& base = c.find("ours")->result;
  EXPECT_EQ(zero.corun_fraction, 0.0);
  EXPECT_EQ(zero.comm_fraction, 0.0);
  EXPECT_GT(base.corun_fraction + base.comm_fraction, 0.0);
  EXPECT_DOUBLE_EQ(zero.fill_work_dedicated_us, base.fill_work_dedicated_us);
  EXPECT_DOUBLE_EQ(zero.filled_us, base.filled_us);
  EXPECT_LT(zero.slowdown_fraction, base.slowdown_fraction);
  // The report names every strategy, the assumption and every target.
  const std::string text = comparison_report(c);
  for (FillStrategy s : all_strategies()) EXPECT_NE(text.find(strategy_name(s)), std::string::npos);
  EXPECT_NE(text.find("beta (mem) = 0.6, gamma (comm) = 0.5"), std::string::npos);
  EXPECT_EQ(check_targets(c).size(), 4 + all_strategies().size() - 1);
}

TEST(Comparison, TargetsAreJudgedAgainstTheirThresholds) {
  Comparison c;
  ComparisonRow ours;
  ours.name = "ours";
  ours.result.slowdown_fraction = 0.004;
  ours.result.filled_share = 0.95;
  ours.result.fill_per_bubble_second = 0.80;
  ours.result.sm_own_p99_us = 60.0;
  ComparisonRow naive;
  naive.name = "naive";
  naive.strategy = FillStrategy::Naive;
  naive.result.slowdown_fraction = 0.01;
  naive.result.filled_share = 0.99;
  c.rows = {ours, naive};
  const auto checks = check_targets(c);
  ASSERT_EQ(checks.size(), 5u);
  EXPECT_TRUE(checks[0].met);    // 0.4% <= 0.5%
  EXPECT_TRUE(checks[1].met);    // 95% >= 90%
  EXPECT_FALSE(checks[2].met);   // 0.80 < 0.85
  EXPECT_FALSE(checks[3].met);   // 60 > 50 µs
  EXPECT_FALSE(checks[4].met);   // less slowdown, but naive filled more
}

TEST(Comparison, BadInterferenceIsRefusedNamingTheField) {
  ClusterSimSpec s = small_cluster();
  s.interference.mem_slowdown = -1.0;
  ClusterResult r;
  EXPECT_EQ(run_cluster_sim(s, &r), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("interference.mem_slowdown"), std::string::npos);
  s = small_cluster();
  s.fill.reserved_sms = 132;
  EXPECT_EQ(run_cluster_sim(s, &r), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("fill.reserved_sms (132)"), std::string::npos);
}

}  // namespace
}  // namespace pipefill::cluster
