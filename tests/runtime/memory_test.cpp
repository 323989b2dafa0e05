// A job whose resident memory exceeds the fill arena is refused; running jobs are unaffected.
#include <gtest/gtest.h>

#include <string>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

TEST(ArenaMemory, OversizedJobIsRefusedAndOthersKeepRunning) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.arena_bytes = size_t{1} << 20;
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);

  CountingJob small;
  small.name = "small";
  small.items = 500;
  small.resident_bytes = 512 << 10;
  pfJobDesc_t small_desc = small.desc();
  pfJob_t small_job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &small_desc, &small_job));
  EXPECT_EQ(small.setups, 1);

  // Runs for a while before the refused creation.
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(small_job).items_completed, 280u);

  CountingJob big;
  big.name = "big";
  big.resident_bytes = size_t{2} << 20;
  pfJobDesc_t big_desc = big.desc();
  pfJob_t big_job = reinterpret_cast<pfJob_t>(0x1);
  EXPECT_EQ(pfJobCreate(rt, &big_desc, &big_job), pfErrorOutOfMemory);
  EXPECT_EQ(big_job, nullptr);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find("'big' needs 2097152 resident bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("524288 free"), std::string::npos) << message;
  EXPECT_EQ(big.setups, 0);

  // Fits the arena but not what is left of it.
  CountingJob medium;
  medium.name = "medium";
  medium.resident_bytes = 600 << 10;
  pfJobDesc_t medium_desc = medium.desc();
  pfJob_t medium_job = nullptr;
  EXPECT_EQ(pfJobCreate(rt, &medium_desc, &medium_job), pfErrorOutOfMemory);

  // The running job is unaffected and completes.
  for (int i = 0; i < 10 && info_of(small_job).status != pfJobCompleted; ++i) {
    stage.step(rt, 100.0, &hint);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  }
  EXPECT_EQ(info_of(small_job).status, pfJobCompleted);
  EXPECT_TRUE(small.every_item_once());
  pfResult_t async = pfSuccess;
  PF_ASSERT_OK(pfRuntimeGetAsyncError(rt, &async));
  EXPECT_EQ(async, pfSuccess);

  // Its memory returns to the arena when it is destroyed: now the medium job fits.
  PF_ASSERT_OK(pfJobDestroy(small_job));
  PF_ASSERT_OK(pfJobCreate(rt, &medium_desc, &medium_job));
  PF_ASSERT_OK(pfJobDestroy(medium_job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(ArenaMemory, SetupAllocationsStayInsideTheJobShare) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  struct Setup {
    void* first = nullptr;
    void* second = nullptr;
    pfResult_t overflow = pfSuccess;
  } s;
  pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
  desc.name = "alloc";
  desc.item_count = 1;
  desc.item_cost_hint_us = 1.0;
  desc.resident_bytes = 4096;
  desc.user = &s;
  desc.launch = [](void*, const pfSliceDesc_t*, void*) { return pfSuccess; };
  desc.setup = [](void* user, const pfArenaAllocator_t* a, int config) -> pfResult_t {
    auto* st = static_cast<Setup*>(user);
    if (config != 0) return pfErrorInternal;
    if (a->allocate(a->context, 1000, 256, &st->first) != pfSuccess) return pfErrorInternal;
    if (a->allocate(a->context, 1000, 1024, &st->second) != pfSuccess) return pfErrorInternal;
    st->overflow = a->allocate(a->context, 4096, 256, &st->first);
    return pfSuccess;
  };
  pfJob_t job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &job));
  const auto first = reinterpret_cast<uintptr_t>(s.first);
  const auto second = reinterpret_cast<uintptr_t>(s.second);
  EXPECT_EQ(first % 256, 0u);
  EXPECT_EQ(second % 1024, 0u);
  EXPECT_GE(second, first + 1000);
  EXPECT_EQ(s.overflow, pfErrorOutOfMemory);
  PF_ASSERT_OK(pfJobDestroy(job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
