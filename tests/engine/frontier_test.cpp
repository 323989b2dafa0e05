// The fill modes' knobs and frontiers (examples/pipeline_engine/frontier.hpp, issue 32 item 4):
// each knob moves its mode the way its published rule says, ours' curve is read the way the
// table says, and the zero-slowdown ceiling holds on exact bubbles. Expected values are worked
// out by hand from the rules, never copied from the code's output.
#include <gtest/gtest.h>

#include "../../examples/pipeline_engine/engine.hpp"
#include "../../examples/pipeline_engine/frontier.hpp"
#include "../../examples/pipeline_engine/peers.hpp"

using namespace engine;

namespace {

EngineOptions small(double jitter) {
  EngineOptions o;
  o.transport = "sim";
  o.iterations = 6;
  o.warm_iterations = 2;
  o.fill = "mlp";
  o.keep_every = 0;
  o.jitter = jitter;
  return o;
}

FrontierPoint ours(double filled, double slowdown) {
  FrontierPoint p;
  p.mode = FillMode::PipeFill;
  p.row.mode = FillMode::PipeFill;
  p.row.filled_pct = filled;
  p.row.slowdown_pct = slowdown;
  return p;
}

PeerRow measure(EngineOptions o, FillMode mode, double knob) {
  o.mode_knob = knob;
  PeerRow row;
  const Status s = measure_fill_mode(o, mode, 0.0, &row);
  EXPECT_TRUE(s.ok()) << s.message;
  return row;
}

}  // namespace

TEST(Frontier, OursCurveIsStraightBetweenItsPointsAndTakesTheLowestWhereItFolds) {
  Frontier f;
  f.points = {ours(84.0, 0.3), ours(80.0, 0.1), ours(90.0, 0.7)};
  double s = -1.0;
  ASSERT_TRUE(ours_slowdown_at(f, 82.0, &s));
  EXPECT_NEAR(s, 0.2, 1e-12);  // halfway from (80, 0.1) to (84, 0.3)
  ASSERT_TRUE(ours_slowdown_at(f, 87.0, &s));
  EXPECT_NEAR(s, 0.5, 1e-12);  // halfway from (84, 0.3) to (90, 0.7)
  ASSERT_TRUE(ours_slowdown_at(f, 50.0, &s));
  EXPECT_NEAR(s, 0.1, 1e-12);  // below the curve: its least-filling point fills more, for less
  EXPECT_FALSE(ours_slowdown_at(f, 90.5, &s));  // no point of ours fills that much
  // A point that fills more for less slowdown (a fold) wins over the straight line.
  f.points.push_back(ours(83.0, 0.05));
  ASSERT_TRUE(ours_slowdown_at(f, 81.0, &s));
  EXPECT_NEAR(s, 0.05, 1e-12);
  // Peers' points are not ours' curve.
  FrontierPoint peer = ours(95.0, 0.0);
  peer.mode = FillMode::Tally;
  f.points.push_back(peer);
  EXPECT_FALSE(ours_slowdown_at(f, 92.0, &s));
}

TEST(Frontier, EachKnobMovesItsModeAlongItsCurve) {
  const EngineOptions o = small(0.05);
  // Naive sizes its ungated work to a share of the expected bubble: half the share, less fill.
  EXPECT_LT(measure(o, FillMode::Naive, 0.5).filled_pct, measure(o, FillMode::Naive, 1.0).filled_pct);
  // Tally's persistent kernel on a quarter of the SMs does about a quarter of the work.
  const PeerRow tally_quarter = measure(o, FillMode::Tally, 0.25), tally_all = measure(o, FillMode::Tally, 1.0);
  EXPECT_NEAR(tally_quarter.throughput / tally_all.throughput, 33.0 / 132.0, 0.03);
  // FreeRide admits a step while k x step + pad x step fits: a larger pad admits fewer steps.
  EXPECT_LT(measure(o, FillMode::FreeRide, 4.0).filled_pct, measure(o, FillMode::FreeRide, 1.2).filled_pct);
  // A higher quantile of a varying class's history is a longer prediction: more fill.
  EXPECT_LT(measure(o, FillMode::PaperStyle, 0.05).filled_pct,
            measure(o, FillMode::PaperStyle, 0.5).filled_pct);
  EXPECT_LT(measure(o, FillMode::PipeFill, 0.1).filled_pct, measure(o, FillMode::PipeFill, 0.9).filled_pct);
}

// Exact bubbles (no jitter): the engine's default margin stops fill when the message that ends a
// bubble is sent, so ours stays under the zero-slowdown ceiling; the bare 20 us margin fills past
// the send and above it.
TEST(Frontier, CeilingBoundsFillThatStopsBeforeTheSend) {
  EngineOptions o = small(0.0);
  const PeerRow clear = measure(o, FillMode::PipeFill, -1.0);
  EXPECT_GT(clear.transfer_free_pct, 50.0);
  EXPECT_LT(clear.transfer_free_pct, 100.0);
  EXPECT_GT(clear.filled_pct, 0.0);
  EXPECT_LE(clear.filled_pct, clear.transfer_free_pct);
  o.margin_us = 20.0;
  const PeerRow beside = measure(o, FillMode::PipeFill, -1.0);
  EXPECT_GT(beside.filled_pct, clear.transfer_free_pct);
}

