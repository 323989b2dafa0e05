// The whole engine on the simulated transport: filling keeps the main job's iteration time,
// fills most of the bubble time, beats the naive baseline, and runs every schedule.
#include <gtest/gtest.h>

#include "../../examples/fill_jobs/reference.hpp"
#include "../../examples/pipeline_engine/engine.hpp"

using namespace engine;

namespace {

EngineOptions small_options() {
  EngineOptions o;
  o.transport = "sim";
  o.iterations = 4;
  o.pipeline.stages = 4;
  o.pipeline.microbatches = 8;
  o.keep_every = 0;  // speed: count items, do not compute inference outputs
  // Interference off: the bounds below are the gate's and the planner's (tests/sim covers it).
  o.interference = o.fill_slowdown = o.comm_slowdown = 0.0;
  // The runtime's default margin: without interference there is no transfer to keep fill clear
  // of (EngineMargin.* tests the engine's default, the receive's transfer time).
  o.margin_us = 20.0;
  return o;
}

}  // namespace

TEST(EngineRun, PipeFillKeepsIterationTimeAndFillsBubbles) {
  EngineOptions o = small_options();
  o.fill = "mlp";
  RunResult none, filled, naive;
  Status s = run_engine(o, FillMode::None, &none);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(o, FillMode::PipeFill, &filled);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(o, FillMode::Naive, &naive);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(none.iterations.size(), 4u);
  ASSERT_EQ(filled.iterations.size(), 4u);
  EXPECT_EQ(filled.transport, "sim");
  double naive_total = 0, none_total = 0;
  for (size_t i = 0; i < 4; ++i) {
    const IterationResult &b = none.iterations[i], &f = filled.iterations[i];
    EXPECT_EQ(b.items, 0u);
    EXPECT_GT(b.bubble_us, 0.0);
    // The brief's bound: at most 0.5% slowdown of the main job.
    EXPECT_LE(f.time_us, b.time_us * 1.005) << "iteration " << i;
    if (i >= 2) {  // after the predictor's min_samples iterations of history
      EXPECT_GE(f.filled_us, 0.9 * f.bubble_us) << "iteration " << i;
      EXPECT_GT(f.items, 0u);
      EXPECT_EQ(f.bubbles_filled, f.bubbles);
    } else {
      EXPECT_EQ(f.items, 0u);
    }
    naive_total += naive.iterations[i].time_us;
    none_total += b.time_us;
  }
  // Ungated fill at the main job's priority without SM reservation slows the main job.
  EXPECT_GT(naive_total, none_total * 1.01);
  EXPECT_GT(naive.naive_items, 0u);
  uint64_t runtime_items = 0, job_items = 0;
  for (const StageFillSummary& st : filled.stages) {
    runtime_items += st.items_completed;
    job_items += st.progress.items_done;
    EXPECT_EQ(st.progress.duplicate_items, 0u);
  }
  EXPECT_EQ(runtime_items, job_items);
  EXPECT_GT(runtime_items, 0u);
}

TEST(EngineRun, InterleavedScheduleTrainsAFillJobExactly) {
  EngineOptions o = small_options();
  o.pipeline.kind = pipefill::schedule::ScheduleKind::Interleaved1F1B;
  o.pipeline.stages = 2;
  o.pipeline.microbatches = 4;
  o.pipeline.chunks = 2;
  o.fill = "train";
  o.fill_items = 400;
  o.iterations = 6;
  o.hint_durations = true;  // fill from the first iteration
  RunResult filled;
  const Status s = run_engine(o, FillMode::PipeFill, &filled);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(filled.stages.size(), 2u);
  for (size_t stage = 0; stage < 2; ++stage) {
    const StageFillSummary& st = filled.stages[stage];
    EXPECT_GT(st.items_completed, 50u) << "stage " << stage;
    EXPECT_EQ(st.progress.items_done, st.items_completed);
    EXPECT_EQ(st.progress.out_of_order, 0u);
    EXPECT_LT(st.eval_loss_after, 0.5 * st.eval_loss_before);
    // Resumed exactly across the bubbles: same loss as the uninterrupted reference run.
    fill_jobs::RegressionTrainer reference(fill_jobs::TrainerShape{},
                                           o.seed * 1000 + stage);
    for (uint64_t i = 0; i < st.items_completed; ++i) reference.step(i);
    EXPECT_EQ(st.eval_loss_after, static_cast<double>(reference.evaluation_loss()));
  }
}

