// The peers' fill mechanisms as fill modes of the example engine (FreeRide-, Tally-, PipeFill-
// paper-style; examples/pipeline_engine/sim_transport.cpp) and the accounting that measures every
// mode the same way. Expected values come from independent counts (the runtime's own statistics,
// the job's item cost, the mechanisms' published rules), never from the accounting under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "../../examples/pipeline_engine/engine.hpp"
#include "../../examples/pipeline_engine/peers.hpp"
#include "engine_test_options.hpp"

using namespace engine;

namespace {

EngineOptions peer_options(double jitter) {
  EngineOptions o = engine_tests::four_stage_sim_options();
  o.jitter = jitter;
  // Interference off: the bounds below are the mechanisms' (tests/sim covers interference).
  o.interference = o.fill_slowdown = o.comm_slowdown = 0.0;
  return o;
}

// The simulator jitters fill items too (factor 1 + jitter x a standard normal draw): the longest
// item in flight lasts at most its cost x (1 + 6 sigma).
double longest_item_us(double cost_us, double jitter) { return cost_us * (1.0 + 6.0 * jitter); }

double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

}  // namespace

TEST(EnginePeers, FillAccountingAgreesWithTheRuntimesOwnCounts) {
  const EngineOptions o = peer_options(0.0);
  RunResult r;
  const Status s = run_engine(o, FillMode::PipeFill, &r);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_GT(r.item_cost_us, 0.0);
  uint64_t items = 0;
  double bubble_us = 0.0, filled_time_us = 0.0;
  for (size_t i = static_cast<size_t>(o.warm_iterations); i < r.iterations.size(); ++i) {
    items += r.iterations[i].items;
    bubble_us += r.iterations[i].bubble_us;
    filled_time_us += r.iterations[i].filled_us;
  }
  ASSERT_GT(items, 0u);
  // Every item the runtime counted completed was seen by the transport, at its nominal cost.
  EXPECT_NEAR(r.item_work_sm_us, static_cast<double>(items) * r.item_cost_us, 1e-6 * r.item_work_sm_us);
  // The transport's bubble marks and the runtime's events sit at the same stream positions.
  EXPECT_NEAR(r.bubble_us, bubble_us, 1e-6 * bubble_us);
  // SM x us inside bubbles cannot exceed the fill SMs busy for the whole time the runtime saw
  // fill in them, and with exact bubbles nearly all of that time is item work.
  const double fill_sms = o.pipeline.sm_count - o.pipeline.comm_sms;
  const double sm_share = r.filled_sm_us / (r.bubble_us * fill_sms);
  const double time_share = filled_time_us / bubble_us;
  EXPECT_LE(sm_share, time_share + 1e-9);
  EXPECT_GE(sm_share, time_share - 0.05);
  // One first-block and one all-blocks delay per bubble of every counted iteration.
  uint64_t bubbles = 0;
  for (size_t i = static_cast<size_t>(o.warm_iterations); i < r.iterations.size(); ++i)
    bubbles += r.iterations[i].bubbles;
  EXPECT_EQ(r.first_block_delays_us.size(), bubbles);
  EXPECT_EQ(r.all_blocks_delays_us.size(), bubbles);
}

