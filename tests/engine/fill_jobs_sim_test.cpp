// The example fill jobs running in real PipeFill bubbles on the simulated device: every item
// computed exactly once with the reference's result, and the training job's loss falling over
// many bubbles while it resumes exactly where each bubble stopped it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../../examples/fill_jobs/fill_jobs.h"
#include "../../examples/fill_jobs/reference.hpp"

namespace {

#define ASSERT_PF(call) ASSERT_EQ((call), pfSuccess) << #call << ": " << pfGetLastErrorMessage()
#define ASSERT_FJ(call) ASSERT_EQ((call), pfSuccess) << #call << ": " << fjGetLastErrorMessage()

// One simulated GPU whose main stream alternates compute kernels and idle waits (bubbles).
class SimStage : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_PF(pfSimWorldCreate(1, nullptr, 7, &world_));
    pfConfig_t config = PF_CONFIG_INITIALIZER;
    config.backend = pfBackendSim;
    config.sim_world = world_;
    config.device = 0;
    config.reserved_sms = 8;
    ASSERT_PF(pfRuntimeCreate(&config, &runtime_));
    ASSERT_PF(pfStreamCreateHighPriority(runtime_, &main_));
  }
  void TearDown() override {
    if (job_) EXPECT_EQ(pfJobDestroy(job_), pfSuccess);
    if (fill_) fjJobDestroy(fill_);
    if (main_) EXPECT_EQ(pfStreamDestroy(runtime_, main_), pfSuccess);
    if (runtime_) EXPECT_EQ(pfRuntimeDestroy(runtime_), pfSuccess);
    if (world_) EXPECT_EQ(pfSimWorldDestroy(world_), pfSuccess);
  }

  void attach(const fjParams_t& params) {
    ASSERT_FJ(fjJobCreate(&params, &fill_));
    pfJobDesc_t desc;
    ASSERT_FJ(fjJobGetDesc(fill_, &desc));
    ASSERT_PF(pfJobCreate(runtime_, &desc, &job_));
  }

  // One iteration: compute, an idle bubble of `bubble_us` (hinted so it fills at once), compute.
  void iteration(double bubble_us) {
    ASSERT_PF(pfSimLaunchKernel(main_, 200.0, 124));
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = bubble_us;
    ASSERT_PF(pfBubbleBegin(runtime_, main_, &hint));
    ASSERT_PF(pfSimStreamDelay(main_, bubble_us));  // waiting on a peer: no SMs used
    ASSERT_PF(pfBubbleEnd(runtime_, main_));
    ASSERT_PF(pfSimLaunchKernel(main_, 200.0, 124));
    ASSERT_PF(pfIterationEnd(runtime_));
    ASSERT_PF(pfSimRunUntilIdle(world_));
    ASSERT_PF(pfRuntimeSynchronize(runtime_));
  }

  pfSimWorld_t world_ = nullptr;
  pfRuntime_t runtime_ = nullptr;
  void* main_ = nullptr;
  fjJob_t fill_ = nullptr;
  pfJob_t job_ = nullptr;
};

TEST_F(SimStage, MlpInferenceComputesEveryItemOnceWithTheReferenceResult) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjMlpInference, pfBackendSim));
  p.input = 32, p.hidden = 64, p.output = 16, p.rows = 2;
  p.items = 1500;
  p.item_cost_us = 10.0;
  p.keep_every = 1;
  p.seed = 99;
  attach(p);
  int iterations = 0;
  pfJobInfo_t info{};
  while (iterations < 20) {
    iteration(100.0);
    ++iterations;
    ASSERT_PF(pfJobGetStatus(job_, &info));
    if (info.status == pfJobCompleted) break;
  }
  EXPECT_EQ(info.status, pfJobCompleted);
  EXPECT_GE(iterations, 2) << "the job should need several bubbles";
  EXPECT_EQ(info.items_completed, 1500u);
  fjProgress_t progress;
  ASSERT_FJ(fjJobGetProgress(fill_, &progress));
  EXPECT_EQ(progress.items_done, 1500u);
  EXPECT_EQ(progress.duplicate_items, 0u);
  EXPECT_EQ(progress.outputs_kept, 1500u);

  const fill_jobs::MlpShape shape{32, 64, 16, 2};
  const auto weights = fill_jobs::MlpWeights::random(shape, 99);
  std::vector<float> x(2 * 32), expected(2 * 16), hidden(2 * 64), got(2 * 16);
  for (uint64_t item : {0ull, 1ull, 777ull, 1499ull}) {
    fill_jobs::mlp_item_input(shape, 99, item, x.data());
    fill_jobs::mlp_forward(weights, x.data(), 2, expected.data(), hidden.data());
    ASSERT_FJ(fjJobGetOutput(fill_, item, got.data(), got.size()));
    EXPECT_EQ(got, expected) << "item " << item;
  }
  // Different items give different outputs (the item index reaches the input generator).
  std::vector<float> other(got.size());
  ASSERT_FJ(fjJobGetOutput(fill_, 1, other.data(), other.size()));
  ASSERT_FJ(fjJobGetOutput(fill_, 0, got.data(), got.size()));
  EXPECT_NE(got, other);
}

