// The schedules PyTorch and Megatron-LM run beyond GPipe/1F1B/ZB-H1: interleaved 1F1B with
// m % p != 0 (micro-batch groups / rounds), interleaved zero bubble (ZB1P), looped BFS, ZB-V and
// DualPipeV. Oracles, none taken from our own output:
//  - op orders: PyTorch's published CSV artifacts (tests/schedule/data, DualPipeV 4x10 and ZB1P
//    2x2x8), Megatron's documented schedule table (PP2 N3 M5 VP2), a re-derivation of PyTorch's
//    per-stage counter formulation of the interleaved schedules (different from the library's
//    Megatron-table formulation), and op orders hand-transcribed from PyTorch's
//    ScheduleLoopedBFS / ScheduleZBVZeroBubble for small shapes;
//  - timing: the independent relaxation oracle (schedule_oracle.hpp) on non-uniform costs
//    with p2p latency, for every kind over a grid of shapes, with its dependency checks;
//  - closed forms (uniform costs): interleaved and looped BFS T = (t_f+t_b)(max(m,p) +
//    (min(m,p)-1)/v); ZB1P per-stage bubble (p-1)(F + B - 2W) per chunk (DeepSeek's DualPipe
//    README table); ZB-V / DualPipeV reach the lower bound (p-1) F when F = I = W; memory peaks.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "schedule/orders.hpp"
#include "schedule/pytorch_csv.hpp"
#include "schedule/schedule.hpp"
#include "schedule_oracle.hpp"

namespace pipefill::schedule {
namespace {

constexpr double kRel = 1e-9;

void expect_close(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual, expected, kRel * std::max(1.0, std::abs(expected))) << what;
}

ScheduleSpec uniform(ScheduleKind kind, int p, int m, int v, double tf, double tb, double tw = 1.0, int group = 0) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.stages = p;
  spec.microbatches = m;
  spec.chunks = v;
  spec.microbatch_group_size = group;
  StageCosts c;
  c.forward_us = tf;
  c.backward_us = tb;
  c.weight_us = tw;
  spec.costs.assign(static_cast<size_t>(p), c);
  return spec;
}

std::vector<std::vector<Op>> order_of(const ScheduleSpec& spec) {
  std::vector<std::vector<Op>> order;
  std::string error;
  EXPECT_TRUE(stage_op_order(spec, &order, &error)) << error;
  return order;
}

std::string letter(OpType t) {
  switch (t) {
    case OpType::Forward: return "F";
    case OpType::Backward: return "B";
    case OpType::BackwardInput: return "I";
    case OpType::BackwardWeight: return "W";
    default: return "?";
  }
}

