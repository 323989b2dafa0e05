// PyTorch CSV schedule import: PyTorch's own artifacts load and time exactly like the
// generated schedules they came from; the grammar of _Action.from_str (F/I/B/W, comm and FSDP
// actions skipped, OVERLAP_F_B groups, idle fields); every structural error is refused with
// the line, field and action named; export -> import round trips.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "schedule/pytorch_csv.hpp"
#include "schedule/schedule.hpp"
#include "schedule_oracle.hpp"

namespace pipefill::schedule {
namespace {

std::string artifact(const std::string& name) { return std::string(PIPEFILL_SOURCE_DIR) + "/tests/schedule/data/" + name; }

ScheduleSpec uniform(ScheduleKind kind, int p, int m, int v) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.stages = p;
  spec.microbatches = m;
  spec.chunks = v;
  StageCosts c;
  c.forward_us = 1.0;
  c.backward_us = 2.5;
  c.weight_us = 0.75;
  spec.costs.assign(static_cast<size_t>(p), c);
  spec.p2p_latency_us = 0.2;
  return spec;
}

ScheduleSpec from_csv(const CustomSchedule& c, const ScheduleSpec& costs_like) {
  ScheduleSpec spec = costs_like;
  use_custom_schedule(&spec, std::make_shared<CustomSchedule>(c));
  return spec;
}

void expect_same_timeline(const Timeline& a, const Timeline& b) {
  ASSERT_EQ(a.stages.size(), b.stages.size());
  EXPECT_NEAR(a.pipeline_us, b.pipeline_us, 1e-9 * a.pipeline_us);
  for (size_t s = 0; s < a.stages.size(); ++s) {
    ASSERT_EQ(a.stages[s].ops.size(), b.stages[s].ops.size()) << s;
    for (size_t i = 0; i < a.stages[s].ops.size(); ++i) {
      EXPECT_EQ(a.stages[s].ops[i].type, b.stages[s].ops[i].type);
      EXPECT_EQ(a.stages[s].ops[i].microbatch, b.stages[s].ops[i].microbatch);
      EXPECT_EQ(a.stages[s].ops[i].virtual_stage, b.stages[s].ops[i].virtual_stage);
      EXPECT_NEAR(a.stages[s].ops[i].start_us, b.stages[s].ops[i].start_us, 1e-9 * a.pipeline_us);
    }
    EXPECT_EQ(a.stages[s].bubbles.size(), b.stages[s].bubbles.size());
    EXPECT_NEAR(a.stages[s].bubble_us, b.stages[s].bubble_us, 1e-9 * a.pipeline_us);
  }
}

TEST(PyTorchCsv, DualPipeVArtifactLoadsWithVPlacementAndTimesLikeTheGenerator) {
  CustomSchedule c;
  std::string error;
  CsvStats stats;
  ASSERT_TRUE(load_pytorch_csv(artifact("dualpipev_4rank_10mb.csv"), &c, &error, &stats)) << error;
  EXPECT_EQ(c.stages, 4);
  EXPECT_EQ(c.chunks, 2);
  EXPECT_EQ(c.microbatches, 10);
  // V placement read from the actions: rank r holds stages r and 7 - r.
  for (int vs = 0; vs < 8; ++vs) EXPECT_EQ(c.stage_of_virtual[vs], vs < 4 ? vs : 7 - vs) << vs;
  for (int vs = 0; vs < 8; ++vs) EXPECT_EQ(c.chunk_of_virtual[vs], vs < 4 ? 0 : 1) << vs;
  // 4 ranks x 2 stages x 10 micro-batches: 80 F + (B or I+W) each: count the file's actions by
  // hand: 80 F, 80 backward (B or I), and one W per I.
  size_t f = 0, b = 0, i = 0, w = 0, overlapped = 0;
  for (const auto& ops : c.order)
    for (const Op& op : ops) {
      f += op.type == OpType::Forward;
      b += op.type == OpType::Backward;
      i += op.type == OpType::BackwardInput;
      w += op.type == OpType::BackwardWeight;
      overlapped += op.overlapped_with_next;
    }
  EXPECT_EQ(f, 80u);
  EXPECT_EQ(b + i, 80u);
  EXPECT_EQ(i, w);
  EXPECT_EQ(overlapped, 41u);  // (a;b)OVERLAP_F_B groups in the file: 9 + 10 + 11 + 11
  EXPECT_EQ(stats.compute_actions, f + b + i + w);
  EXPECT_EQ(stats.idle_slots, 0u);

  const ScheduleSpec generated = uniform(ScheduleKind::DualPipeV, 4, 10, 2);
  Timeline from_file, from_generator;
  ASSERT_TRUE(simulate(from_csv(c, generated), &from_file, &error)) << error;
  ASSERT_TRUE(simulate(generated, &from_generator, &error)) << error;
  expect_same_timeline(from_file, from_generator);
  EXPECT_EQ(from_file.stage_of_virtual, from_generator.stage_of_virtual);
}

TEST(PyTorchCsv, ZeroBubbleArtifactLoadsWithLoopedPlacementAndIdleSteps) {
  CustomSchedule c;
  std::string error;
  CsvStats stats;
  ASSERT_TRUE(load_pytorch_csv(artifact("zb1p_2rank_2stagep_compute.csv"), &c, &error, &stats)) << error;
  EXPECT_EQ(c.stages, 2);
  EXPECT_EQ(c.chunks, 2);
  EXPECT_EQ(c.microbatches, 8);
  EXPECT_EQ(c.stage_of_virtual, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(stats.idle_slots, 2u);  // "0F1,2F0,,2F1" and the leading "," of rank 1
  const ScheduleSpec generated = uniform(ScheduleKind::InterleavedZB, 2, 8, 2);
  Timeline from_file, from_generator;
  ASSERT_TRUE(simulate(from_csv(c, generated), &from_file, &error)) << error;
  ASSERT_TRUE(simulate(generated, &from_generator, &error)) << error;
  expect_same_timeline(from_file, from_generator);
}

TEST(PyTorchCsv, GrammarCommunicationActionsSkippedAndCrLf) {
  // 2 ranks, 1F1B with 2 micro-batches written with PyTorch's comm lowering and \r\n endings.
  const std::string text =
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD\r\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1, 1F1 ,1B1,1SEND_B1,1UNSHARD,1RESHARD\r\n";
  CustomSchedule c;
  std::string error;
  CsvStats stats;
  ASSERT_TRUE(parse_pytorch_csv(text, "inline", &c, &error, &stats)) << error;
  EXPECT_EQ(stats.compute_actions, 8u);
  EXPECT_EQ(stats.skipped_actions, 11u);
  EXPECT_EQ(c.stages, 2);
  EXPECT_EQ(c.chunks, 1);
  EXPECT_EQ(c.microbatches, 2);
  // Times like the generated 1F1B (same op order).
  const ScheduleSpec generated = uniform(ScheduleKind::OneFOneB, 2, 2, 1);
  Timeline a, b;
  ASSERT_TRUE(simulate(from_csv(c, generated), &a, &error)) << error;
  ASSERT_TRUE(simulate(generated, &b, &error)) << error;
  expect_same_timeline(a, b);
}

TEST(PyTorchCsv, ExportImportRoundTripsEveryKind) {
  for (auto [kind, p, m, v] : std::vector<std::tuple<ScheduleKind, int, int, int>>{
           {ScheduleKind::GPipe, 3, 4, 1}, {ScheduleKind::OneFOneB, 4, 6, 1}, {ScheduleKind::ZBH1, 4, 6, 1},
           {ScheduleKind::Interleaved1F1B, 4, 10, 2}, {ScheduleKind::InterleavedZB, 3, 6, 3},
           {ScheduleKind::LoopedBFS, 2, 5, 3}, {ScheduleKind::ZBV, 3, 7, 2}, {ScheduleKind::DualPipeV, 3, 8, 2}}) {
    SCOPED_TRACE(schedule_kind_name(kind));
    const ScheduleSpec generated = uniform(kind, p, m, v);
    std::vector<std::vector<Op>> order;
    std::string error;
    ASSERT_TRUE(stage_op_order(generated, &order, &error)) << error;
    const std::string csv = format_pytorch_csv(order);
    CustomSchedule c;
    ASSERT_TRUE(parse_pytorch_csv(csv, "round trip", &c, &error)) << error;
    Timeline a, b;
    ASSERT_TRUE(simulate(from_csv(c, generated), &a, &error)) << error;
    ASSERT_TRUE(simulate(generated, &b, &error)) << error;
    expect_same_timeline(a, b);
    EXPECT_EQ(format_pytorch_csv(c.order), csv);
  }
}

TEST(PyTorchCsv, StructuralErrorsNameTheLineFieldAndAction) {
  struct Case {
    std::string text;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"", "no rows"},
      {"\n\n", "no rows"},
      {"0X0,0B0\n", "line 1 (rank 0), field 1 '0X0': unknown action kind 'X'"},
      {"F0,0B0\n", "field 1 'F0': should start with the stage index"},
      {"0F,0B0\n", "compute action 'F' needs a micro-batch index"},
      {"0F0x,0B0\n", "trailing characters"},
      {"0F99999999999,0B0\n", "micro-batch index exceeds"},
      {"0F0,\"0B0\n", "unterminated quoted field"},
      {"(0F0;0B0\n", "'(' without ')'"},
      {"(0F0;0B0)F\n", "must be followed by OVERLAP_F_B"},
      {"(0F0;0SEND_F0)OVERLAP_F_B\n", "is not a compute action"},
      {"0F0,0B0\n\n1F0,1B0\n", "rank 1 (line 2) has no compute actions"},
      {"0F0,0B0,1F0\n1B0\n", "stage 1 is on rank 0 and on rank 1"},
      {"0F0,0F0,0B0\n", "forward runs twice"},
      {"0B0,0F0\n", "backward before its forward 0F0"},
      {"0F0,0W0,0I0\n", "weight gradient before its input gradient 0I0"},
      {"0F0,0I0\n", "0I0 has no weight gradient 0W0"},
      {"0F0,0B0,0F2,0B2\n", "0F1 never runs"},
      {"0F0\n", "no backward of 0F0"},
      {"0F0,0B0,2F0,2B0\n", "stage 1 has no actions"},
      {"0F0,0B0,1F0,1B0,2F0,2B0\n3F0,3B0\n", "rank 0 holds 3 stages; 4 stages on 2 ranks need 2 per rank"},
      {"0F0,0B0\n1F0,1B0\n2F0,2B0\n3F0,3B0,4F0,4B0\n", "5 stages on 4 ranks"},
      // Valid structure, impossible order: stage 0's B0 waits for 1B0, which stage 1 runs after
      // 1F1, which waits for 0F1, which stage 0 runs after B0: a deadlock, named.
      {"0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", "deadlocks (7 ops never run): stage 0 at action 1 (0B0) waits for 1B0"},
      // Backwards in reverse micro-batch order on stage 0: valid.
      {"0F0,0F1,0B1,0B0\n1F0,1B0,1F1,1B1\n", ""},
      {"0SEND_F0,0RECV_B0\n", "no compute actions"},
  };
  for (const auto& c : cases) {
    CustomSchedule out;
    std::string error;
    const bool ok = parse_pytorch_csv(c.text, "t.csv", &out, &error);
    if (c.needle.empty()) {
      EXPECT_TRUE(ok) << c.text << ": " << error;
      continue;
    }
    EXPECT_FALSE(ok) << c.text;
    EXPECT_NE(error.find(c.needle), std::string::npos) << "input: " << c.text << "\nerror: " << error
                                                       << "\nexpected: " << c.needle;
  }
}

TEST(PyTorchCsv, MissingFileAndCustomSpecMismatch) {
  CustomSchedule c;
  std::string error;
  EXPECT_FALSE(load_pytorch_csv("/nonexistent/s.csv", &c, &error));
  EXPECT_NE(error.find("cannot open schedule CSV '/nonexistent/s.csv'"), std::string::npos) << error;
  ASSERT_TRUE(parse_pytorch_csv("0F0,0B0\n", "one.csv", &c, &error)) << error;
  ScheduleSpec spec;
  use_custom_schedule(&spec, std::make_shared<CustomSchedule>(c));
  spec.microbatches = 4;
  Timeline t;
  EXPECT_FALSE(simulate(spec, &t, &error));
  EXPECT_NE(error.find("one.csv has 1 stages x 1 chunks x 1 micro-batches but the spec says 1 x 1 x 4"),
            std::string::npos)
      << error;
  spec.custom = nullptr;
  EXPECT_FALSE(simulate(spec, &t, &error));
  EXPECT_NE(error.find("needs its op order"), std::string::npos) << error;
}

}  // namespace
}  // namespace pipefill::schedule