TEST(EnginePeers, TallyRetreatsWithinOneItemOfEveryBubbleEnd) {
  const EngineOptions o = peer_options(0.05);
  RunResult r;
  const Status s = run_engine(o, FillMode::Tally, &r);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_FALSE(r.all_blocks_delays_us.empty());
  const double tally_item_us = r.item_cost_us / 0.9;  // its transformed items
  // The retreat flag is seen between items: the main kernel holds its SMs once the items in
  // flight at the bubble end have finished.
  EXPECT_LE(max_of(r.all_blocks_delays_us), longest_item_us(tally_item_us, o.jitter));
  // Work after the bubble ends: at most the one item each SM had in flight (counted at its
  // nominal cost).
  const size_t bubbles = r.all_blocks_delays_us.size();
  EXPECT_LE(r.item_work_sm_us - r.filled_sm_us,
            static_cast<double>(bubbles * static_cast<size_t>(o.pipeline.sm_count)) * r.item_cost_us + 1e-6);
  // No prediction: it runs from every bubble's begin to its end at 0.9 of the item speed, on the
  // SMs the receive leaves (at most all of them).
  const double fill_sms = o.pipeline.sm_count - o.pipeline.comm_sms;
  const double filled = r.filled_sm_us / (r.bubble_us * fill_sms);
  EXPECT_GT(filled, 0.85);
  EXPECT_LE(filled, 0.9 * o.pipeline.sm_count / fill_sms + 1e-9);
}

TEST(EnginePeers, OnlyTheGateCutsFillWhenABubbleEndsEarly) {
  // Jittered kernels: some bubbles end before the prediction. PipeFill's gate stops its items at
  // the bubble end (one item in flight per SM), the paper-style pieces run to completion.
  const EngineOptions o = peer_options(0.05);
  RunResult ours, paper;
  Status s = run_engine(o, FillMode::PipeFill, &ours);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(o, FillMode::PaperStyle, &paper);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_FALSE(ours.all_blocks_delays_us.empty());
  EXPECT_LE(max_of(ours.all_blocks_delays_us), longest_item_us(ours.item_cost_us, o.jitter));
  EXPECT_GT(max_of(paper.all_blocks_delays_us), 2.0 * longest_item_us(paper.item_cost_us, o.jitter));
  // Both fill: the paper-style baseline is not a strawman that never runs.
  EXPECT_GT(paper.item_work_sm_us, 0.5 * ours.item_work_sm_us);
}

TEST(EnginePeers, FreeRideRunsWholeProfiledStepsOnly) {
  const EngineOptions o = peer_options(0.0);
  RunResult r;
  const Status s = run_engine(o, FillMode::FreeRide, &r);
  ASSERT_TRUE(s.ok()) << s.message;
  uint64_t items = 0;
  for (const IterationResult& it : r.iterations) items += it.items;
  // A step is the job's items for 100 us on every SM; steps are admitted whole or not at all.
  const uint64_t per_step =
      static_cast<uint64_t>(std::floor(100.0 / r.item_cost_us)) * static_cast<uint64_t>(o.pipeline.sm_count);
  ASSERT_GT(per_step, 0u);
  EXPECT_GT(items, 0u);
  EXPECT_EQ(items % per_step, 0u) << items << " items, " << per_step << " per step";
  // Until the predictor has its 2 samples per class, FreeRide has no bubble end to fit steps to.
  EXPECT_EQ(r.iterations[0].items, 0u);
  EXPECT_EQ(r.iterations[1].items, 0u);
}

TEST(EnginePeers, TheSideBySideTableHasEveryModeAndItsRatiosToOurs) {
  EngineOptions o = peer_options(0.05);
  o.iterations = 4;
  std::vector<PeerRow> rows;
  const Status s = compare_fill_modes(
      o, {FillMode::PipeFill, FillMode::Naive, FillMode::FreeRide, FillMode::Tally, FillMode::PaperStyle},
      &rows);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].mode, FillMode::None);  // the reference, first
  EXPECT_DOUBLE_EQ(rows[0].slowdown_pct, 0.0);
  EXPECT_DOUBLE_EQ(rows[0].filled_pct, 0.0);
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GT(rows[i].filled_pct, 0.0) << fill_mode_name(rows[i].mode);
    EXPECT_GT(rows[i].throughput, 0.0) << fill_mode_name(rows[i].mode);
    EXPECT_NEAR(rows[i].slowdown_pct, 100.0 * (rows[i].iteration_us / rows[0].iteration_us - 1.0), 1e-9);
  }
  const std::string table = format_peer_table(o, rows, "> ");
  for (const char* name : {"no fill", "PipeFill", "naive", "FreeRide-style", "Tally-style", "PipeFill-paper"})
    EXPECT_NE(table.find(name), std::string::npos) << name;
  EXPECT_NE(table.find("slow/ours"), std::string::npos);
  EXPECT_NE(table.find("thr/dedic"), std::string::npos);
}

