// Two quantiles of one bubble history (pfConfig_t::gated_prediction_quantile, version 4): gated
// work (ticket kernels) is sized to the gated quantile (the median by default), because the gate
// closed at the bubble end bounds a too-long prediction to one item of overrun; ungated (opaque)
// work, which nothing stops, keeps prediction_quantile (0.1 by default). A class whose bubbles
// sometimes end early has a 0.1 quantile at an early bubble's length: with one quantile the usual
// bubble would be filled only that far.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

constexpr double kItemUs = 10.0;
constexpr int kWorkersPerJob = 14;  // two jobs side by side on the 28 fill SMs (32 - 4 reserved)
constexpr double kLongUs = 400.0;
constexpr double kEarlyUs = 200.0;

// The nearest-rank quantile, written here from its definition (the smallest sample with at
// least q*n samples at or below it), not taken from the predictor.
double nearest_rank(std::vector<double> samples, double q) {
  std::sort(samples.begin(), samples.end());
  const double n = static_cast<double>(samples.size());
  size_t rank = 1;
  while (static_cast<double>(rank) < q * n) ++rank;
  return samples[rank - 1];
}

// What the slice of a prediction gets with the default margins (0.05 of it and 20 us; the
// simulated device's launch overhead is 0): whole items per worker within that budget.
double budget_with_default_margins(double predicted_us) { return predicted_us * (1.0 - 0.05) - 20.0; }
double whole_items_time(double budget_us) { return std::floor(budget_us / kItemUs) * kItemUs; }

// A job (ticket or opaque) of one 14-worker configuration that keeps every slice it was given.
struct RecordingJob {
  CountingJob counting;
  pfJobConfig_t config{};
  std::vector<pfSliceDesc_t> slices;

  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<RecordingJob*>(user);
    if (slice->max_items > 0) self->slices.push_back(*slice);
    return CountingJob::launch(&self->counting, slice, stream);
  }
  pfJobDesc_t desc(const char* name, int kind) {
    counting.name = name;
    counting.kind = kind;
    counting.item_cost_us = kItemUs;
    counting.items = 1u << 20;
    pfJobDesc_t d = counting.desc();
    config.name = name;
    config.item_cost_us = kItemUs;
    config.parallelism = kWorkersPerJob;
    d.configs = &config;
    d.config_count = 1;
    d.user = this;
    d.launch = &launch;
    return d;
  }
};

class GatedQuantile : public ::testing::TestWithParam<int> {};  // the launch mode

