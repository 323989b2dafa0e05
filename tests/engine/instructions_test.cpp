// The engine's instruction lists: built from the schedule generator, every message matched,
// every bubble of the no-fill schedule marked exactly once around a wait.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "../../examples/pipeline_engine/engine.hpp"
#include "../../examples/pipeline_engine/instructions.hpp"
#include "schedule/pytorch_csv.hpp"

using namespace engine;
namespace sched = pipefill::schedule;

namespace {

PipelineSpec spec_for(sched::ScheduleKind kind, int stages, int microbatches, int chunks) {
  PipelineSpec s;
  s.kind = kind;
  s.stages = stages;
  s.microbatches = microbatches;
  s.chunks = chunks;
  s.model.layers_per_stage = 2 * chunks;
  return s;
}

int count(const std::vector<Instruction>& prog, InstrType type) {
  int n = 0;
  for (const auto& in : prog) n += in.type == type;
  return n;
}

void check_programs(const PipelineSpec& spec) {
  Programs programs;
  std::string error;
  ASSERT_TRUE(build_programs(spec, &programs, &error)) << error;
  ASSERT_EQ(programs.stages.size(), static_cast<size_t>(spec.stages));
  const int p = spec.stages, v = effective_chunks(spec), m = spec.microbatches;
  const std::vector<int>& stage_of = programs.timeline.stage_of_virtual;
  ASSERT_EQ(stage_of.size(), static_cast<size_t>(p * v));
  // message key -> (sender stage, receiver stage) seen
  std::map<uint64_t, int> sends, recvs;
  for (int s = 0; s < p; ++s) {
    const auto& prog = programs.stages[s];
    EXPECT_EQ(count(prog, InstrType::Forward), m * v) << "stage " << s;
    EXPECT_EQ(count(prog, InstrType::Backward) + count(prog, InstrType::BackwardInput), m * v) << "stage " << s;
    EXPECT_EQ(count(prog, InstrType::BackwardWeight), count(prog, InstrType::BackwardInput)) << "stage " << s;
    EXPECT_EQ(count(prog, InstrType::LoadMicrobatch), s == 0 ? m : 0) << "stage " << s;
    EXPECT_EQ(count(prog, InstrType::ReduceGradients), 1);
    EXPECT_EQ(prog.back().type, InstrType::OptimizerStep);
    double marked_us = 0.0;
    int begins = 0;
    for (size_t i = 0; i < prog.size(); ++i) {
      const Instruction& in = prog[i];
      switch (in.type) {
        case InstrType::SendActivation:
        case InstrType::SendGradient: {
          const uint64_t key = message_key(in.type == InstrType::SendGradient, in.microbatch,
                                           in.virtual_stage);
          EXPECT_EQ(sends.count(key), 0u) << "duplicate send " << to_string(in);
          sends[key] = in.peer;
          EXPECT_EQ(stage_of[in.virtual_stage], in.peer);
          EXPECT_NE(in.peer, s);
          break;
        }
        case InstrType::RecvActivation:
        case InstrType::RecvGradient: {
          const uint64_t key = message_key(in.type == InstrType::RecvGradient, in.microbatch,
                                           in.virtual_stage);
          EXPECT_EQ(recvs.count(key), 0u) << "duplicate recv " << to_string(in);
          recvs[key] = s;
          EXPECT_EQ(stage_of[in.virtual_stage], s);  // the receiver's virtual stage is on this stage
          // The producer: virtual stage - 1 for an activation, + 1 for a gradient.
          const int producer = in.virtual_stage + (in.type == InstrType::RecvGradient ? 1 : -1);
          EXPECT_EQ(stage_of[producer], in.peer);
          ASSERT_LT(i + 1, prog.size());
          // A receive is always followed by its wait (possibly wrapped as a bubble).
          EXPECT_TRUE(prog[i + 1].type == InstrType::WaitComm ||
                      prog[i + 1].type == InstrType::BubbleBegin);
          break;
        }
        case InstrType::BubbleBegin: {
          ++begins;
          ASSERT_GE(i, 1u);
          ASSERT_LT(i + 2, prog.size());
          const InstrType before = prog[i - 1].type;
          EXPECT_TRUE(before == InstrType::RecvActivation || before == InstrType::RecvGradient ||
                      before == InstrType::ReduceGradients)
              << "stage " << s << " bubble after " << instr_name(before);
          EXPECT_EQ(prog[i + 1].type, InstrType::WaitComm);
          EXPECT_EQ(prog[i + 2].type, InstrType::BubbleEnd);
          EXPECT_EQ(prog[i + 2].bubble_index, in.bubble_index);
          EXPECT_EQ(in.bubble_index, begins - 1);
          EXPECT_GT(in.expected_us, 0.0);
          marked_us += in.expected_us;
          break;
        }
        default:
          break;
      }
    }
    EXPECT_EQ(begins, programs.bubbles_per_stage[s]);
    // No bubble of the no-fill schedule is lost: the marked waits cover all its idle time.
    const sched::StageTimeline& tl = programs.timeline.stages[s];
    EXPECT_NEAR(marked_us, tl.bubble_us + tl.optimizer_bubble_us, 1e-6 * (1.0 + marked_us))
        << "stage " << s;
  }
  EXPECT_EQ(sends.size(), recvs.size());
  for (const auto& [key, receiver] : sends) {
    ASSERT_TRUE(recvs.count(key)) << "send without receive, key " << key;
    EXPECT_EQ(recvs[key], receiver);
  }
  // Each micro-batch crosses every boundary between virtual stages on different physical stages
  // once per direction (in the V, the turn p-1 -> p stays on stage p-1).
  int crossing = 0;
  for (int vs = 0; vs + 1 < p * v; ++vs) crossing += stage_of[vs] != stage_of[vs + 1];
  EXPECT_EQ(sends.size(), static_cast<size_t>(2 * m * crossing));
  // Every message is sent before it is received in some global order: the instruction lists
  // do not deadlock (the engine's single-thread driver, replayed here).
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::set<uint64_t> sent;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto& prog = programs.stages[s];
      while (pc[s] < prog.size()) {
        const Instruction& in = prog[pc[s]];
        if ((in.type == InstrType::RecvActivation || in.type == InstrType::RecvGradient) &&
            !sent.count(message_key(in.type == InstrType::RecvGradient, in.microbatch, in.virtual_stage)))
          break;
        if (in.type == InstrType::SendActivation || in.type == InstrType::SendGradient)
          sent.insert(message_key(in.type == InstrType::SendGradient, in.microbatch, in.virtual_stage));
        ++pc[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) EXPECT_EQ(pc[s], programs.stages[s].size()) << "stage " << s << " deadlocks";
}

}  // namespace

TEST(EngineInstructions, OneFOneBFourStages) { check_programs(spec_for(sched::ScheduleKind::OneFOneB, 4, 8, 1)); }
TEST(EngineInstructions, GPipe) { check_programs(spec_for(sched::ScheduleKind::GPipe, 3, 5, 1)); }
TEST(EngineInstructions, Interleaved) { check_programs(spec_for(sched::ScheduleKind::Interleaved1F1B, 4, 8, 2)); }
TEST(EngineInstructions, InterleavedThreeChunksWithAllReduce) {
  PipelineSpec s = spec_for(sched::ScheduleKind::Interleaved1F1B, 2, 4, 3);
  s.model.allreduce_us = 500.0;
  check_programs(s);
}

TEST(EngineInstructions, EveryScheduleKind) {
  check_programs(spec_for(sched::ScheduleKind::ZBH1, 4, 8, 1));
  check_programs(spec_for(sched::ScheduleKind::Interleaved1F1B, 4, 10, 2));  // m % p != 0 (rounds)
  check_programs(spec_for(sched::ScheduleKind::Interleaved1F1B, 4, 4, 2));   // m == p
  PipelineSpec grouped = spec_for(sched::ScheduleKind::Interleaved1F1B, 2, 5, 2);
  grouped.microbatch_group_size = 3;  // Megatron's documented PP2 N3 M5 example
  check_programs(grouped);
  check_programs(spec_for(sched::ScheduleKind::InterleavedZB, 4, 8, 2));
  check_programs(spec_for(sched::ScheduleKind::LoopedBFS, 3, 6, 2));
  check_programs(spec_for(sched::ScheduleKind::ZBV, 4, 8, 2));
  check_programs(spec_for(sched::ScheduleKind::ZBV, 3, 2, 2));  // m < 2p - 1: PyTorch drops the extra
  check_programs(spec_for(sched::ScheduleKind::DualPipeV, 4, 10, 2));
  PipelineSpec s = spec_for(sched::ScheduleKind::ZBV, 4, 8, 1);  // --chunks ignored: the V has 2
  s.model.layers_per_stage = 2;
  check_programs(s);
}

TEST(EngineInstructions, PyTorchCsvScheduleBuildsTheSameProgramsAsTheGenerator) {
  auto custom = std::make_shared<sched::CustomSchedule>();
  std::string error;
  ASSERT_TRUE(sched::load_pytorch_csv(std::string(PIPEFILL_SOURCE_DIR) + "/tests/schedule/data/dualpipev_4rank_10mb.csv",
                                      custom.get(), &error))
      << error;
  PipelineSpec from_csv = spec_for(sched::ScheduleKind::Custom, 4, 10, 2);
  from_csv.custom = custom;
  check_programs(from_csv);
  Programs a, b;
  ASSERT_TRUE(build_programs(from_csv, &a, &error)) << error;
  ASSERT_TRUE(build_programs(spec_for(sched::ScheduleKind::DualPipeV, 4, 10, 2), &b, &error)) << error;
  ASSERT_EQ(a.stages.size(), b.stages.size());
  for (size_t s = 0; s < a.stages.size(); ++s) {
    ASSERT_EQ(a.stages[s].size(), b.stages[s].size()) << s;
    for (size_t i = 0; i < a.stages[s].size(); ++i) EXPECT_EQ(to_string(a.stages[s][i]), to_string(b.stages[s][i]));
  }
}

TEST(EngineInstructions, ZeroBubbleKindsSplitTheBackwardAndSendAfterTheInputPart) {
  // The gradient goes to the previous stage right after the B-input part; W sends nothing.
  Programs programs;
  std::string error;
  ASSERT_TRUE(build_programs(spec_for(sched::ScheduleKind::ZBH1, 3, 6, 1), &programs, &error)) << error;
  const auto& mid = programs.stages[1];
  int inputs = 0;
  for (size_t i = 0; i < mid.size(); ++i) {
    if (mid[i].type == InstrType::BackwardInput) {
      ++inputs;
      ASSERT_LT(i + 1, mid.size());
      EXPECT_EQ(mid[i + 1].type, InstrType::SendGradient);
      EXPECT_EQ(mid[i + 1].peer, 0);
    }
    if (mid[i].type == InstrType::BackwardWeight && i + 1 < mid.size())
      EXPECT_NE(mid[i + 1].type, InstrType::SendGradient);
  }
  EXPECT_EQ(inputs, 6);
  const StageCosts c = derive_costs(spec_for(sched::ScheduleKind::ZBH1, 3, 6, 1));
  EXPECT_DOUBLE_EQ(c.backward_input_layer_us + c.backward_weight_layer_us, c.backward_layer_us);
  EXPECT_DOUBLE_EQ(c.backward_input_layer_us, c.forward_layer_us);
}

TEST(EngineRun, EveryNewScheduleFillsItsBubblesOnTheSimTransport) {
  for (auto [kind, p, m, v] : std::vector<std::tuple<sched::ScheduleKind, int, int, int>>{
           {sched::ScheduleKind::ZBH1, 4, 8, 1}, {sched::ScheduleKind::Interleaved1F1B, 4, 6, 2},
           {sched::ScheduleKind::InterleavedZB, 4, 8, 2}, {sched::ScheduleKind::LoopedBFS, 4, 8, 2},
           {sched::ScheduleKind::ZBV, 4, 8, 2}, {sched::ScheduleKind::DualPipeV, 4, 8, 2}}) {
    SCOPED_TRACE(sched::schedule_kind_name(kind));
    EngineOptions o;
    o.transport = "auto";  // the zero-bubble and V kinds resolve to sim; no GPU here anyway
    o.iterations = 4;
    o.pipeline = spec_for(kind, p, m, v);
    o.keep_every = 0;
    o.fill = "mlp";
    o.interference = o.fill_slowdown = o.comm_slowdown = 0.0;  // the bound below is the gate's
    RunResult none, filled;
    Status st = run_engine(o, FillMode::None, &none);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(none.transport, "sim");
    st = run_engine(o, FillMode::PipeFill, &filled);
    ASSERT_TRUE(st.ok()) << st.message;
    ASSERT_EQ(filled.iterations.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_GT(none.iterations[i].bubble_us, 0.0);
      EXPECT_LE(filled.iterations[i].time_us, none.iterations[i].time_us * 1.005) << i;
      if (i >= 2) EXPECT_GT(filled.iterations[i].items, 0u) << i;
    }
  }
}

TEST(EngineInstructions, LastStageWaitsForEveryForwardAndStageZeroForEveryGradient) {
  // 1F1B, p=4, m=8, no p2p cost: stage p-1 idles before its first forward (warm-up bubble) and
  // at the end (drain); stage 0 waits for its first gradient and in the cool-down.
  PipelineSpec s = spec_for(sched::ScheduleKind::OneFOneB, 4, 8, 1);
  s.model.p2p_latency_us = 0.0;
  s.model.p2p_gbps = 1e12;
  Programs programs;
  std::string error;
  ASSERT_TRUE(build_programs(s, &programs, &error)) << error;
  const StageCosts c = derive_costs(s);
  const double tf = c.forward_layer_us * 2, tb = c.backward_layer_us * 2;
  // Last stage: first bubble = warm-up of 3 forwards, kind warmup, right before its first
  // forward's activation wait.
  const auto& last = programs.stages[3];
  const auto first_begin = std::find_if(last.begin(), last.end(), [](const Instruction& in) {
    return in.type == InstrType::BubbleBegin;
  });
  ASSERT_NE(first_begin, last.end());
  EXPECT_EQ(first_begin->bubble_kind, pfBubbleWarmup);
  EXPECT_NEAR(first_begin->expected_us, 3 * tf, 1e-6);
  EXPECT_EQ((first_begin - 1)->type, InstrType::RecvActivation);
  EXPECT_EQ((first_begin - 1)->microbatch, 0);
  // Its last bubble is the drain before the gradient reduction: 3 backward times.
  const auto last_begin = std::find_if(last.rbegin(), last.rend(), [](const Instruction& in) {
    return in.type == InstrType::BubbleBegin;
  });
  EXPECT_EQ(last_begin->bubble_kind, pfBubbleDrain);
  EXPECT_NEAR(last_begin->expected_us, 3 * tb, 1e-6);
  EXPECT_EQ((last_begin + 1)->type, InstrType::ReduceGradients);  // reverse iterator: before it
  // Stage 0 finishes last: no bubble at the reduction.
  const auto& first = programs.stages[0];
  for (size_t i = 0; i + 1 < first.size(); ++i)
    if (first[i].type == InstrType::ReduceGradients) EXPECT_EQ(first[i + 1].type, InstrType::WaitComm);
}

TEST(EngineInstructions, CostsFollowFlopCounting) {
  PipelineSpec s;
  s.model.hidden = 4096;
  s.model.seq = 2048;
  s.model.micro_batch = 2;
  s.model.tflops = 500.0;
  s.model.p2p_latency_us = 5.0;
  s.model.p2p_gbps = 100.0;
  const StageCosts c = derive_costs(s);
  const double flops = 24.0 * 2 * 2048 * 4096.0 * 4096.0 * (1.0 + 2048.0 / (6.0 * 4096));
  EXPECT_DOUBLE_EQ(c.forward_layer_us, flops / 500e6);
  EXPECT_DOUBLE_EQ(c.backward_layer_us, 2 * c.forward_layer_us);
  EXPECT_EQ(c.message_bytes, static_cast<size_t>(2 * 2048 * 4096 * 2));
  EXPECT_DOUBLE_EQ(c.p2p_us, 5.0 + c.message_bytes / 100e3);
  EXPECT_EQ(c.layers_per_chunk, 2);
}

TEST(EngineInstructions, RejectsBadSpecsNamingTheValue) {
  Programs programs;
  std::string error;
  PipelineSpec s = spec_for(sched::ScheduleKind::Interleaved1F1B, 4, 9, 2);
  EXPECT_FALSE(build_programs(s, &programs, &error));
  EXPECT_NE(error.find("multiple of the rounds"), std::string::npos) << error;
  s = spec_for(sched::ScheduleKind::Interleaved1F1B, 4, 8, 2);
  s.model.layers_per_stage = 3;
  EXPECT_FALSE(build_programs(s, &programs, &error));
  EXPECT_NE(error.find("--layers-per-stage 3"), std::string::npos) << error;
  s = spec_for(sched::ScheduleKind::OneFOneB, 4, 8, 1);
  s.comm_sms = 132;
  EXPECT_FALSE(build_programs(s, &programs, &error));
  EXPECT_NE(error.find("--comm-sms"), std::string::npos) << error;
  s = spec_for(sched::ScheduleKind::OneFOneB, 0, 8, 1);
  EXPECT_FALSE(build_programs(s, &programs, &error));
  EXPECT_NE(error.find("--stages must be >= 1, got 0"), std::string::npos) << error;
  s = spec_for(sched::ScheduleKind::ZBV, 4, 8, 2);
  s.model.layers_per_stage = 3;
  EXPECT_FALSE(build_programs(s, &programs, &error));
  EXPECT_NE(error.find("--layers-per-stage 3 must be a multiple of the 2 chunks per stage zbv runs"), std::string::npos)
      << error;
  s = spec_for(sched::ScheduleKind::Custom, 4, 8, 2);
  EXPECT_FALSE(build_programs(s, &programs, &error));
  EXPECT_NE(error.find("--schedule-csv"), std::string::npos) << error;
}
