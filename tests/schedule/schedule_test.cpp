// Schedule generator against closed forms (uniform stages, zero p2p unless stated).
#include "schedule/schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <tuple>

namespace pipefill::schedule {
namespace {

constexpr double kRel = 1e-9;

void expect_close(double actual, double expected, const char* what) {
  EXPECT_NEAR(actual, expected, kRel * std::max(1.0, std::abs(expected))) << what;
}

ScheduleSpec uniform(ScheduleKind kind, int p, int m, double tf, double tb, int v = 1, double tw = 1.0) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.stages = p;
  spec.microbatches = m;
  spec.chunks = v;
  StageCosts c;
  c.forward_us = tf;
  c.backward_us = tb;
  c.weight_us = tw;
  spec.costs.assign(static_cast<size_t>(p), c);
  return spec;
}

Timeline run(const ScheduleSpec& spec) {
  Timeline t;
  std::string error;
  EXPECT_TRUE(simulate(spec, &t, &error)) << error;
  return t;
}

// Every bubble of the timeline, per stage, in the pipeline part (excluding optimizer).
std::vector<Bubble> pipeline_bubbles(const StageTimeline& s) {
  std::vector<Bubble> out;
  for (const Bubble& b : s.bubbles)
    if (b.kind != pfBubbleOptimizer) out.push_back(b);
  return out;
}

class GPipeAnd1F1B : public ::testing::TestWithParam<std::tuple<ScheduleKind, int, int>> {};

TEST_P(GPipeAnd1F1B, BubbleShareMatchesClosedForm) {
  const auto [kind, p, m] = GetParam();
  const double tf = 1.5, tb = 3.0;
  const Timeline t = run(uniform(kind, p, m, tf, tb));
  expect_close(t.pipeline_us, (m + p - 1) * (tf + tb), "pipeline time");
  expect_close(t.bubble_share(), double(p - 1) / double(m + p - 1), "bubble share");
  expect_close(t.bubble_ratio(), double(p - 1) / double(m), "bubble ratio");
  for (const auto& s : t.stages) {
    expect_close(s.bubble_us, (p - 1) * (tf + tb), "per-stage bubble");
    expect_close(s.compute_us, m * (tf + tb), "per-stage compute");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GPipeAnd1F1B,
                         ::testing::Combine(::testing::Values(ScheduleKind::GPipe, ScheduleKind::OneFOneB),
                                            ::testing::Values(1, 2, 4, 7), ::testing::Values(1, 3, 8, 16)));

TEST(OneFOneB, PerStageBubblePositions) {
  // Stage s: s*tf idle before its first forward (warm-up), (p-1-s)*tb waiting for its first
  // backward (warm-up), p-1-s cool-down gaps of tf each, s*tb drain at the end (stage 0
  // finishes last). Sum: (p-1)(tf+tb).
  const int p = 4, m = 8;
  const double tf = 1.0, tb = 2.0;
  const Timeline t = run(uniform(ScheduleKind::OneFOneB, p, m, tf, tb));
  for (int s = 0; s < p; ++s) {
    const auto bubbles = pipeline_bubbles(t.stages[s]);
    std::vector<Bubble> warm, cool, drain;
    for (const auto& b : bubbles) {
      if (b.kind == pfBubbleWarmup) warm.push_back(b);
      else if (b.kind == pfBubbleCooldown) cool.push_back(b);
      else if (b.kind == pfBubbleDrain) drain.push_back(b);
      else ADD_FAILURE() << "unexpected kind " << b.kind;
    }
    SCOPED_TRACE("stage " + std::to_string(s));
    size_t w = 0;
    if (s > 0) {
      ASSERT_GE(warm.size(), 1u);
      expect_close(warm[0].start_us, 0.0, "warm-up start");
      expect_close(warm[0].duration_us, s * tf, "warm-up before first forward");
      EXPECT_EQ(warm[0].op_before, -1);
      w = 1;
    }
    if (s < p - 1) {
      ASSERT_EQ(warm.size(), w + 1);
      expect_close(warm[w].duration_us, (p - 1 - s) * tb, "wait for first backward");
      // It lies right after the last warm-up forward: ops [0, p-1-s] are forwards.
      EXPECT_EQ(warm[w].op_before, p - 1 - s);
    } else {
      EXPECT_EQ(warm.size(), w);
    }
    ASSERT_EQ(cool.size(), static_cast<size_t>(p - 1 - s));
    for (const auto& b : cool) expect_close(b.duration_us, tf, "cool-down gap");
    if (s > 0) {
      ASSERT_EQ(drain.size(), 1u);
      expect_close(drain[0].duration_us, s * tb, "drain");
      expect_close(drain[0].start_us + drain[0].duration_us, t.pipeline_us, "drain ends at pipeline end");
    } else {
      EXPECT_TRUE(drain.empty());
    }
    for (size_t i = 0; i < bubbles.size(); ++i) EXPECT_EQ(bubbles[i].index_in_iteration, static_cast<int>(i));
  }
}

TEST(GPipe, WaitForFirstBackwardIsPMinus1MinusSTimesFPlusB) {
  const int p = 4, m = 5;
  const double tf = 1.0, tb = 2.0;
  const Timeline t = run(uniform(ScheduleKind::GPipe, p, m, tf, tb));
  for (int s = 0; s < p - 1; ++s) {
    const auto b = pipeline_bubbles(t.stages[s]);
    const Bubble& wait = b[s > 0 ? 1 : 0];
    EXPECT_EQ(wait.kind, pfBubbleWarmup);
    expect_close(wait.duration_us, (p - 1 - s) * (tf + tb), "GPipe wait for backward");
    EXPECT_EQ(wait.op_before, m - 1);
  }
}

TEST(OneFOneB, PeakActivationsArePMinusS) {
  const int p = 4, m = 8;
  ScheduleSpec spec = uniform(ScheduleKind::OneFOneB, p, m, 1.0, 2.0);
  for (auto& c : spec.costs) {
    c.activation_bytes = 100;
    c.weight_bytes = 1000;
    c.optimizer_bytes = 4000;
  }
  spec.device_memory_bytes = 10000;
  const Timeline t = run(spec);
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(t.stages[s].peak_in_flight, p - s);
    EXPECT_EQ(t.stages[s].peak_activation_bytes, static_cast<size_t>(100 * (p - s)));
    for (const Bubble& b : t.stages[s].bubbles) {
      // Warm-up before the first forward: nothing live; waiting for the first backward: the
      // p-s forwards done so far; drain: everything released.
      if (b.kind == pfBubbleWarmup && b.op_before == -1) EXPECT_EQ(b.free_bytes, 5000u);
      else if (b.kind == pfBubbleWarmup) EXPECT_EQ(b.free_bytes, 5000u - 100u * (p - s));
      else if (b.kind == pfBubbleDrain) EXPECT_EQ(b.free_bytes, 5000u);
    }
  }
  // GPipe holds all m micro-batches on every stage.
  spec.kind = ScheduleKind::GPipe;
  const Timeline g = run(spec);
  for (int s = 0; s < p; ++s) EXPECT_EQ(g.stages[s].peak_in_flight, m);
}

TEST(Schedule, FreeBytesZeroWhenDeviceMemoryUnknownAndClampedWhenOvercommitted) {
  ScheduleSpec spec = uniform(ScheduleKind::OneFOneB, 2, 4, 1.0, 2.0);
  Timeline t = run(spec);
  for (const auto& s : t.stages)
    for (const auto& b : s.bubbles) EXPECT_EQ(b.free_bytes, 0u);
  spec.device_memory_bytes = 10;
  spec.costs[0].weight_bytes = 100;
  t = run(spec);
  for (const auto& b : t.stages[0].bubbles) EXPECT_EQ(b.free_bytes, 0u);
}

class Interleaved : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(Interleaved, BubbleRatioIsPMinus1OverVM) {
  const auto [p, mult, v] = GetParam();
  const int m = p * mult;
  const double tf = 1.0, tb = 2.0;
  const Timeline t = run(uniform(ScheduleKind::Interleaved1F1B, p, m, tf, tb, v));
  expect_close(t.bubble_ratio(), double(p - 1) / double(v * m), "bubble ratio");
  expect_close(t.pipeline_us, m * (tf + tb) + (p - 1) * (tf + tb) / v, "pipeline time");
  expect_close(t.bubble_share(), double(p - 1) / double(v * m + p - 1), "bubble share");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Interleaved,
                         ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(2, 3, 4),
                                            ::testing::Values(2, 3, 4)));