TEST_F(SimStage, EncoderInferenceKeepsEveryNthOutput) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjEncoderInference, pfBackendSim));
  p.hidden = 16, p.heads = 2, p.ffn = 32, p.seq = 4;
  p.items = 300;
  p.item_cost_us = 20.0;
  p.keep_every = 7;
  attach(p);
  for (int i = 0; i < 6; ++i) iteration(150.0);
  pfJobInfo_t info{};
  ASSERT_PF(pfJobGetStatus(job_, &info));
  ASSERT_EQ(info.status, pfJobCompleted);
  fjProgress_t progress;
  ASSERT_FJ(fjJobGetProgress(fill_, &progress));
  EXPECT_EQ(progress.items_done, 300u);
  EXPECT_EQ(progress.outputs_kept, 43u);  // items 0, 7, ..., 294
  const fill_jobs::EncoderShape shape{16, 2, 32, 4};
  const auto weights = fill_jobs::EncoderWeights::random(shape, p.seed);
  fill_jobs::EncoderScratch scratch(shape);
  std::vector<float> x(64), expected(64), got(64);
  fill_jobs::encoder_item_input(shape, p.seed, 294, x.data());
  fill_jobs::encoder_forward(weights, x.data(), expected.data(), scratch);
  ASSERT_FJ(fjJobGetOutput(fill_, 294, got.data(), got.size()));
  EXPECT_EQ(got, expected);
  EXPECT_EQ(fjJobGetOutput(fill_, 293, got.data(), got.size()), pfErrorInvalidState);
}

TEST_F(SimStage, TrainingLossFallsAcrossBubblesAndResumesExactly) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjTraining, pfBackendSim));
  p.items = 150;
  p.seed = 5;
  attach(p);
  double initial = 0;
  ASSERT_FJ(fjJobEvaluationLoss(fill_, &initial));
  std::vector<uint64_t> steps_after_iteration;
  pfJobInfo_t info{};
  for (int i = 0; i < 40 && info.status != pfJobCompleted; ++i) {
    iteration(i % 2 ? 250.0 : 400.0);  // bubbles of two sizes: slices stop at odd steps
    ASSERT_PF(pfJobGetStatus(job_, &info));
    steps_after_iteration.push_back(info.items_completed);
  }
  ASSERT_EQ(info.status, pfJobCompleted);
  EXPECT_EQ(info.items_completed, 150u);
  // Spread over many bubbles, each resuming at the next step.
  size_t bubbles_with_progress = 0;
  for (size_t i = 0; i < steps_after_iteration.size(); ++i)
    bubbles_with_progress += steps_after_iteration[i] > (i ? steps_after_iteration[i - 1] : 0);
  EXPECT_GE(bubbles_with_progress, 4u);
  fjProgress_t progress;
  ASSERT_FJ(fjJobGetProgress(fill_, &progress));
  EXPECT_EQ(progress.items_done, 150u);
  EXPECT_EQ(progress.out_of_order, 0u);
  EXPECT_EQ(progress.duplicate_items, 0u);
  EXPECT_LT(progress.last_loss, 0.5 * progress.first_loss);
  double final_loss = 0;
  ASSERT_FJ(fjJobEvaluationLoss(fill_, &final_loss));
  EXPECT_LT(final_loss, 0.5 * initial);

  // Exactly the parameters of 150 uninterrupted SGD steps.
  fill_jobs::RegressionTrainer straight(
      fill_jobs::TrainerShape{p.input, p.hidden, p.output, p.rows, p.learning_rate}, 5);
  for (uint64_t s = 0; s < 150; ++s) straight.step(s);
  size_t count = 0;
  ASSERT_FJ(fjJobParameterCount(fill_, &count));
  std::vector<float> parameters(count);
  ASSERT_FJ(fjJobGetParameters(fill_, parameters.data(), count));
  EXPECT_EQ(parameters, straight.parameters());
}

}  // namespace