TEST(EnginePeers, BadRequestsAreErrorsNamingTheValue) {
  EngineOptions o = peer_options(0.0);
  std::vector<PeerRow> rows;
  o.transport = "nccl";
  Status s = compare_fill_modes(o, {FillMode::Tally}, &rows);
  EXPECT_EQ(s.code, pfErrorNotSupported);
  EXPECT_NE(s.message.find("'nccl'"), std::string::npos) << s.message;

  o = peer_options(0.0);
  o.warm_iterations = o.iterations;
  s = compare_fill_modes(o, {FillMode::Tally}, &rows);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("got 6"), std::string::npos) << s.message;
  EXPECT_TRUE(rows.empty());  // a failed call leaves the output alone

  FillMode mode = FillMode::Naive;
  EXPECT_FALSE(parse_fill_mode("orion", &mode));
  EXPECT_EQ(mode, FillMode::Naive);
  for (FillMode m : {FillMode::None, FillMode::PipeFill, FillMode::Naive, FillMode::FreeRide,
                     FillMode::Tally, FillMode::PaperStyle}) {
    FillMode parsed = FillMode::None;
    const std::string names[] = {"none", "pipefill", "naive", "freeride", "tally", "paper"};
    ASSERT_TRUE(parse_fill_mode(names[static_cast<int>(m)], &parsed));
    EXPECT_EQ(parsed, m);
  }
}

// The engine's default safety margin is the p2p time of the receive that ends a bubble (the
// simulated device sets a transfer's speed from the fill load when the peer sends), so that fill
// has stopped before the message is sent: with exact bubbles and the calibrated interference
// PipeFill then costs the main job nothing, while the runtime's bare 20 us margin lets fill run
// beside the transfer and stretch it (gamma).
TEST(EngineMargin, FillStopsBeforeTheReceiveMovesItsBytes) {
  EngineOptions o = peer_options(0.0);
  o.interference = 0.6;
  o.fill_slowdown = 0.6;
  o.comm_slowdown = 0.5;
  const StageCosts costs = derive_costs(o.pipeline);
  // latency + bytes / bandwidth: 10 us + 2 x 1024 x 2048 bytes at 50 GB/s
  const double p2p = o.pipeline.model.p2p_latency_us +
                     2.0 * o.pipeline.model.micro_batch * o.pipeline.model.seq * o.pipeline.model.hidden /
                         (o.pipeline.model.p2p_gbps * 1e3);
  ASSERT_GT(p2p, 20.0);  // the case where the default differs from the runtime's
  EXPECT_NEAR(engine_margin_us(o, costs), p2p, 1e-9 * p2p);
  EngineOptions bare = o;
  bare.margin_us = 20.0;
  EXPECT_DOUBLE_EQ(engine_margin_us(bare, costs), 20.0);

  RunResult none, clear, beside;
  Status s = run_engine(o, FillMode::None, &none);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(o, FillMode::PipeFill, &clear);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(bare, FillMode::PipeFill, &beside);
  ASSERT_TRUE(s.ok()) << s.message;
  for (size_t i = static_cast<size_t>(o.warm_iterations); i < none.iterations.size(); ++i) {
    EXPECT_GT(clear.iterations[i].items, 0u);
    EXPECT_NEAR(clear.iterations[i].time_us, none.iterations[i].time_us, 1e-9 * none.iterations[i].time_us)
        << "iteration " << i;
    EXPECT_GT(beside.iterations[i].time_us, none.iterations[i].time_us * 1.001) << "iteration " << i;
  }
}