TEST(Interleaved, PeakActivationsPerChunk) {
  // Megatron's warm-up: (p-s-1)*2 + (v-1)*p forwards, plus the first steady forward.
  const int p = 4, m = 8, v = 2;
  const Timeline t = run(uniform(ScheduleKind::Interleaved1F1B, p, m, 1.0, 2.0, v));
  for (int s = 0; s < p; ++s) EXPECT_EQ(t.stages[s].peak_in_flight, (p - s - 1) * 2 + (v - 1) * p + 1) << s;
}

TEST(Interleaved, MicrobatchesNotMultipleOfStagesFollowPyTorchsRounds) {
  // m = 6, p = 4: PyTorch's rounds = max(1, 6 / 4) = 1, all 6 micro-batches in one group (this
  // used to be refused, like older Megatron did); m = 9: rounds = 2 does not divide 9.
  ScheduleSpec spec = uniform(ScheduleKind::Interleaved1F1B, 4, 6, 1.0, 2.0, 2);
  Timeline t;
  std::string error;
  EXPECT_TRUE(simulate(spec, &t, &error)) << error;
  spec.microbatches = 9;
  EXPECT_FALSE(simulate(spec, &t, &error));
  EXPECT_NE(error.find("microbatches (9)"), std::string::npos) << error;
  EXPECT_NE(error.find("rounds"), std::string::npos) << error;
}

