// The example engine on the host transport (examples/pipeline_engine/host_transport.hpp): every
// stage's fill items run exactly once and are all accounted to the bubbles they ran in, every
// bubble of every iteration is seen, the runtimes size gated slices to a high quantile, and the
// per-stage report (host_timeline, host_report) adds up its moments and says why a stage falls
// short. Counts and exact sums only: no assertion on how long anything took.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../../examples/pipeline_engine/engine.hpp"
#include "../../examples/pipeline_engine/host_report.hpp"
#include "../../examples/pipeline_engine/host_transport.hpp"

using namespace engine;

namespace {

// Two SM threads per host device: four stages stay light on a small machine.
class EngineHost : public ::testing::Test {
 protected:
  void SetUp() override { setenv("PIPEFILL_HOST_SMS", "2", 1); }
  void TearDown() override { unsetenv("PIPEFILL_HOST_SMS"); }

  static EngineOptions options() {
    EngineOptions o;
    o.transport = "host";
    o.iterations = 4;
    o.warm_iterations = 1;
    o.fill = "mlp";
    o.keep_every = 0;
    o.fill_item_cost_us = 30.0;
    o.hint_durations = true;  // fill from the first iteration (the hints size the gated slices)
    return o;
  }
};

TEST_F(EngineHost, EveryStageRunsItsItemsExactlyOnceInItsBubbles) {
  const EngineOptions o = options();
  Programs programs;
  std::string error;
  ASSERT_TRUE(build_programs(o.pipeline, &programs, &error)) << error;
  auto transport = make_host_transport_concrete();
  RunResult run;
  const Status s = run_engine_on(*transport, o, FillMode::PipeFill, &run);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(run.transport, "host");
  ASSERT_EQ(run.stages.size(), 4u);
  ASSERT_EQ(run.iterations.size(), 4u);
  uint64_t total = 0;
  for (size_t st = 0; st < run.stages.size(); ++st) {
    const StageFillSummary& summary = run.stages[st];
    // Exactly once: the runtime's count (cursor read-backs) is the job's count of distinct
    // items computed, and no item was computed twice.
    EXPECT_EQ(summary.progress.duplicate_items, 0u) << "stage " << st;
    EXPECT_EQ(summary.progress.items_done, summary.items_completed) << "stage " << st;
    EXPECT_NE(summary.job_status, pfJobFailed) << "stage " << st;
    // Every bubble of the counted iterations was harvested.
    const uint64_t per_iteration = static_cast<uint64_t>(programs.bubbles_per_stage[st]);
    EXPECT_EQ(summary.counted_bubbles, per_iteration * (o.iterations - o.warm_iterations))
        << "stage " << st;
    // The timeline saw every bubble begin and end, and attributed every item to the bubble whose
    // slice ran it.
    uint64_t timeline_items = 0;
    const uint64_t bubbles = transport->bubbles_begun(static_cast<int>(st));
    EXPECT_EQ(bubbles, per_iteration * o.iterations) << "stage " << st;
    for (uint64_t id = 1; id <= bubbles; ++id) {
      const BubbleMoments* b = transport->timeline()->at(static_cast<int>(st), id);
      ASSERT_NE(b, nullptr);
      EXPECT_GE(b->begin.load(), 0.0) << "stage " << st << " bubble " << id;
      EXPECT_GE(b->end.load(), b->begin.load()) << "stage " << st << " bubble " << id;
      if (b->items.load() > 0) EXPECT_GE(b->started.load(), 0.0);
      timeline_items += b->items.load();
    }
    EXPECT_EQ(timeline_items, summary.progress.items_done) << "stage " << st;
    total += summary.items_completed;
  }
  EXPECT_GT(total, 0u);
}

TEST_F(EngineHost, RuntimesSizeGatedSlicesToAHighQuantileUnlessTheEnvironmentSaysOtherwise) {
  auto transport = make_host_transport();
  EngineOptions o = options();
  Programs programs;
  std::string error;
  ASSERT_TRUE(build_programs(o.pipeline, &programs, &error)) << error;
  ASSERT_TRUE(transport->open(o.pipeline, derive_costs(o.pipeline), programs, TransportOptions{}).ok());
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  transport->configure_runtime(0, &config);
  EXPECT_EQ(config.backend, pfBackendHost);
  EXPECT_EQ(config.reserved_sms, 0);
  EXPECT_DOUBLE_EQ(config.gated_prediction_quantile, 0.9);
  setenv("PIPEFILL_GATED_QUANTILE", "0.5", 1);
  pfConfig_t with_env = PF_CONFIG_INITIALIZER;
  transport->configure_runtime(0, &with_env);
  unsetenv("PIPEFILL_GATED_QUANTILE");
  EXPECT_EQ(with_env.gated_prediction_quantile, PF_UNSET_DOUBLE);  // the runtime reads the variable
  // The host transport leaves the margin to the runtime (a receive here is a wait, no transfer).
  EXPECT_LT(engine_margin_us(o, derive_costs(o.pipeline)), 0.0);
  transport->close();
}

void set(BubbleMoments& b, int iteration, int index, double begin, double launched, double started,
         double first, double last, double end, uint64_t items) {
  b.iteration = iteration;
  b.index = index;
  b.begin = begin;
  b.launched = launched;
  b.started = started;
  b.first_item = first;
  b.last_item = last;
  b.end = end;
  b.items = items;
}

TEST(HostTimeline, BreakdownSumsTheMomentsOfTheChosenClassesFromTheFirstCountedIteration) {
  HostTimeline t(1, 8);
  // Counted (iteration >= 2, class #0): a bubble launched early, one with no slice, one late.
  set(*t.at(0, 1), 2, 0, 100, 50, 110, 150, 380, 400, 8);
  set(*t.at(0, 4), 3, 0, 1000, -1, -1, -1, -1, 1200, 0);
  set(*t.at(0, 5), 3, 0, 2000, 2040, 2045, 2100, 2190, 2200, 4);
  // Not counted: class #1, and an earlier iteration.
  set(*t.at(0, 2), 2, 1, 500, 450, 505, 540, 560, 600, 2);
  set(*t.at(0, 3), 1, 0, 700, 650, 705, 740, 760, 800, 2);
  const StageBreakdown b = t.breakdown(0, 2, {true, false}, 30.0);
  EXPECT_EQ(b.bubbles, 3u);
  EXPECT_EQ(b.bubbles_with_slice, 2u);
  EXPECT_DOUBLE_EQ(b.bubble_us, 300 + 200 + 200);
  EXPECT_DOUBLE_EQ(b.unfilled_us, 200);
  EXPECT_DOUBLE_EQ(b.executor_late_us, 40);        // 2040 - 2000 (the first one was early)
  EXPECT_DOUBLE_EQ(b.stream_wake_us, 10 + 5);      // 110 - 100, 2045 - 2040
  EXPECT_DOUBLE_EQ(b.first_item_us, 10 + 25);      // (150 - 30) - 110, (2100 - 30) - 2045
  EXPECT_DOUBLE_EQ(b.items_span_us, 260 + 120);    // 380 - 120, 2190 - 2070
  EXPECT_DOUBLE_EQ(b.tail_us, 20 + 10);            // 400 - 380, 2200 - 2190
  EXPECT_EQ(b.items, 12u);
  // The parts cover the bubble time exactly when nothing overlaps the bubble's ends.
  EXPECT_DOUBLE_EQ(b.unfilled_us + b.executor_late_us + b.stream_wake_us + b.first_item_us +
                       b.items_span_us + b.tail_us,
                   b.bubble_us);
}

ClassSummary cls(const char* key, uint64_t bubbles, double bubble_us, double filled_us, uint64_t items) {
  ClassSummary c;
  c.key = key;
  c.bubbles = c.bubbles_filled = bubbles;
  c.bubble_us = bubble_us;
  c.filled_us = filled_us;
  c.items = items;
  return c;
}

TEST(HostReport, RowsCountOnlyLongClassesAndSayWhyAStageFallsShort) {
  RunResult run;
  run.stages.resize(3);
  // Stage 0: only 100 us bubbles, under 10 x 30 us.
  run.stages[0].classes = {cls("#0", 4, 400, 300, 8)};
  // Stage 1: a 1 ms class filled 95% at 25,000 items per bubble-second, and a short class.
  run.stages[1].classes = {cls("#0", 4, 4000, 3800, 100), cls("#1", 4, 400, 0, 0)};
  // Stage 2: a long class filled half.
  run.stages[2].classes = {cls("#0", 4, 4000, 2000, 40)};
  HostTimeline timeline(3, 8);
  AloneRate alone, single;
  alone.items_per_s = 20000;
  single.items_per_s = 40000;
  const auto rows = host_stage_rows(run, timeline, 0, 30.0, 10.0, alone, single);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].long_classes, 0);
  EXPECT_DOUBLE_EQ(rows[0].longest_class_us, 100);
  EXPECT_NE(rows[0].why.find("no bubble class >= 10x"), std::string::npos) << rows[0].why;
  EXPECT_EQ(rows[1].long_classes, 1);
  EXPECT_EQ(rows[1].bubbles, 4u);
  EXPECT_DOUBLE_EQ(rows[1].bubble_us, 4000);
  EXPECT_DOUBLE_EQ(rows[1].rate_per_bubble_s, 25000);
  EXPECT_DOUBLE_EQ(rows[1].ratio, 1.25);
  EXPECT_DOUBLE_EQ(rows[1].ratio_single, 0.625);
  EXPECT_TRUE(rows[1].why.empty()) << rows[1].why;
  EXPECT_FALSE(rows[2].why.empty());
  const std::string table = format_host_stage_table(rows, 30.0, 10.0, alone, single);
  EXPECT_NE(table.find("meets both goals"), std::string::npos) << table;
}

TEST_F(EngineHost, TheJobAloneRunsItsItemsOnEveryDevice) {
  AloneRate r;
  const Status s = measure_alone(options(), 300, 2, &r);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(r.devices, 2);
  EXPECT_EQ(r.items, 300u);
  EXPECT_GT(r.items_per_s, 0.0);
}

}  // namespace