TEST(Frontier, RefusesANonPositiveKnobAndLeavesTheOutputAlone) {
  Frontier f;
  f.points = {ours(80.0, 0.1)};
  const Status s = run_frontier(small(0.0), {{FillMode::PaperStyle, "quantile", {0.1, -0.5}, 0.1}}, &f);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("-0.5"), std::string::npos) << s.message;
  ASSERT_EQ(f.points.size(), 1u);
  EXPECT_EQ(f.points.front().row.filled_pct, 80.0);
}

// Ours' second knob: the safety margin before each bubble's end. Below the receive's transfer
// time (the engine's default) the gate's budget reaches into the transfer, so ours fills more of
// each bubble and, beside the message's bytes (gamma), slows the main job more.
TEST(Frontier, LessMarginFillsMoreOfEachBubbleAndCostsMore) {
  const EngineOptions o = small(0.05);
  const PeerRow engine_margin = measure(o, FillMode::PipeFill, -1.0);
  Frontier f;
  ASSERT_TRUE(run_frontier(o, {{FillMode::PipeFill, "margin us", {0}, -1.0, false, true}}, &f).ok());
  ASSERT_EQ(f.points.size(), 1u);
  const FrontierPoint& none = f.points.front();
  EXPECT_FALSE(none.notice);  // on ours' plain curve
  EXPECT_FALSE(none.is_default);
  EXPECT_GT(none.row.filled_pct, engine_margin.filled_pct);
  EXPECT_GT(none.row.slowdown_pct, engine_margin.slowdown_pct);
  double s = -1.0;
  ASSERT_TRUE(ours_slowdown_at(f, none.row.filled_pct, &s));
  EXPECT_EQ(s, none.row.slowdown_pct);
}

TEST(Frontier, RefusesANegativeMarginAndAMarginWithANoticeNamingTheKnob) {
  Frontier f;
  f.points = {ours(80.0, 0.1)};
  Status s = run_frontier(small(0.0), {{FillMode::PipeFill, "margin us", {20, -5}, -1.0, false, true}}, &f);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("margin us"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("-5"), std::string::npos) << s.message;
  s = run_frontier(small(0.0), {{FillMode::PipeFill, "both", {10}, -1.0, true, true}}, &f);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("both the margin and the notice"), std::string::npos) << s.message;
  ASSERT_EQ(f.points.size(), 1u);  // a refused sweep changes nothing
  EXPECT_EQ(f.points.front().row.filled_pct, 80.0);
}

// Ours' two knobs together: a margin sweep at quantile 1 sizes each slice to its class's longest
// bubble (the gate still closes at the end), so at the same margin it fills at least as much as
// at the default median, and more where bubbles vary (jitter). A quantile given to a sweep that
// is not ours' margin sweep, or one outside (0, 1], is refused naming it.
TEST(Frontier, AMarginSweepAtQuantileOneFillsMoreThanAtTheMedian) {
  const EngineOptions o = small(0.05);
  Frontier median, longest;
  ASSERT_TRUE(run_frontier(o, {{FillMode::PipeFill, "margin us", {0}, -1.0, false, true}}, &median).ok());
  ASSERT_TRUE(run_frontier(o, {{FillMode::PipeFill, "margin us, q 1", {0}, -1.0, false, true, 1.0}},
                           &longest).ok());
  ASSERT_EQ(median.points.size(), 1u);
  ASSERT_EQ(longest.points.size(), 1u);
  EXPECT_GT(longest.points.front().row.filled_pct, median.points.front().row.filled_pct);
  EXPECT_FALSE(longest.points.front().notice);  // on ours' plain curve

  Frontier f;
  f.points = {ours(80.0, 0.1)};
  Status s = run_frontier(o, {{FillMode::PipeFill, "gated quantile", {0.5}, 0.5, false, false, 1.0}}, &f);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("at_quantile 1"), std::string::npos) << s.message;
  s = run_frontier(o, {{FillMode::PipeFill, "margin us", {0}, -1.0, false, true, 1.5}}, &f);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("1.5"), std::string::npos) << s.message;
  ASSERT_EQ(f.points.size(), 1u);  // refused sweeps change nothing
}

// A comparison never measures a job that ran out: ours' job holds a fixed number of items, and
// once they are done its bubbles have nothing to fill, which would cap its filled share by the
// job's size. 1000 items of 3.5 us are fewer than one long bubble holds on 124 SMs, so the run
// completes the job and the measurement is refused, naming the option. Given no item count, a
// comparison sizes the job by the run's length, and ours at its highest-filling settings (the
// longest-bubble quantile, no margin) is measured over the benchmark's 20 iterations (124 SMs x
// ~6 ms of bubbles per iteration / 3.5 us is over 200,000 items an iteration could take).
TEST(Frontier, AComparisonRefusesAJobThatRanOutOfItems) {
  EngineOptions o = small(0.05);
  o.fill_items = 1000;
  PeerRow row;
  row.filled_pct = 42.0;
  Status s = measure_fill_mode(o, FillMode::PipeFill, 0.0, &row);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("completed all 1000 items"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("--fill-items"), std::string::npos) << s.message;
  EXPECT_EQ(row.filled_pct, 42.0);  // a refused measurement changes nothing

  o.fill_items = 0;
  o.iterations = 20;  // the kind's default 1,000,000 items run out within these at these settings
  o.mode_knob = 1.0;
  o.margin_us = 0.0;
  s = measure_fill_mode(o, FillMode::PipeFill, 0.0, &row);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_GT(row.filled_pct, 90.0);
}