class ZeroBubbleH1 : public ::testing::TestWithParam<std::tuple<int, int, double>> {};

TEST_P(ZeroBubbleH1, BubbleIsPMinus1TimesFPlusBMinusW) {
  const auto [p, m, tw] = GetParam();
  const double tf = 1.0, tb_full = 2.0;  // B (input part) = tb_full - tw
  const double tb = tb_full - tw;
  const Timeline t = run(uniform(ScheduleKind::ZBH1, p, m, tf, tb_full, 1, tw));
  for (int s = 0; s < p; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    expect_close(t.stages[s].bubble_us, (p - 1) * (tf + tb - tw), "ZB-H1 stage bubble");
    expect_close(t.stages[s].compute_us, m * (tf + tb_full), "ZB-H1 stage compute");
    EXPECT_EQ(t.stages[s].peak_in_flight, p);  // 1F1B's stage-0 peak, on every stage
    int f = 0, b = 0, w = 0;
    for (const Op& op : t.stages[s].ops) {
      f += op.type == OpType::Forward;
      b += op.type == OpType::BackwardInput;
      w += op.type == OpType::BackwardWeight;
    }
    EXPECT_EQ(f, m);
    EXPECT_EQ(b, m);
    EXPECT_EQ(w, m);
  }
  expect_close(t.pipeline_us, m * (tf + tb_full) + (p - 1) * (tf + tb - tw), "ZB-H1 pipeline time");
}

// tw <= tf keeps ZB-H1's closed form (the W passes exactly fill the tf-long cool-down gaps
// shortened by tw each); tb = 2 - tw.
INSTANTIATE_TEST_SUITE_P(Shapes, ZeroBubbleH1,
                         ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(8, 16),
                                            ::testing::Values(0.5, 1.0)));

