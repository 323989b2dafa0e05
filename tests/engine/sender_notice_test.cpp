// The example engine's sender notice (EngineOptions::notice_lead_us, sender_notice.hpp): the
// sending stage tells the receiver a lead before its send, and the receiver closes that bubble's
// fill (pfBubbleCloseFill), so the fill stops before the transfer it would slow - without the
// runtime's margin. Expected values: the no-fill run's iteration times (fill that never meets a
// transfer or a main kernel leaves them exactly as they are).
#include <gtest/gtest.h>

#include <string>

#include "../../examples/pipeline_engine/engine.hpp"
#include "engine_test_options.hpp"

using namespace engine;

namespace {

// 4 stages, 1F1B, 8 micro-batches, MLP fill, no jitter (every kernel as long as its nominal
// length: the notice is exact), the calibrated interference, and margin 0: nothing but the
// notice stops the fill before a send.
EngineOptions options() {
  EngineOptions o = engine_tests::four_stage_sim_options();
  o.margin_us = 0.0;
  return o;
}

double mean_iteration_us(const RunResult& r, size_t warm) {
  double sum = 0.0;
  for (size_t i = warm; i < r.iterations.size(); ++i) sum += r.iterations[i].time_us;
  return sum / static_cast<double>(r.iterations.size() - warm);
}

TEST(EngineSenderNotice, KeepsTheFillOffTheTransfersWithoutAMargin) {
  const EngineOptions plain = options();
  EngineOptions noticed = plain;
  // The notice's trip is 10 us and an MLP item about 14: closed 20 us before the send, the item
  // in flight ends before it.
  noticed.notice_lead_us = 30.0;
  RunResult none, without, with;
  Status s = run_engine(plain, FillMode::None, &none);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(plain, FillMode::PipeFill, &without);
  ASSERT_TRUE(s.ok()) << s.message;
  s = run_engine(noticed, FillMode::PipeFill, &with);
  ASSERT_TRUE(s.ok()) << s.message;
  const size_t warm = static_cast<size_t>(plain.warm_iterations);
  const double base = mean_iteration_us(none, warm);
  // Margin 0 without the notice: fill runs beside the receives' transfers and stretches them.
  EXPECT_GT(mean_iteration_us(without, warm), base * 1.0005);
  // With it: every counted iteration exactly as without fill, and most of the bubbles filled.
  for (size_t i = warm; i < none.iterations.size(); ++i)
    EXPECT_NEAR(with.iterations[i].time_us, none.iterations[i].time_us, 1e-9 * base) << "iteration " << i;
  const double fill_sms = plain.pipeline.sm_count - plain.pipeline.comm_sms;
  ASSERT_GT(with.bubble_us, 0.0);
  EXPECT_GT(with.filled_sm_us / (with.bubble_us * fill_sms), 0.8);
  EXPECT_LT(with.filled_sm_us, without.filled_sm_us) << "the notice stops fill the margin-0 run keeps";
}

TEST(EngineSenderNotice, RunsOnTheSimulatedTransportOnly) {
  EngineOptions o = options();
  o.transport = "host";
  o.iterations = 1;
  o.warm_iterations = 0;
  o.notice_lead_us = 20.0;
  RunResult r;
  const Status s = run_engine(o, FillMode::PipeFill, &r);
  EXPECT_EQ(s.code, pfErrorNotSupported);
  EXPECT_NE(s.message.find("--notice-lead runs on --transport sim only"), std::string::npos) << s.message;
}

}  // namespace