// One stage's ops as PyTorch action strings, overlapped pairs as "(a;b)OVERLAP_F_B" (written
// here, not with the library's formatter).
std::vector<std::string> actions(const std::vector<Op>& ops) {
  std::vector<std::string> out;
  std::string group;
  for (const Op& op : ops) {
    const std::string a = std::to_string(op.virtual_stage) + letter(op.type) + std::to_string(op.microbatch);
    if (!group.empty()) {
      group += ";" + a;
      if (!op.overlapped_with_next) {
        out.push_back(group + ")OVERLAP_F_B");
        group.clear();
      }
    } else if (op.overlapped_with_next) {
      group = "(" + a;
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// A PyTorch CSV artifact as rows of non-empty fields (idle steps dropped: not ops).
std::vector<std::vector<std::string>> read_artifact(const std::string& name) {
  std::ifstream in(std::string(PIPEFILL_SOURCE_DIR) + "/tests/schedule/data/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<std::string> row;
    std::stringstream ss(line);
    std::string field;
    while (std::getline(ss, field, ',')) if (!field.empty()) row.push_back(field);
    rows.push_back(row);
  }
  return rows;
}

std::function<int(int)> placement_of(const ScheduleSpec& spec) {
  const int p = spec.stages;
  if (spec.kind == ScheduleKind::ZBV || spec.kind == ScheduleKind::DualPipeV)
    return [p](int vs) { return oracle::v_stage(p, vs); };
  return [p](int vs) { return oracle::looped_stage(p, vs); };
}

// simulate() against the oracle: same op start/end times, valid dependencies.
void expect_matches_oracle(const ScheduleSpec& spec) {
  SCOPED_TRACE(fmt::format("{} p={} m={} v={} g={}", schedule_kind_name(spec.kind), spec.stages, spec.microbatches,
                           spec.chunks, spec.microbatch_group_size));
  Timeline t;
  std::string error;
  ASSERT_TRUE(simulate(spec, &t, &error)) << error;
  std::vector<std::vector<Op>> order(t.stages.size());
  for (size_t s = 0; s < t.stages.size(); ++s)
    for (const Op& op : t.stages[s].ops)
      if (op.microbatch >= 0) order[s].push_back(op);
  const auto placement = placement_of(spec);
  for (size_t vs = 0; vs < t.stage_of_virtual.size(); ++vs)
    ASSERT_EQ(t.stage_of_virtual[vs], placement(static_cast<int>(vs))) << "virtual stage " << vs;
  const oracle::Result r = oracle::run(spec, order, placement);
  ASSERT_TRUE(r.ok) << r.error;
  expect_close(t.pipeline_us, r.pipeline_us, "pipeline time");
  for (size_t s = 0; s < order.size(); ++s)
    for (size_t i = 0; i < order[s].size(); ++i) {
      ASSERT_NEAR(order[s][i].start_us, r.times[s][i].start, 1e-9 * r.pipeline_us) << "stage " << s << " op " << i;
      ASSERT_NEAR(order[s][i].end_us, r.times[s][i].end, 1e-9 * r.pipeline_us) << "stage " << s << " op " << i;
    }
  // Compute plus bubbles cover [0, T_pipe] on every stage.
  for (const auto& st : t.stages) expect_close(st.compute_us + st.bubble_us, t.pipeline_us, "coverage");
}

ScheduleSpec non_uniform(ScheduleKind kind, int p, int m, int v, int group = 0) {
  ScheduleSpec spec = uniform(kind, p, m, v, 1.0, 2.0, 0.5, group);
  for (int s = 0; s < p; ++s) {
    spec.costs[s].forward_us = 1.0 + 0.37 * s;
    spec.costs[s].backward_us = 2.0 + 0.21 * ((s * 7) % 3);
    spec.costs[s].weight_us = 0.5 + 0.1 * s;
  }
  spec.p2p_latency_us = 0.3;
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Op-order oracles.

TEST(PyTorchArtifacts, DualPipeVFourRanksTenMicrobatchesMatchesPyTorch) {
  const auto expected = read_artifact("dualpipev_4rank_10mb.csv");
  ASSERT_EQ(expected.size(), 4u);
  const auto order = order_of(uniform(ScheduleKind::DualPipeV, 4, 10, 2, 1.0, 2.0));
  ASSERT_EQ(order.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(actions(order[s]), expected[s]) << "rank " << s;
}

TEST(PyTorchArtifacts, InterleavedZeroBubbleTwoRanksTwoChunksMatchesPyTorch) {
  const auto expected = read_artifact("zb1p_2rank_2stagep_compute.csv");
  ASSERT_EQ(expected.size(), 2u);
  const auto order = order_of(uniform(ScheduleKind::InterleavedZB, 2, 8, 2, 1.0, 2.0));
  for (int s = 0; s < 2; ++s) EXPECT_EQ(actions(order[s]), expected[s]) << "rank " << s;
}

TEST(Megatron, ScheduleTableMatchesTheDocumentedExample) {
  // megatron/core/pipeline_parallel/schedules.py, get_schedule_table's comment: "the tunable
  // schedule table for PP2 N3M5 with VP2": microbatch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1.
  std::vector<int> mb, chunk;
  detail::schedule_table(5, 2, 3, &mb, &chunk);
  EXPECT_EQ(mb, (std::vector<int>{0, 1, 2, 0, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(chunk, (std::vector<int>{0, 0, 0, 1, 1, 1, 0, 0, 1, 1}));
  // The interleaved schedule with that group runs its forwards in the table's order.
  const auto order = order_of(uniform(ScheduleKind::Interleaved1F1B, 2, 5, 2, 1.0, 2.0, 1.0, 3));
  for (const auto& ops : order) {
    std::vector<int> fmb, fchunk;
    for (const Op& op : ops)
      if (op.type == OpType::Forward) fmb.push_back(op.microbatch), fchunk.push_back(op.chunk);
    EXPECT_EQ(fmb, mb);
    EXPECT_EQ(fchunk, chunk);
  }
}

// PyTorch's formulation of ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble
// (_get_1f1b_rank_ops): per-stage-index counters give the micro-batch; the stage index of the
// k-th forward is ((k / mpr) % v) p + rank, of the j-th backward (v - 1 - (j / mpr) % v) p + rank,
// with rounds = max(1, m / p) and mpr = m / rounds. Written from PyTorch's code, not from ours.
std::vector<std::string> pytorch_interleaved(int p, int m, int v, int rank, bool zero_bubble) {
  const int rounds = std::max(1, m / p), mpr = m / rounds;
  const int total = m * v;
  int warmup = (v - 1) * mpr + (zero_bubble ? 1 : 2) * (p - 1 - rank);
  warmup = std::min(warmup, total);
  std::map<int, int> fwd_count, bwd_count, w_count;
  std::vector<std::string> out;
  std::vector<int> backward_steps;
  int weights = 0;
  auto fwd_stage = [&](int step) { return ((step / mpr) % v) * p + rank; };
  auto bwd_stage = [&](int step) { return (v - 1 - ((step - warmup) / mpr) % v) * p + rank; };
  auto emit = [&](int stage, const char* kind, std::map<int, int>& counter) {
    out.push_back(std::to_string(stage) + kind + std::to_string(counter[stage]++));
  };
  for (int op = 0; op < warmup + total; ++op) {
    if (op < warmup) {
      emit(fwd_stage(op), "F", fwd_count);
      continue;
    }
    if (op < total) emit(fwd_stage(op), "F", fwd_count);
    emit(bwd_stage(op), zero_bubble ? "I" : "B", bwd_count);
    backward_steps.push_back(op);
    if (zero_bubble && op - warmup >= rank) emit(bwd_stage(backward_steps[weights++]), "W", w_count);
  }
  while (zero_bubble && weights < static_cast<int>(backward_steps.size()))
    emit(bwd_stage(backward_steps[weights++]), "W", w_count);
  return out;
}

TEST(PyTorchFormulation, InterleavedOneFOneBWithRoundsMatches) {
  // Includes m % p != 0 (rounds), m < p (one round), and m == p (no all-forward special case).
  for (auto [p, m, v] : std::vector<std::tuple<int, int, int>>{{4, 10, 2}, {4, 6, 2}, {4, 3, 2}, {4, 4, 2}, {2, 6, 3},
                                                              {3, 8, 2}, {8, 12, 2}, {4, 8, 4}, {2, 1, 2}}) {
    const auto order = order_of(uniform(ScheduleKind::Interleaved1F1B, p, m, v, 1.0, 2.0));
    for (int s = 0; s < p; ++s)
      EXPECT_EQ(actions(order[s]), pytorch_interleaved(p, m, v, s, false)) << "p=" << p << " m=" << m << " v=" << v
                                                                           << " rank " << s;
  }
}

TEST(PyTorchFormulation, InterleavedZeroBubbleMatches) {
  for (auto [p, m, v] : std::vector<std::tuple<int, int, int>>{{2, 8, 2}, {4, 10, 2}, {4, 4, 2}, {4, 3, 2}, {3, 9, 3},
                                                              {4, 8, 1}, {8, 16, 2}}) {
    const auto order = order_of(uniform(ScheduleKind::InterleavedZB, p, m, v, 1.0, 2.0, 0.5));
    for (int s = 0; s < p; ++s)
      EXPECT_EQ(actions(order[s]), pytorch_interleaved(p, m, v, s, true)) << "p=" << p << " m=" << m << " v=" << v
                                                                          << " rank " << s;
  }
}

TEST(PyTorchTranscription, LoopedBfsTwoRanksTwoChunksThreeMicrobatches) {
  // ScheduleLoopedBFS._calculate_single_rank_operations, rank 0 holds stages 0 and 2, rank 1
  // stages 1 and 3: all forwards stage by stage, then backwards of the stages in reverse, the
  // micro-batches in reverse.
  const auto order = order_of(uniform(ScheduleKind::LoopedBFS, 2, 3, 2, 1.0, 2.0));
  EXPECT_EQ(actions(order[0]), (std::vector<std::string>{"0F0", "0F1", "0F2", "2F0", "2F1", "2F2", "2B2", "2B1", "2B0",
                                                          "0B2", "0B1", "0B0"}));
  EXPECT_EQ(actions(order[1]), (std::vector<std::string>{"1F0", "1F1", "1F2", "3F0", "3F1", "3F2", "3B2", "3B1", "3B0",
                                                          "1B2", "1B1", "1B0"}));
}

TEST(PyTorchTranscription, ZbvTwoRanksFourMicrobatches) {
  // ScheduleZBVZeroBubble._calculate_single_rank_operations executed by hand for 2 ranks and
  // 4 micro-batches (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2).
  const auto order = order_of(uniform(ScheduleKind::ZBV, 2, 4, 2, 1.0, 2.0));
  EXPECT_EQ(actions(order[0]),
            (std::vector<std::string>{"0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "0F3", "0I0", "0W0",
                                      "3F2", "3I2", "3W2", "0I1", "0W1", "3F3", "3I3", "3W3", "0I2", "0W2", "0I3", "0W3"}));
  EXPECT_EQ(actions(order[1]),
            (std::vector<std::string>{"1F0", "2F0", "1F1", "2F1", "2I0", "2W0", "1F2", "1I0", "1W0", "2F2", "2I1", "2W1",
                                      "1F3", "1I1", "1W1", "2F3", "2I2", "2W2", "1I2", "2I3", "1I3", "1W2", "2W3", "1W3"}));
}

// ---------------------------------------------------------------------------------------------
// The independent timing oracle, non-uniform costs and p2p latency, every kind.

TEST(Oracle, EveryKindMatchesTheIndependentTimelineOnAGridOfShapes) {
  int checked = 0;
  for (int p : {1, 2, 3, 4, 5}) {
    for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 10, 12}) {
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
        expect_matches_oracle(non_uniform(kind, p, m, 1));
        ++checked;
      }
      for (int v : {1, 2, 3}) {
        for (ScheduleKind kind : {ScheduleKind::Interleaved1F1B, ScheduleKind::InterleavedZB, ScheduleKind::LoopedBFS}) {
          if (kind == ScheduleKind::Interleaved1F1B && v == 1) continue;
          int group = 0;
          std::string why;
          if (!interleaved_group_size(non_uniform(kind, p, m, v), &group, &why) && kind != ScheduleKind::LoopedBFS) continue;
          expect_matches_oracle(non_uniform(kind, p, m, v));
          ++checked;
        }
      }
      expect_matches_oracle(non_uniform(ScheduleKind::ZBV, p, m, 2));
      ++checked;
      if (m >= 2 * p) {
        expect_matches_oracle(non_uniform(ScheduleKind::DualPipeV, p, m, 2));
        ++checked;
      }
    }
  }
  // Megatron micro-batch groups with a remainder group >= p (m % g != 0).
  for (auto [p, m, g] : std::vector<std::tuple<int, int, int>>{{2, 5, 3}, {4, 10, 6}, {3, 11, 4}, {4, 9, 5}, {4, 13, 9}}) {
    expect_matches_oracle(non_uniform(ScheduleKind::Interleaved1F1B, p, m, 2, g));
    expect_matches_oracle(non_uniform(ScheduleKind::InterleavedZB, p, m, 2, g));
    checked += 2;
  }
  EXPECT_GT(checked, 500);
}

TEST(Oracle, ReportsItsOwnCheckFailures) {
  // The oracle is not vacuous: a swapped pair (backward before its forward) and a missing op
  // are caught.
  ScheduleSpec spec = uniform(ScheduleKind::OneFOneB, 2, 2, 1, 1.0, 2.0);
  auto order = order_of(spec);
  auto placement = placement_of(spec);
  ASSERT_TRUE(oracle::run(spec, order, placement).ok);
  auto broken = order;
  broken[1].pop_back();
  EXPECT_FALSE(oracle::run(spec, broken, placement).ok);
  broken = order;
  std::swap(broken[0][0], broken[0][1]);  // stage 0: F1 first, then F0 — still valid, both forwards
  EXPECT_TRUE(oracle::run(spec, broken, placement).ok);
  broken = order;
  // Stage 1 (last): F0 B0 F1 B1 -> B0 F0 ...: backward before its forward deadlocks.
  std::swap(broken[1][0], broken[1][1]);
  const auto r = oracle::run(spec, broken, placement);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
}

// ---------------------------------------------------------------------------------------------
// Closed forms (uniform costs, zero p2p).

TEST(ClosedForm, InterleavedAndLoopedBfsPipelineTime) {
  // Interleaved 1F1B (Narayanan et al. 2021) and looped BFS: T = m(t_f+t_b) + (p-1)(t_f+t_b)/v
  // for m >= p — the stages are busy but for the (p-1) per-chunk hops at either end. For
  // m < p the first micro-batch's round trip through the p v chunks, p (t_f+t_b), bounds the
  // iteration and each further micro-batch adds one chunk's (t_f+t_b)/v:
  // T = (t_f+t_b)(max(m,p) + (min(m,p)-1)/v). Includes m % p != 0 (PyTorch's rounds).
  const double tf = 1.0, tb = 2.0;
  int cases = 0;
  for (ScheduleKind kind : {ScheduleKind::Interleaved1F1B, ScheduleKind::LoopedBFS}) {
    for (int p : {2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 5, 6, 8, 10, 12, 16}) {
        for (int v : {2, 3, 4}) {
          ScheduleSpec spec = uniform(kind, p, m, v, tf, tb);
          int g = 0;
          std::string why;
          if (kind == ScheduleKind::Interleaved1F1B && !interleaved_group_size(spec, &g, &why)) continue;
          Timeline t;
          std::string error;
          ASSERT_TRUE(simulate(spec, &t, &error)) << error;
          const double expected = (tf + tb) * (std::max(m, p) + (std::min(m, p) - 1) / static_cast<double>(v));
          expect_close(t.pipeline_us, expected,
                       fmt::format("{} p={} m={} v={}", schedule_kind_name(kind), p, m, v));
          for (const auto& st : t.stages) expect_close(st.compute_us, m * (tf + tb), "stage compute");
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 150);
}

TEST(ClosedForm, InterleavedWithRemainderGroupKeepsTheInterleavedBubble) {
  // Megatron's groups with a remainder group >= p: the same (p-1)(t_f+t_b)/v bubble per stage.
  for (auto [p, m, g, v] : std::vector<std::tuple<int, int, int, int>>{{2, 5, 3, 2}, {4, 10, 6, 2}, {4, 9, 5, 3}, {3, 11, 4, 2}}) {
    Timeline t;
    std::string error;
    ASSERT_TRUE(simulate(uniform(ScheduleKind::Interleaved1F1B, p, m, v, 1.0, 2.0, 1.0, g), &t, &error)) << error;
    for (const auto& st : t.stages) expect_close(st.bubble_us, (p - 1) * 3.0 / v, fmt::format("p={} m={} g={}", p, m, g));
  }
}

TEST(ClosedForm, InterleavedZeroBubbleBubbleIsPMinus1TimesFPlusBMinus2W) {
  // DeepSeek's DualPipe README, "Pipeline Bubbles and Memory Usage Comparison": ZB1P bubble
  // (PP-1)(F + B - 2W), F / B / W the per-chunk forward, full backward and weight-gradient
  // times. Here per chunk F = t_f/v, B = t_b/v, W = t_w/v; m >= p, W <= F.
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, p + 2, 2 * p, 3 * p + 1}) {
      for (int v : {1, 2, 3}) {
        for (double tw : {0.5, 1.0}) {
          ScheduleSpec spec = uniform(ScheduleKind::InterleavedZB, p, m, v, 1.0, 2.0, tw);
          int g = 0;
          std::string why;
          if (!interleaved_group_size(spec, &g, &why)) continue;
          Timeline t;
          std::string error;
          ASSERT_TRUE(simulate(spec, &t, &error)) << error;
          const double F = 1.0 / v, B = 2.0 / v, W = tw / v;
          for (const auto& st : t.stages)
            expect_close(st.bubble_us, (p - 1) * (F + B - 2 * W), fmt::format("p={} m={} v={} tw={}", p, m, v, tw));
        }
      }
    }
  }
}

TEST(ClosedForm, ZbvAndDualPipeVReachTheLowerBoundWhenForwardInputAndWeightAreEqual) {
  // The last stage cannot start before the first micro-batch's chunk-0 forward has crossed the
  // p-1 stages before it: every stage's bubble is at least (p-1) F (the barrier at the pipeline
  // end makes every stage span T_pipe). PyTorch's ScheduleZBVZeroBubble docstring: the ZB-V
  // schedule has the zero-bubble property when time forward == backward input == backward
  // weights; in this model that is the lower bound: bubble (p-1) F on every stage, for
  // m >= 2p - 1 (ZB-V) and m >= 2p (DualPipeV). Per chunk F = I = W = 1 (t_f = 2, t_b = 4, t_w = 2).
  for (int p : {1, 2, 3, 4, 6, 8}) {
    for (int extra : {0, 1, 5}) {
      for (ScheduleKind kind : {ScheduleKind::ZBV, ScheduleKind::DualPipeV}) {
        const int m = (kind == ScheduleKind::ZBV ? 2 * p - 1 : 2 * p) + extra;
        Timeline t;
        std::string error;
        ASSERT_TRUE(simulate(uniform(kind, p, m, 2, 2.0, 4.0, 2.0), &t, &error)) << error;
        const std::string what = fmt::format("{} p={} m={}", schedule_kind_name(kind), p, m);
        expect_close(t.pipeline_us, m * 6.0 + (p - 1) * 1.0, what);
        for (const auto& st : t.stages) expect_close(st.bubble_us, (p - 1) * 1.0, what);
      }
    }
  }
}

TEST(ClosedForm, MemoryPeaksOfTheVSchedules) {
  // ZB-V keeps 1F1B's peak activation memory (Qi et al. 2024, section 6): p micro-batches' worth,
  // i.e. 2p half-size chunk activations, on the busiest stage (m >= 2p - 1). DualPipeV holds
  // one chunk more (2p + 1): after its 2p warm-up forwards (steps 1-3 keep the count at 2p,
  // each W releasing what the next F adds), the first overlapped F&B forwards before its
  // backward releases — DualPipe's "PP + 1" activations with PP counted in chunks.
  for (int p : {1, 2, 3, 4, 8}) {
    for (int extra : {0, 3}) {
      Timeline t;
      std::string error;
      ASSERT_TRUE(simulate(uniform(ScheduleKind::ZBV, p, 2 * p - 1 + extra, 2, 1.0, 2.0, 0.5), &t, &error)) << error;
      int peak = 0;
      for (const auto& st : t.stages) {
        EXPECT_LE(st.peak_in_flight, 2 * p);
        peak = std::max(peak, st.peak_in_flight);
      }
      EXPECT_EQ(peak, 2 * p) << "zbv p=" << p;
      ASSERT_TRUE(simulate(uniform(ScheduleKind::DualPipeV, p, 2 * p + extra, 2, 1.0, 2.0, 0.5), &t, &error)) << error;
      for (const auto& st : t.stages) EXPECT_EQ(st.peak_in_flight, 2 * p + 1) << "dualpipev p=" << p;
    }
  }
}

TEST(ClosedForm, MEqualsPUsesTheNormalWarmup) {
  // Current Megatron-LM and PyTorch: warm-up min(2(p-s-1) + (v-1)p, m v) also for m == p (older
  // Megatron ran all m v forwards first). Stage s's peak = its warm-up + 1 (the first steady
  // forward), capped at m v.
  const int p = 4, v = 2;
  Timeline t;
  std::string error;
  ASSERT_TRUE(simulate(uniform(ScheduleKind::Interleaved1F1B, p, p, v, 1.0, 2.0), &t, &error)) << error;
  for (int s = 0; s < p; ++s) {
    const int warmup = std::min(2 * (p - s - 1) + (v - 1) * p, p * v);
    EXPECT_EQ(t.stages[s].peak_in_flight, std::min(warmup + 1, p * v)) << s;
    // The first backward comes right after the warm-up forwards and one steady forward.
    int forwards_before_backward = 0;
    for (const Op& op : t.stages[s].ops) {
      if (op.type != OpType::Forward) break;
      ++forwards_before_backward;
    }
    EXPECT_EQ(forwards_before_backward, std::min(warmup + 1, p * v)) << s;
  }
  // Never slower than the all-forward order with non-uniform costs: compare against the old
  // order built by hand (all m v forwards, then all backwards in table order).
  ScheduleSpec spec = non_uniform(ScheduleKind::Interleaved1F1B, p, p, v);
  Timeline now;
  ASSERT_TRUE(simulate(spec, &now, &error)) << error;
  auto old_order = order_of(spec);
  for (auto& ops : old_order) {
    std::stable_partition(ops.begin(), ops.end(), [](const Op& op) { return op.type == OpType::Forward; });
  }
  const oracle::Result old = oracle::run(spec, old_order, placement_of(spec));
  ASSERT_TRUE(old.ok) << old.error;
  EXPECT_LE(now.pipeline_us, old.pipeline_us + 1e-9);
}

// ---------------------------------------------------------------------------------------------
// Validation.

TEST(Kinds, InvalidSpecsNameTheValue) {
  struct Case {
    ScheduleSpec spec;
    std::string needle;
  };
  std::vector<Case> cases = {
      {uniform(ScheduleKind::ZBV, 4, 8, 3, 1, 2, 0.5), "exactly 2 chunks per stage (a V), got chunks = 3"},
      {uniform(ScheduleKind::DualPipeV, 4, 7, 2, 1, 2, 0.5), "dualpipev needs microbatches (7) >= 2 x stages (4)"},
      {uniform(ScheduleKind::Interleaved1F1B, 4, 9, 2, 1, 2), "microbatches (9) to be a multiple of the rounds"},
      {uniform(ScheduleKind::Interleaved1F1B, 4, 10, 2, 1, 2, 1, 3), "microbatch_group_size (3) must be in [stages = 4"},
      {uniform(ScheduleKind::Interleaved1F1B, 4, 10, 2, 1, 2, 1, 4), "% microbatch_group_size (4) = 2 must be 0 or >= stages"},
      {uniform(ScheduleKind::OneFOneB, 4, 10, 1, 1, 2, 1, 4), "microbatch_group_size applies to interleaved"},
      {uniform(ScheduleKind::ZBV, 4, 8, 2, 1, 2, 2.0), "weight_us must be in (0, backward_us=2) for zbv"},
      {uniform(ScheduleKind::LoopedBFS, 4, 8, 0, 1, 2), "looped-bfs needs chunks >= 1, got 0"},
      {uniform(ScheduleKind::Interleaved1F1B, 4096, 1 << 14, 1 << 12, 1, 2), "exceed the schedule generator's limit"},
  };
  for (const auto& c : cases) {
    Timeline t;
    std::string error;
    EXPECT_FALSE(simulate(c.spec, &t, &error)) << c.needle;
    EXPECT_NE(error.find(c.needle), std::string::npos) << "error: '" << error << "' expected: " << c.needle;
  }
}

TEST(Kinds, NamesRoundTripAndAcceptPyTorchSpellings) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1,
                            ScheduleKind::ZBV, ScheduleKind::InterleavedZB, ScheduleKind::LoopedBFS, ScheduleKind::DualPipeV}) {
    ScheduleKind back;
    ASSERT_TRUE(parse_schedule_kind(schedule_kind_name(kind), &back)) << schedule_kind_name(kind);
    EXPECT_EQ(back, kind);
  }
  // PyTorch's get_schedule_class names.
  const std::map<std::string, ScheduleKind> pytorch = {
      {"Interleaved1F1B", ScheduleKind::Interleaved1F1B}, {"LoopedBFS", ScheduleKind::LoopedBFS},
      {"InterleavedZeroBubble", ScheduleKind::InterleavedZB}, {"ZBVZeroBubble", ScheduleKind::ZBV},
      {"DualPipeV", ScheduleKind::DualPipeV}, {"GPipe", ScheduleKind::GPipe}, {"1F1B", ScheduleKind::OneFOneB}};
  for (const auto& [name, kind] : pytorch) {
    ScheduleKind k;
    ASSERT_TRUE(parse_schedule_kind(name, &k)) << name;
    EXPECT_EQ(k, kind) << name;
  }
  ScheduleKind k;
  EXPECT_FALSE(parse_schedule_kind("custom", &k));  // only via a CSV
  EXPECT_FALSE(parse_schedule_kind("2f2b", &k));
}

TEST(Kinds, ComputeOpCountIsWhatTheOrderHolds) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBV, ScheduleKind::InterleavedZB,
                            ScheduleKind::LoopedBFS}) {
    const int v = kind == ScheduleKind::GPipe ? 1 : 2;
    const ScheduleSpec spec = uniform(kind, 4, 8, v, 1, 2, 0.5);
    size_t n = 0;
    for (const auto& ops : order_of(spec)) n += ops.size();
    EXPECT_EQ(compute_op_count(spec), n) << schedule_kind_name(kind);
  }
  // DualPipeV mixes full B and I+W: the count is an upper bound.
  const ScheduleSpec d = uniform(ScheduleKind::DualPipeV, 4, 10, 2, 1, 2, 0.5);
  size_t n = 0;
  for (const auto& ops : order_of(d)) n += ops.size();
  EXPECT_GE(compute_op_count(d), n);
  ScheduleSpec huge;
  huge.kind = ScheduleKind::Interleaved1F1B;
  huge.stages = huge.microbatches = huge.chunks = 1 << 30;
  EXPECT_EQ(compute_op_count(huge), UINT64_MAX);
}

}  // namespace
}  // namespace pipefill::schedule