TEST(Schedule, P2PLatencyDelaysDependencies) {
  // Two stages, one micro-batch, GPipe: F0 on stage 1 waits for stage 0's forward + link,
  // stage 0's backward waits for stage 1's backward + link.
  ScheduleSpec spec = uniform(ScheduleKind::GPipe, 2, 1, 1.0, 2.0);
  spec.p2p_latency_us = 0.25;
  spec.p2p_message_bytes = 1000;
  spec.p2p_bytes_per_us = 4000;  // 0.25 us transfer
  const Timeline t = run(spec);
  const double link = 0.5;
  expect_close(t.stages[1].ops[0].start_us, 1.0 + link, "stage 1 forward start");
  expect_close(t.stages[0].ops[1].start_us, 1.0 + link + 1.0 + 2.0 + link, "stage 0 backward start");
  expect_close(t.pipeline_us, 2 * (1.0 + 2.0) + 2 * link, "pipeline time");
}

TEST(Schedule, AllReduceWindowIsOptimizerBubbleAndEndsIteration) {
  ScheduleSpec spec = uniform(ScheduleKind::OneFOneB, 3, 6, 1.0, 2.0);
  spec.allreduce_us = 7.0;
  spec.optimizer_us = 3.0;
  const Timeline t = run(spec);
  expect_close(t.iteration_us, t.pipeline_us + 10.0, "iteration time");
  for (const auto& s : t.stages) {
    const Bubble& last = s.bubbles.back();
    EXPECT_EQ(last.kind, pfBubbleOptimizer);
    expect_close(last.start_us, t.pipeline_us, "all-reduce start");
    expect_close(last.duration_us, 7.0, "all-reduce bubble");
    expect_close(s.optimizer_bubble_us, 7.0, "optimizer bubble total");
    EXPECT_EQ(s.ops.back().type, OpType::OptimizerStep);
  }
  // Bubble share still excludes the all-reduce window.
  expect_close(t.bubble_share(), 2.0 / 8.0, "share");
}

TEST(Schedule, PerStageCostsBottleneckSetsTheSteadyState) {
  // GPipe with a slow middle stage: the pipeline time is the slow stage's m forwards and m
  // backwards plus the others' single forward/backward on either side.
  ScheduleSpec spec = uniform(ScheduleKind::GPipe, 3, 4, 1.0, 2.0);
  spec.costs[1].forward_us = 3.0;
  spec.costs[1].backward_us = 6.0;
  const Timeline t = run(spec);
  // Forwards: stage 0 F0 ends 1; stage 1 F0..F3 end 4,7,10,13; stage 2 F3 ends 14, B3 ... last
  // stage backwards: B0 at 14..16? stage 2's F0 ends 5, F1 8, F2 11, F3 14; B0..B3 14-22.
  // Stage 1 B0 starts 16 (after stage 2's B0 ends 16), B0..B3 end 22,28,34,40 (stage-bound).
  // Stage 0 B3 starts 40, ends 42.
  expect_close(t.pipeline_us, 42.0, "pipeline time");
  expect_close(t.stages[1].compute_us, 36.0, "slow stage compute");
  expect_close(t.stages[1].bubble_us, 6.0, "slow stage idle");
}

TEST(Schedule, OpOrderListsEachComputeOpOnce) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1}) {
    const int v = kind == ScheduleKind::Interleaved1F1B ? 3 : 1;
    ScheduleSpec spec = uniform(kind, 4, 8, 1.0, 2.0, v);
    std::vector<std::vector<Op>> order;
    std::string error;
    ASSERT_TRUE(stage_op_order(spec, &order, &error)) << error;
    ASSERT_EQ(order.size(), 4u);
    for (const auto& ops : order) {
      std::set<std::tuple<int, int, int>> seen;
      for (const Op& op : ops) EXPECT_TRUE(seen.insert({static_cast<int>(op.type), op.microbatch, op.chunk}).second);
      const size_t per_mb = kind == ScheduleKind::ZBH1 ? 3 : 2;
      EXPECT_EQ(ops.size(), per_mb * 8 * v) << schedule_kind_name(kind);
    }
  }
}