TEST(EngineRun, GPipeRunsWithoutFill) {
  EngineOptions o = small_options();
  o.pipeline.kind = pipefill::schedule::ScheduleKind::GPipe;
  o.pipeline.stages = 3;
  o.pipeline.microbatches = 4;
  o.fill = "none";
  o.iterations = 2;
  RunResult none;
  const Status s = run_engine(o, FillMode::PipeFill, &none);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(none.iterations.size(), 2u);
  // Deterministic simulation without jitter: both iterations take the same time (up to the
  // rounding of absolute virtual times).
  EXPECT_NEAR(none.iterations[0].time_us, none.iterations[1].time_us,
              1e-9 * none.iterations[0].time_us);
  EXPECT_EQ(none.iterations[1].items, 0u);
}

TEST(EngineRun, ErrorsNameTheBadValue) {
  EngineOptions o = small_options();
  RunResult r;
  o.transport = "carrier-pigeon";
  Status s = run_engine(o, FillMode::None, &r);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("carrier-pigeon"), std::string::npos) << s.message;

  o = small_options();
  o.fill = "video";
  s = run_engine(o, FillMode::PipeFill, &r);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("'video'"), std::string::npos) << s.message;

  o = small_options();
  o.pipeline.microbatches = 0;
  s = run_engine(o, FillMode::None, &r);
  EXPECT_EQ(s.code, pfErrorInvalidArgument);
  EXPECT_NE(s.message.find("--microbatches must be >= 1, got 0"), std::string::npos) << s.message;
}

// This executable compiles the engine without ENGINE_WITH_CUDA (the CUDA transports' stub).
TEST(EngineRun, CudaTransportsNeedACudaBuild) {
  EngineOptions o = small_options();
  RunResult r;
  o.transport = "emulated";
  Status s = run_engine(o, FillMode::None, &r);
  EXPECT_EQ(s.code, pfErrorNoDevice);
  EXPECT_NE(s.message.find("no CUDA support"), std::string::npos) << s.message;
  o.transport = "nccl";
  s = run_engine(o, FillMode::None, &r);
  EXPECT_EQ(s.code, pfErrorNoDevice);
  // auto falls back to the simulated transport.
  o.transport = "auto";
  o.iterations = 1;
  s = run_engine(o, FillMode::None, &r);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(r.transport, "sim");
}

// The engine's simulated device has the calibrated interference by default: filling beside the
// main job's kernels and transfers now costs it something (the demo no longer shows +0.000%),
// and the cost goes away when every coefficient is 0.
TEST(EngineRun, DefaultInterferenceMakesFillCostSomethingAndZeroTurnsItOff) {
  EngineOptions o = small_options();
  o.fill = "mlp";
  const EngineOptions defaults;
  o.interference = defaults.interference;
  o.fill_slowdown = defaults.fill_slowdown;
  o.comm_slowdown = defaults.comm_slowdown;
  EXPECT_DOUBLE_EQ(o.interference, 0.6);
  EXPECT_DOUBLE_EQ(o.fill_slowdown, 0.6);
  EXPECT_DOUBLE_EQ(o.comm_slowdown, 0.5);
  RunResult none, filled;
  Status s = run_engine(o, FillMode::None, &none);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(o, FillMode::PipeFill, &filled);
  ASSERT_TRUE(s.ok()) << s.message;
  double none_total = 0, filled_total = 0;
  for (size_t i = 2; i < 4; ++i) {  // iterations that are filled (after min_samples)
    none_total += none.iterations[i].time_us;
    filled_total += filled.iterations[i].time_us;
    EXPECT_GT(filled.iterations[i].items, 0u);
  }
  EXPECT_GT(filled_total, none_total);

  o.interference = o.fill_slowdown = o.comm_slowdown = 0.0;
  RunResult calm;
  s = run_engine(o, FillMode::PipeFill, &calm);
  ASSERT_TRUE(s.ok()) << s.message;
  double calm_total = 0;
  for (size_t i = 2; i < 4; ++i) calm_total += calm.iterations[i].time_us;
  EXPECT_LT(calm_total, filled_total);
}
