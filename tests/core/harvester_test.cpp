// The harvester's accounting rules on hand-computed cases (times in µs).
#include "core/harvester.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace pipefill::core {
namespace {

SliceObservation ticket(double start, double end, uint64_t readback, uint64_t before,
                        uint64_t count = 1000) {
  SliceObservation o;
  o.kind = pfJobTicket;
  o.start_us = start;
  o.end_us = end;
  o.cursor_readback = readback;
  o.items_completed_before = before;
  o.item_count = count;
  return o;
}

SliceObservation opaque(double start, double end, uint64_t planned, uint64_t before,
                        uint64_t count = 1000) {
  SliceObservation o;
  o.kind = pfJobOpaque;
  o.start_us = start;
  o.end_us = end;
  o.planned_items = planned;
  o.items_completed_before = before;
  o.item_count = count;
  return o;
}

TEST(Harvester, TicketSliceInsideTheBubble) {
  // Bubble [100, 200]; the slice ran [100, 180] and moved the cursor from 20 to 50.
  const SliceAccounting a = account_slice(100, 200, ticket(100, 180, 50, 20));
  EXPECT_EQ(a.items_done, 30u);
  EXPECT_EQ(a.items_completed_after, 50u);
  EXPECT_TRUE(a.ran_work);
  EXPECT_FALSE(a.late);
  EXPECT_DOUBLE_EQ(a.filled_us, 80.0);
  EXPECT_DOUBLE_EQ(a.busy_us, 80.0);
  EXPECT_LE(a.overrun_us, 0.0);
}

TEST(Harvester, TicketSliceEndingAfterTheBubbleIsOverrun) {
  // Bubble [0, 55]; blocks busy with items started before 55 finish at 60.
  const std::vector<SliceObservation> slices = {ticket(0, 60, 60, 0)};
  const BubbleAccounting b = account_bubble(0, 55, slices);
  EXPECT_DOUBLE_EQ(b.duration_us, 55.0);
  EXPECT_DOUBLE_EQ(b.filled_us, 55.0);
  EXPECT_DOUBLE_EQ(b.overrun_us, 5.0);
  EXPECT_DOUBLE_EQ(b.slices[0].busy_us, 60.0);
  EXPECT_EQ(b.slices[0].items_done, 60u);
}

TEST(Harvester, TicketSliceThatRanNoItemIsNeitherFillNorOverrun) {
  // A zero-length bubble at 0; the slice's blocks got SMs only at 150 and found the gate closed:
  // the cursor did not move (10 before, 10 after).
  const std::vector<SliceObservation> slices = {ticket(0, 150, 10, 10)};
  const BubbleAccounting b = account_bubble(0, 0, slices);
  EXPECT_EQ(b.slices[0].items_done, 0u);
  EXPECT_FALSE(b.slices[0].ran_work);
  EXPECT_TRUE(b.slices[0].late);
  EXPECT_DOUBLE_EQ(b.filled_us, 0.0);
  EXPECT_DOUBLE_EQ(b.overrun_us, 0.0);
  EXPECT_DOUBLE_EQ(b.slices[0].busy_us, 0.0);
}

TEST(Harvester, SliceEnqueuedAfterTheBubbleEndedIsLate) {
  // Bubble [0, 100]; the executor enqueued the slice at 130: its blocks found the gate closed.
  const SliceAccounting a = account_slice(0, 100, ticket(130, 131, 40, 40));
  EXPECT_TRUE(a.late);
  EXPECT_FALSE(a.ran_work);
  EXPECT_EQ(a.items_done, 0u);
  EXPECT_DOUBLE_EQ(a.overrun_us, 0.0);
}

TEST(Harvester, ReadBackIsCappedAtTheItemCount) {
  // Blocks claim past the end (the claim fails there); only 10 real items were left.
  const SliceAccounting a = account_slice(0, 100, ticket(0, 40, 1200, 990, 1000));
  EXPECT_EQ(a.items_done, 10u);
  EXPECT_EQ(a.items_completed_after, 1000u);
}

TEST(Harvester, OpaqueSliceCountsItsPlannedItems) {
  // 84 items planned in [10, 100] of the bubble [0, 100]: nothing to read back, the plan holds.
  const SliceAccounting a = account_slice(0, 100, opaque(10, 100, 84, 0, 100));
  EXPECT_EQ(a.items_done, 84u);
  EXPECT_EQ(a.items_completed_after, 84u);
  EXPECT_DOUBLE_EQ(a.filled_us, 90.0);
  // Never more than the job has left.
  const SliceAccounting tail = account_slice(0, 100, opaque(0, 30, 20, 90, 100));
  EXPECT_EQ(tail.items_done, 10u);
  EXPECT_EQ(tail.items_completed_after, 100u);
}

TEST(Harvester, FilledTimeIsTheOverlapWithTheBubble) {
  // Slice [90, 150] against bubble [100, 200]: 50 µs overlap (busy 60).
  const SliceAccounting a = account_slice(100, 200, ticket(90, 150, 5, 0));
  EXPECT_DOUBLE_EQ(a.filled_us, 50.0);
  EXPECT_DOUBLE_EQ(a.busy_us, 60.0);
}

TEST(Harvester, BubbleSumsFillAndTakesTheLargestOverrun) {
  // Two jobs' slices in the bubble [0, 100]: [0, 60] and [60, 112] (overrun 12); a third that
  // ran nothing ends at 300 and must not count.
  const std::vector<SliceObservation> slices = {ticket(0, 60, 30, 0), opaque(60, 112, 4, 0),
                                                ticket(112, 300, 7, 7)};
  const BubbleAccounting b = account_bubble(0, 100, slices);
  EXPECT_DOUBLE_EQ(b.filled_us, 60.0 + 40.0);
  EXPECT_DOUBLE_EQ(b.overrun_us, 12.0);
  ASSERT_EQ(b.slices.size(), 3u);
  EXPECT_EQ(b.slices[0].items_done, 30u);
  EXPECT_EQ(b.slices[1].items_done, 4u);
  EXPECT_EQ(b.slices[2].items_done, 0u);
  // Bubble edges: the first working slice started at the begin; one ended past the end (the
  // third ran nothing: neither its late end nor its start counts).
  EXPECT_DOUBLE_EQ(b.fill_start_delay_us, 0.0);
  EXPECT_EQ(b.slices_past_end, 1u);
  // An end event before the begin event (clock skew) gives a zero duration, not a negative one.
  EXPECT_DOUBLE_EQ(account_bubble(50, 40, {}).duration_us, 0.0);
}

TEST(Harvester, FillStartDelayIsTheFirstWorkingSlicesStartAfterTheBegin) {
  // Bubble [100, 300]: a slice that ran nothing starts at 105, working ones at 130 and 118.
  const std::vector<SliceObservation> slices = {ticket(105, 140, 0, 0), ticket(130, 290, 9, 0),
                                                opaque(118, 320, 2, 9)};
  const BubbleAccounting b = account_bubble(100, 300, slices);
  EXPECT_DOUBLE_EQ(b.fill_start_delay_us, 18.0);
  EXPECT_EQ(b.slices_past_end, 1u);
  // A slice starting before the begin event (clock skew) is a zero delay; no working slice: none.
  EXPECT_DOUBLE_EQ(account_bubble(100, 300, std::vector<SliceObservation>{ticket(95, 200, 3, 0)}).fill_start_delay_us,
                   0.0);
  EXPECT_DOUBLE_EQ(account_bubble(100, 300, std::vector<SliceObservation>{ticket(105, 140, 0, 0)}).fill_start_delay_us,
                   -1.0);
  EXPECT_EQ(account_bubble(100, 300, {}).slices_past_end, 0u);
}

}  // namespace
}  // namespace pipefill::core