TEST(Schedule, InvalidSpecsNameTheValue) {
  struct Case {
    ScheduleSpec spec;
    std::string needle;
  };
  std::vector<Case> cases;
  ScheduleSpec base = uniform(ScheduleKind::OneFOneB, 4, 8, 1.0, 2.0);
  { auto s = base; s.stages = 0; cases.push_back({s, "stages must be >= 1, got 0"}); }
  { auto s = base; s.microbatches = -3; cases.push_back({s, "microbatches must be >= 1, got -3"}); }
  { auto s = base; s.chunks = 2; cases.push_back({s, "chunks must be 1 for 1f1b schedules, got 2"}); }
  { auto s = base; s.kind = ScheduleKind::Interleaved1F1B; s.chunks = 1; cases.push_back({s, "chunks >= 2, got 1"}); }
  { auto s = base; s.costs.pop_back(); cases.push_back({s, "costs has 3 entries but stages is 4"}); }
  { auto s = base; s.costs[2].forward_us = -1; cases.push_back({s, "costs[2].forward_us must be > 0, got -1"}); }
  { auto s = base; s.costs[1].backward_us = 0; cases.push_back({s, "costs[1].backward_us must be > 0, got 0"}); }
  { auto s = base; s.kind = ScheduleKind::ZBH1; s.costs[3].weight_us = 2.5; cases.push_back({s, "got 2.5"}); }
  { auto s = base; s.p2p_latency_us = -0.5; cases.push_back({s, "p2p_latency_us must be >= 0, got -0.5"}); }
  { auto s = base; s.allreduce_us = NAN; cases.push_back({s, "allreduce_us must be >= 0, got nan"}); }
  for (const auto& c : cases) {
    Timeline t;
    std::string error;
    EXPECT_FALSE(simulate(c.spec, &t, &error));
    EXPECT_NE(error.find(c.needle), std::string::npos) << "error: '" << error << "' expected: " << c.needle;
  }
  Timeline t;
  std::string error;
  EXPECT_FALSE(simulate(base, &t, &error, -1.0));
  EXPECT_NE(error.find("min_bubble_us must be >= 0, got -1"), std::string::npos) << error;
}

TEST(Schedule, MinBubbleDropsShortGaps) {
  const Timeline all = run(uniform(ScheduleKind::OneFOneB, 4, 8, 1.0, 2.0));
  Timeline some;
  std::string error;
  ASSERT_TRUE(simulate(uniform(ScheduleKind::OneFOneB, 4, 8, 1.0, 2.0), &some, &error, 1.5));
  // Stage 1: cool-down gaps of 1.0 are dropped; warm-up 1.0 dropped; 4.0 wait and 2.0 drain kept.
  EXPECT_EQ(all.stages[1].bubbles.size(), 5u);
  ASSERT_EQ(some.stages[1].bubbles.size(), 2u);
  expect_close(some.stages[1].bubbles[0].duration_us, 4.0, "wait");
  expect_close(some.stages[1].bubbles[1].duration_us, 2.0, "drain");
  EXPECT_EQ(some.stages[1].bubbles[1].index_in_iteration, 1);
}

TEST(Schedule, ParseKindNames) {
  ScheduleKind k;
  ASSERT_TRUE(parse_schedule_kind("GPipe", &k));
  EXPECT_EQ(k, ScheduleKind::GPipe);
  ASSERT_TRUE(parse_schedule_kind("1f1b", &k));
  EXPECT_EQ(k, ScheduleKind::OneFOneB);
  ASSERT_TRUE(parse_schedule_kind("interleaved", &k));
  EXPECT_EQ(k, ScheduleKind::Interleaved1F1B);
  ASSERT_TRUE(parse_schedule_kind("zbh1", &k));
  EXPECT_EQ(k, ScheduleKind::ZBH1);
  EXPECT_FALSE(parse_schedule_kind("2f2b", &k));
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1}) {
    ScheduleKind back;
    ASSERT_TRUE(parse_schedule_kind(schedule_kind_name(kind), &back));
    EXPECT_EQ(back, kind);
  }
}

}  // namespace
}  // namespace pipefill::schedule

