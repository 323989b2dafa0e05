// Bubble classes end to end: the k-th bubble of an iteration is a class, a hint label overrides
// it; engine-lent memory is never handed to fill work (it has no stream-ordered release).
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

TEST(BubbleClasses, LabelsGiveStableClassesWithoutIterationEnds) {
  for (const bool labelled : {false, true}) {
    ManualStage stage;
    ASSERT_NO_FATAL_FAILURE(stage.init());
    pfRuntime_t rt = stage.runtime();
    CountingJob job;
    job.items = 1u << 20;
    pfJobDesc_t d = job.desc();
    pfJob_t handle = nullptr;
    PF_ASSERT_OK(pfJobCreate(rt, &d, &handle));
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    // No pfIterationEnd: without labels every bubble is a new class and never has history.
    for (int i = 0; i < 8; ++i) {
      hint.label = (i % 2 == 0) ? "long-recv" : "short-recv";
      stage.step(rt, i % 2 == 0 ? 100.0 : 50.0, labelled ? &hint : nullptr, false);
    }
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
    pfStats_t s;
    PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
    EXPECT_EQ(s.bubbles, 8u);
    EXPECT_EQ(s.iterations, 0u);
    if (labelled) {
      // Each label has 2 samples after its first two bubbles: bubbles 5..8 are filled exactly.
      EXPECT_EQ(s.bubbles_filled, 4u);
      EXPECT_DOUBLE_EQ(s.filled_time_us, 2 * 100.0 + 2 * 50.0);
      EXPECT_EQ(s.items_completed, 2u * 280u + 2u * 140u);
    } else {
      EXPECT_EQ(s.bubbles_filled, 0u);
      EXPECT_EQ(s.bubbles_skipped, 8u);
    }
    PF_ASSERT_OK(pfJobDestroy(handle));
    PF_ASSERT_OK(pfRuntimeDestroy(rt));
  }
}

// Memory lent for a bubble would have no release point: fill work may still write it after
// pfBubbleEnd (up to one item past the gate for ticket work, unbounded for opaque work), while the
// engine reuses it. The runtime therefore ignores lent memory; workspace comes from the arena.
TEST(BubbleClasses, LentMemoryIsNeverHandedToFillWork) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.arena_bytes = size_t{64} << 20;
  pfRuntime_t rt = stage.runtime(&config);
  struct Seen {
    std::vector<std::pair<uintptr_t, size_t>> workspaces;
    CountingJob job;
  } seen;
  seen.job.items = 10000;
  pfJobDesc_t d = seen.job.desc();
  d.workspace_bytes_per_item = 1 << 20;
  d.user = &seen;
  d.launch = [](void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* s = static_cast<Seen*>(user);
    s->workspaces.emplace_back(reinterpret_cast<uintptr_t>(slice->workspace),
                               slice->workspace_bytes);
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, s->job.item_cost_us,
                                   &CountingJob::on_item, &s->job);
  };
  d.setup = nullptr;
  d.teardown = nullptr;
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &handle));
  static char lent[64];
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  hint.lent_memory = lent;
  hint.lent_bytes = size_t{64} << 20;  // would hold the slice's 28 MiB of workspace
  for (int i = 0; i < 3; ++i) stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  ASSERT_EQ(seen.workspaces.size(), 3u);
  const auto lent_begin = reinterpret_cast<uintptr_t>(lent);
  const uintptr_t lent_end = lent_begin + hint.lent_bytes;
  for (const auto& [address, bytes] : seen.workspaces) {
    EXPECT_TRUE(address + bytes <= lent_begin || address >= lent_end)
        << "workspace " << address << " lies in the lent memory";
    EXPECT_EQ(bytes, size_t{28} << 20) << "28 workers of 1 MiB from the arena";
  }
  EXPECT_EQ(info_of(handle).items_completed, 3u * 280u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
