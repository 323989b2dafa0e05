// The engine's margins per bubble class (EngineOptions::class_margins, pfRuntimeSetClassMargin):
// a bubble that waits for the end-of-iteration collective moving no bytes gets margin 0, every
// bubble that ends in a p2p receive keeps the receive's p2p time. Expected values come from the
// instruction lists and the runtime's own per-class statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../../examples/pipeline_engine/engine.hpp"
#include "engine_test_options.hpp"

using namespace engine;

namespace {

EngineOptions options() { return engine_tests::four_stage_sim_options(); }

// Per stage, the bubble indices whose wait follows ReduceGradients with no receive in between,
// read from the instruction list here.
std::vector<std::vector<int>> collective_bubbles(const Programs& programs) {
  std::vector<std::vector<int>> out;
  for (const auto& prog : programs.stages) {
    out.emplace_back();
    bool after_reduce = false;
    for (const Instruction& in : prog) {
      if (in.type == InstrType::ReduceGradients) after_reduce = true;
      if (in.type == InstrType::RecvActivation || in.type == InstrType::RecvGradient) after_reduce = false;
      if (in.type == InstrType::BubbleBegin && after_reduce) out.back().push_back(in.bubble_index);
    }
  }
  return out;
}

TEST(EngineClassMargins, CollectiveBubblesGetNoMarginReceivesKeepTheirs) {
  const EngineOptions o = options();
  Programs programs;
  std::string error;
  ASSERT_TRUE(build_programs(o.pipeline, &programs, &error)) << error;
  const StageCosts costs = derive_costs(o.pipeline);
  const auto expected = collective_bubbles(programs);
  int collective_total = 0;
  for (size_t s = 0; s < programs.stages.size(); ++s) {
    const std::vector<double> margins = engine_class_margins_us(o, costs, programs.stages[s]);
    const std::vector<bool> ends = bubbles_ending_in_collective(programs.stages[s]);
    ASSERT_EQ(margins.size(), ends.size());
    for (size_t b = 0; b < margins.size(); ++b) {
      const bool collective =
          std::find(expected[s].begin(), expected[s].end(), static_cast<int>(b)) != expected[s].end();
      EXPECT_EQ(ends[b], collective) << "stage " << s << " bubble " << b;
      EXPECT_DOUBLE_EQ(margins[b], collective ? 0.0 : -1.0) << "stage " << s << " bubble " << b;
      collective_total += collective;
    }
  }
  EXPECT_GE(collective_total, 3) << "1F1B: every stage but the first waits for the others at the end";

  // No class margins: when the collective moves bytes, when the margin is set, on the host
  // transport, or when turned off.
  EngineOptions bytes = o, fixed = o, host = o, off = o;
  bytes.pipeline.model.allreduce_us = 500.0;
  fixed.margin_us = 50.0;
  host.transport = "host";
  off.class_margins = false;
  for (const EngineOptions* other : {&bytes, &fixed, &host, &off})
    for (const auto& prog : programs.stages)
      for (double m : engine_class_margins_us(*other, costs, prog)) EXPECT_DOUBLE_EQ(m, -1.0);
}

// Without jitter every prediction is exact: the collective classes are filled up to their end
// (more than with the p2p margin), the receive classes exactly as before, and the main job's
// iterations take as long as without fill either way.
TEST(EngineClassMargins, FillTheCollectiveBubbleToItsEnd) {
  EngineOptions with = options();
  EngineOptions without = with;
  without.class_margins = false;
  Programs programs;
  std::string error;
  ASSERT_TRUE(build_programs(with.pipeline, &programs, &error)) << error;
  const auto collective = collective_bubbles(programs);
  RunResult none, a, b;
  Status s = run_engine(with, FillMode::None, &none);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(with, FillMode::PipeFill, &a);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(without, FillMode::PipeFill, &b);
  ASSERT_TRUE(s.ok()) << s.message;
  const double margin = engine_margin_us(with, derive_costs(with.pipeline));
  ASSERT_EQ(a.stages.size(), b.stages.size());
  for (size_t st = 0; st < a.stages.size(); ++st) {
    ASSERT_EQ(a.stages[st].classes.size(), b.stages[st].classes.size());
    for (size_t c = 0; c < a.stages[st].classes.size(); ++c) {
      const ClassSummary& ca = a.stages[st].classes[c];
      const ClassSummary& cb = b.stages[st].classes[c];
      ASSERT_EQ(ca.key, cb.key);
      bool is_collective = false;
      for (int idx : collective[st]) is_collective |= ca.key == fmt::format("#{}", idx);
      if (is_collective) {
        // Each counted bubble gains about the margin on every fill SM (whole items: within one).
        EXPECT_GT(ca.filled_us, cb.filled_us + 0.5 * margin * static_cast<double>(ca.bubbles))
            << "stage " << st << " class " << ca.key;
      } else {
        EXPECT_DOUBLE_EQ(ca.filled_us, cb.filled_us) << "stage " << st << " class " << ca.key;
      }
    }
  }
  for (size_t i = 0; i < none.iterations.size(); ++i) {
    EXPECT_NEAR(a.iterations[i].time_us, none.iterations[i].time_us, 1e-9 * none.iterations[i].time_us);
    EXPECT_NEAR(b.iterations[i].time_us, none.iterations[i].time_us, 1e-9 * none.iterations[i].time_us);
  }
}

}  // namespace
