// The C factory of the example fill jobs: defaults, validation messages, the cost model and the
// pfJobDesc_t it hands to the runtime.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../../examples/fill_jobs/fill_jobs.h"
#include "../../examples/fill_jobs/reference.hpp"

namespace {

std::string last_message() { return fjGetLastErrorMessage(); }

struct JobGuard {
  fjJob_t job = nullptr;
  ~JobGuard() { fjJobDestroy(job); }
};

}  // namespace

TEST(FillJobParams, DefaultsPerKind) {
  fjParams_t p;
  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendSim), pfSuccess);
  EXPECT_EQ(p.kind, fjMlpInference);
  EXPECT_EQ(p.backend, pfBackendSim);
  EXPECT_EQ(p.execution, fjExecTicket);
  EXPECT_EQ(p.input, 256);
  EXPECT_EQ(p.hidden, 1024);
  ASSERT_EQ(fjParamsInit(&p, fjTraining, pfBackendSim), pfSuccess);
  EXPECT_EQ(p.execution, fjExecOpaque);
  EXPECT_EQ(p.parallelism, 1);
  EXPECT_EQ(p.rows, 32);
  EXPECT_EQ(fjParamsInit(&p, 7, pfBackendSim), pfErrorInvalidArgument);
  EXPECT_NE(last_message().find("kind 7"), std::string::npos) << last_message();
  EXPECT_EQ(fjParamsInit(nullptr, fjTraining, pfBackendSim), pfErrorInvalidArgument);
}

TEST(FillJobParams, RejectsBadValuesNamingThem) {
  fjParams_t p;
  fjJob_t job = nullptr;
  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendSim), pfSuccess);
  p.items = 0;
  EXPECT_EQ(fjJobCreate(&p, &job), pfErrorInvalidArgument);
  EXPECT_NE(last_message().find("items must be > 0"), std::string::npos) << last_message();
  EXPECT_EQ(job, nullptr);

  ASSERT_EQ(fjParamsInit(&p, fjEncoderInference, pfBackendSim), pfSuccess);
  p.heads = 3;  // 128 % 3 != 0
  EXPECT_EQ(fjJobCreate(&p, &job), pfErrorInvalidArgument);
  EXPECT_NE(last_message().find("heads 3"), std::string::npos) << last_message();

  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendSim), pfSuccess);
  p.backend = 9;
  EXPECT_EQ(fjJobCreate(&p, &job), pfErrorInvalidArgument);
  EXPECT_NE(last_message().find("backend 9"), std::string::npos) << last_message();

  ASSERT_EQ(fjParamsInit(&p, fjTraining, pfBackendSim), pfSuccess);
  p.execution = fjExecTicket;
  p.parallelism = 4;
  EXPECT_EQ(fjJobCreate(&p, &job), pfErrorInvalidArgument);
  EXPECT_NE(last_message().find("parallelism 1, got 4"), std::string::npos) << last_message();

  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendSim), pfSuccess);
  EXPECT_EQ(fjJobCreate(&p, nullptr), pfErrorInvalidArgument);
  EXPECT_EQ(fjJobCreate(nullptr, &job), pfErrorInvalidArgument);
}

TEST(FillJobParams, CudaBackendRefusedWithoutCuda) {
  // This test executable compiles the fill jobs without FILL_JOBS_WITH_CUDA.
  fjParams_t p;
  fjJob_t job = nullptr;
  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendCuda), pfSuccess);
  EXPECT_EQ(fjJobCreate(&p, &job), pfErrorNotSupported);
  EXPECT_NE(last_message().find("built without CUDA"), std::string::npos) << last_message();
  EXPECT_EQ(job, nullptr);
}

TEST(FillJobParams, CostModelFollowsFlops) {
  fjParams_t p;
  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendSim), pfSuccess);
  JobGuard ticket;
  ASSERT_EQ(fjJobCreate(&p, &ticket.job), pfSuccess) << last_message();
  double cost = 0;
  ASSERT_EQ(fjJobItemCost(ticket.job, &cost), pfSuccess);
  const double flops = fill_jobs::mlp_flops_per_item({256, 1024, 256, 4});
  EXPECT_DOUBLE_EQ(cost, flops / p.ticket_flops_per_us);

  p.execution = fjExecOpaque;
  JobGuard opaque;
  ASSERT_EQ(fjJobCreate(&p, &opaque.job), pfSuccess);
  ASSERT_EQ(fjJobItemCost(opaque.job, &cost), pfSuccess);
  EXPECT_DOUBLE_EQ(cost, std::max(10.0, flops / p.opaque_flops_per_us));

  p.item_cost_us = 42.5;  // explicit cost wins
  JobGuard fixed;
  ASSERT_EQ(fjJobCreate(&p, &fixed.job), pfSuccess);
  ASSERT_EQ(fjJobItemCost(fixed.job, &cost), pfSuccess);
  EXPECT_DOUBLE_EQ(cost, 42.5);

  fjParams_t t;
  ASSERT_EQ(fjParamsInit(&t, fjTraining, pfBackendSim), pfSuccess);
  JobGuard training;
  ASSERT_EQ(fjJobCreate(&t, &training.job), pfSuccess);
  ASSERT_EQ(fjJobItemCost(training.job, &cost), pfSuccess);
  const double step_flops = fill_jobs::trainer_flops_per_item({32, 64, 4, 32, 0.05f});
  EXPECT_DOUBLE_EQ(step_flops, 3.0 * 2 * 32 * (32 * 64 + 64 * 4));
  EXPECT_DOUBLE_EQ(cost, std::max(10.0, step_flops / (t.opaque_flops_per_us * t.opaque_blocks)));
}

TEST(FillJobParams, DescriptorDescribesTheJob) {
  fjParams_t p;
  ASSERT_EQ(fjParamsInit(&p, fjMlpInference, pfBackendSim), pfSuccess);
  p.items = 1234;
  p.priority = 3;
  JobGuard g;
  ASSERT_EQ(fjJobCreate(&p, &g.job), pfSuccess);
  pfJobDesc_t d;
  ASSERT_EQ(fjJobGetDesc(g.job, &d), pfSuccess);
  EXPECT_STREQ(d.name, "mlp-inference/ticket");
  EXPECT_EQ(d.kind, pfJobTicket);
  EXPECT_EQ(d.priority, 3);
  EXPECT_EQ(d.item_count, 1234u);
  ASSERT_EQ(d.config_count, 1);
  EXPECT_EQ(d.configs[0].resident_bytes, (1024u * 256 + 1024 + 256 * 1024 + 256) * sizeof(float));
  EXPECT_EQ(d.configs[0].items_per_item, 4.0);  // rows per item = samples
  EXPECT_EQ(d.user, static_cast<void*>(g.job));
  EXPECT_NE(d.launch, nullptr);

  fjProgress_t progress;
  ASSERT_EQ(fjJobGetProgress(g.job, &progress), pfSuccess);
  EXPECT_EQ(progress.items_done, 0u);
  float out[4 * 256];
  EXPECT_EQ(fjJobGetOutput(g.job, 0, out, 4 * 256), pfErrorInvalidState);
  EXPECT_NE(last_message().find("no kept output"), std::string::npos);
  EXPECT_EQ(fjJobGetOutput(g.job, 0, out, 3), pfErrorInvalidArgument);
  EXPECT_EQ(fjJobGetOutput(g.job, 1234, out, 4 * 256), pfErrorInvalidArgument);
  double loss;
  EXPECT_EQ(fjJobEvaluationLoss(g.job, &loss), pfErrorInvalidArgument);
}