namespace pipefill::schedule {
namespace {

// Invariants on non-uniform costs with p2p latency, every schedule: ops of a stage never
// overlap, every op starts after its dependency (+ link when it crosses stages), and each
// stage's compute plus bubbles covers [0, T_pipe] exactly.
TEST(Schedule, InvariantsHoldForNonUniformCostsAndLatency) {
  const double link = 0.3;
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1}) {
    for (int p : {2, 3, 5}) {
      for (int mult : {0, 1, 2, 3}) {
        if (kind == ScheduleKind::Interleaved1F1B && mult == 0) continue;  // m = 1 is not a multiple of p
        ScheduleSpec spec;
        spec.kind = kind;
        spec.stages = p;
        spec.microbatches = p * mult + (kind == ScheduleKind::Interleaved1F1B ? 0 : 1);
        spec.chunks = kind == ScheduleKind::Interleaved1F1B ? 2 : 1;
        spec.p2p_latency_us = link;
        for (int s = 0; s < p; ++s) {
          StageCosts c;
          c.forward_us = 1.0 + 0.37 * s;
          c.backward_us = 2.0 + 0.21 * ((s * 7) % 3);
          c.weight_us = 0.5 + 0.1 * s;
          spec.costs.push_back(c);
        }
        Timeline t;
        std::string error;
        SCOPED_TRACE(std::string(schedule_kind_name(kind)) + " p=" + std::to_string(p) + " m=" +
                     std::to_string(spec.microbatches));
        ASSERT_TRUE(simulate(spec, &t, &error)) << error;
        const int v = spec.chunks;
        const int vs_count = p * v;
        // End times by (type, virtual stage, microbatch) for dependency checks.
        std::map<std::tuple<int, int, int>, double> ends;
        for (int s = 0; s < p; ++s)
          for (const Op& op : t.stages[s].ops)
            if (op.microbatch >= 0) ends[{static_cast<int>(op.type), op.chunk * p + s, op.microbatch}] = op.end_us;
        for (int s = 0; s < p; ++s) {
          const auto& st = t.stages[s];
          double prev_end = 0.0, covered = 0.0;
          for (const Op& op : st.ops) {
            if (op.type == OpType::AllReduce || op.type == OpType::OptimizerStep) continue;
            EXPECT_GE(op.start_us, prev_end - 1e-9);
            prev_end = op.end_us;
            covered += op.end_us - op.start_us;
            const int vs = op.chunk * p + s;
            const OpType back = kind == ScheduleKind::ZBH1 ? OpType::BackwardInput : OpType::Backward;
            if (op.type == OpType::Forward && vs > 0) {
              const double dep = ends.at({static_cast<int>(OpType::Forward), vs - 1, op.microbatch});
              EXPECT_GE(op.start_us, dep + ((vs - 1) % p != s ? link : 0.0) - 1e-9);
            }
            if (op.type == back && vs < vs_count - 1) {
              const double dep = ends.at({static_cast<int>(back), vs + 1, op.microbatch});
              EXPECT_GE(op.start_us, dep + ((vs + 1) % p != s ? link : 0.0) - 1e-9);
            }
            if (op.type == OpType::BackwardWeight)
              EXPECT_GE(op.start_us, ends.at({static_cast<int>(OpType::BackwardInput), vs, op.microbatch}) - 1e-9);
          }
          for (const Bubble& b : st.bubbles) covered += b.duration_us;
          EXPECT_NEAR(covered, t.pipeline_us, 1e-9 * t.pipeline_us);
          EXPECT_NEAR(st.compute_us + st.bubble_us, t.pipeline_us, 1e-9 * t.pipeline_us);
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipefill::schedule