// A ticket job and an opaque job in one runtime with the default quantiles and margins. The
// class "recv" lasts 400 us but 3 bubbles in 20 end at 200 us: its 0.1 quantile is 200 us and its
// median 400 us. The ticket slice's time budget follows the median, the opaque slice's the 0.1
// quantile; when a bubble then ends early (205 us) the gate still stops the ticket job one item
// past the end (the item started at 200 us ends at 210 us), and the main job loses exactly that.
TEST_P(GatedQuantile, TicketWorkFollowsTheMedianOpaqueWorkTheLowQuantile) {
  ManualStage base;  // the same steps without a runtime
  ASSERT_NO_FATAL_FAILURE(base.init());
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.safety_margin_us = PF_UNSET_DOUBLE;        // the defaults: 20 us ...
  config.safety_margin_fraction = PF_UNSET_DOUBLE;  // ... and 0.05 of the prediction
  config.launch_mode = GetParam();
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);
  pfConfig_t in_force = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(rt, &in_force));
  ASSERT_DOUBLE_EQ(in_force.gated_prediction_quantile, 0.5);
  ASSERT_DOUBLE_EQ(in_force.prediction_quantile, 0.1);
  ASSERT_DOUBLE_EQ(in_force.safety_margin_us, 20.0);
  ASSERT_DOUBLE_EQ(in_force.safety_margin_fraction, 0.05);
  ASSERT_EQ(in_force.launch_mode, GetParam());

  RecordingJob ticket, opaque;
  pfJobDesc_t ticket_desc = ticket.desc("ticket", pfJobTicket);
  pfJobDesc_t opaque_desc = opaque.desc("opaque", pfJobOpaque);
  pfJob_t ticket_handle = nullptr, opaque_handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &ticket_desc, &ticket_handle));
  PF_ASSERT_OK(pfJobCreate(rt, &opaque_desc, &opaque_handle));

  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.label = "recv";
  std::vector<double> history;
  for (int i = 0; i < 20; ++i) {
    const double len = (i % 7 == 3) ? kEarlyUs : kLongUs;  // bubbles 3, 10 and 17 end early
    stage.step(rt, len, &hint);
    history.push_back(len);
  }
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  ASSERT_EQ(std::count(history.begin(), history.end(), kEarlyUs), 3);
  const double median = nearest_rank(history, 0.5);
  const double low = nearest_rank(history, 0.1);
  ASSERT_DOUBLE_EQ(median, kLongUs);
  ASSERT_DOUBLE_EQ(low, kEarlyUs);

  // A usual (400 us) bubble.
  ticket.slices.clear();
  opaque.slices.clear();
  stage.step(rt, kLongUs, &hint);
  history.push_back(kLongUs);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  ASSERT_EQ(ticket.slices.size(), 1u);
  ASSERT_EQ(opaque.slices.size(), 1u);
  const double ticket_budget = whole_items_time(budget_with_default_margins(median));  // 360 us
  const double opaque_budget = whole_items_time(budget_with_default_margins(low));     // 170 us
  EXPECT_DOUBLE_EQ(ticket.slices[0].time_budget_us, ticket_budget);
  EXPECT_EQ(ticket.slices[0].max_items,
            static_cast<uint64_t>(ticket_budget / kItemUs) * kWorkersPerJob);
  EXPECT_DOUBLE_EQ(opaque.slices[0].time_budget_us, opaque_budget);
  EXPECT_EQ(opaque.slices[0].max_items,
            static_cast<uint64_t>(opaque_budget / kItemUs) * kWorkersPerJob);
  EXPECT_EQ(ticket.slices[0].max_blocks, kWorkersPerJob);
  EXPECT_EQ(opaque.slices[0].max_blocks, kWorkersPerJob);

  // An early bubble: planned as above (the history's quantiles did not move), it ends at 205 us.
  ASSERT_DOUBLE_EQ(nearest_rank(history, 0.5), median);
  ASSERT_DOUBLE_EQ(nearest_rank(history, 0.1), low);
  pfStats_t before;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &before));
  const uint64_t ticket_items_before = info_of(ticket_handle).items_completed;
  const uint64_t opaque_items_before = info_of(opaque_handle).items_completed;
  ticket.slices.clear();
  opaque.slices.clear();
  const double early = kEarlyUs + 5.0;
  const double filled_step = stage.step(rt, early, &hint);
  const double base_step = base.step(nullptr, early);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t after;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &after));
  ASSERT_EQ(ticket.slices.size(), 1u);
  ASSERT_EQ(opaque.slices.size(), 1u);
  EXPECT_DOUBLE_EQ(ticket.slices[0].time_budget_us, ticket_budget);
  EXPECT_DOUBLE_EQ(opaque.slices[0].time_budget_us, opaque_budget);
  // The ticket job's 14 workers claim items at 0, 10, ..., 200 us; the gate closes at 205 us.
  const double overrun = std::ceil(early / kItemUs) * kItemUs - early;  // 5 us
  EXPECT_DOUBLE_EQ(after.overrun_time_us - before.overrun_time_us, overrun);
  EXPECT_LE(overrun, kItemUs);
  EXPECT_DOUBLE_EQ(filled_step - base_step, overrun) << "the main job loses the one-item overrun";
  EXPECT_EQ(info_of(ticket_handle).items_completed - ticket_items_before,
            static_cast<uint64_t>(std::ceil(early / kItemUs)) * kWorkersPerJob);
  EXPECT_EQ(info_of(opaque_handle).items_completed - opaque_items_before,
            opaque.slices[0].max_items)
      << "the opaque slice, sized to the 0.1 quantile, fit the early bubble";
  EXPECT_TRUE(ticket.counting.runs.end() ==
              std::find_if(ticket.counting.runs.begin(), ticket.counting.runs.end(),
                           [](uint32_t r) { return r > 1; }))
      << "no ticket item ran twice";

  PF_ASSERT_OK(pfJobDestroy(ticket_handle));
  PF_ASSERT_OK(pfJobDestroy(opaque_handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// The knob: gated_prediction_quantile = prediction_quantile gives the single-quantile sizing
// back (the ticket slice follows the 0.1 quantile too).
TEST_P(GatedQuantile, EqualQuantilesSizeBothKindsAlike) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.safety_margin_us = PF_UNSET_DOUBLE;
  config.safety_margin_fraction = PF_UNSET_DOUBLE;
  config.gated_prediction_quantile = 0.1;
  config.launch_mode = GetParam();
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);
  RecordingJob ticket;
  pfJobDesc_t desc = ticket.desc("ticket", pfJobTicket);
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.label = "recv";
  std::vector<double> history;
  for (int i = 0; i < 20; ++i) {
    const double len = (i % 7 == 3) ? kEarlyUs : kLongUs;
    stage.step(rt, len, &hint);
    history.push_back(len);
  }
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  ticket.slices.clear();
  stage.step(rt, kLongUs, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  ASSERT_EQ(ticket.slices.size(), 1u);
  EXPECT_DOUBLE_EQ(ticket.slices[0].time_budget_us,
                   whole_items_time(budget_with_default_margins(nearest_rank(history, 0.1))));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

INSTANTIATE_TEST_SUITE_P(LaunchModes, GatedQuantile,
                         ::testing::Values(static_cast<int>(pfLaunchExecutor),
                                           static_cast<int>(pfLaunchInline)),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == pfLaunchInline ? "Inline"
                                                                           : "Executor");
                         });

}  // namespace
}  // namespace pipefill::testing
