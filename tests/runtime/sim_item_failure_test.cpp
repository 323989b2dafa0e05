// A simulated fill item whose on_item throws fails its job, as on the host device (issue 34's
// contract; tests/host/contract_test.cpp): the world runs on (pfSimRunUntilIdle succeeds), the
// block of the failed item stops, the job ends Failed with the item's message, and only the
// items whose function returned count as completed. Before, the exception escaped the world's
// event loop and pfSimRunUntilIdle reported pfErrorInternal.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "runtime/fixtures.hpp"

namespace pipefill::testing {
namespace {

// A CountingJob whose on_item throws for item 7 and every 10th item after it.
struct ThrowingCountingJob : CountingJob {
  uint64_t returned = 0;
  uint64_t threw = 0;

  static pfResult_t launch_throwing(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<ThrowingCountingJob*>(user);
    if (slice->max_items == 0) return pfSuccess;  // pfJobCreate's warm-up
    if (self->kind == pfJobOpaque) {
      return pfSimLaunchOpaque(stream, slice->first_item_hint, slice->max_items,
                               slice->max_blocks, self->item_cost_us, &throwing_item, self);
    }
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, self->item_cost_us,
                                   &throwing_item, self);
  }
  static void throwing_item(void* user, uint64_t item) {
    auto* self = static_cast<ThrowingCountingJob*>(user);
    if (item % 10 == 7) {
      ++self->threw;
      throw std::runtime_error("bad row " + std::to_string(item));
    }
    ++self->returned;
  }
};

class SimItemFailure : public StageRuntimeTest, public ::testing::WithParamInterface<int> {};

TEST_P(SimItemFailure, AThrowingItemFailsTheJobAndTheWorldRunsOn) {
  ThrowingCountingJob job;
  job.name = "throwing";
  job.kind = GetParam();
  job.items = 400;
  job.item_cost_us = 2.0;
  pfJobDesc_t desc = job.desc();
  desc.launch = &ThrowingCountingJob::launch_throwing;
  pfJob_t handle = nullptr;
  ASSERT_EQ(pfJobCreate(rt, &desc, &handle), pfSuccess) << pfGetLastErrorMessage();
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  int steps = 0;
  for (; steps < 40 && info_of(handle).status != pfJobFailed &&
         info_of(handle).status != pfJobCompleted;
       ++steps) {
    stage.step(rt, 100.0, &hint);  // expects pfSimRunUntilIdle to succeed
    ASSERT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
  }
  const pfJobInfo_t i = info_of(handle);
  ASSERT_EQ(i.status, pfJobFailed) << "after " << steps << " steps, " << i.items_completed
                                   << " items completed";
  ASSERT_GT(job.threw, 0u);
  EXPECT_EQ(i.items_completed, job.returned);
  EXPECT_LT(i.items_completed, job.items);
  EXPECT_EQ(pfJobWait(handle, -1.0), pfErrorJobFailed);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find("job 'throwing'"), std::string::npos) << message;
  EXPECT_NE(message.find("threw: bad row "), std::string::npos) << message;
  // The world still runs the main job.
  stage.step(rt, 100.0, &hint);
  EXPECT_EQ(pfJobDestroy(handle), pfSuccess);
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
  rt = nullptr;
}

INSTANTIATE_TEST_SUITE_P(Kinds, SimItemFailure, ::testing::Values(pfJobTicket, pfJobOpaque),
                         [](const auto& info) {
                           return std::string(info.param == pfJobTicket ? "Ticket" : "Opaque");
                         });

}  // namespace
}  // namespace pipefill::testing
