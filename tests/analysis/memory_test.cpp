#include <gtest/gtest.h>

#include "analysis/memory.hpp"
#include "test_records.hpp"

namespace pipefill::analysis {
namespace {

using namespace pipefill::analysis::testing;

TEST(MemoryTimeline, WithoutAbsoluteLevelsTheStartIsTheLeastNonNegativeLevel) {
  // Freeing 300 bytes allocated before the trace: at least 200 were in use at the start.
  const std::vector<ActivityRecord> records = {
      memory(ActivityKind::MemoryAlloc, 10, 100),
      memory(ActivityKind::MemoryFree, 20, 300),
      memory(ActivityKind::MemoryAlloc, 30, 50),
      memory(ActivityKind::MemoryAlloc, 15, 999, -1, 1),  // another device
  };
  const MemoryTimeline t = MemoryTimeline::build(records, 0);
  EXPECT_FALSE(t.absolute());
  EXPECT_EQ(t.event_count(), 3u);
  EXPECT_EQ(t.initial_bytes(), 200);
  EXPECT_EQ(t.level_at(5), 200);
  EXPECT_EQ(t.level_at(10), 300);  // an event counts from its own instant
  EXPECT_EQ(t.level_at(25), 0);
  EXPECT_EQ(t.level_at(1e9), 50);
  EXPECT_EQ(t.peak_bytes(), 300);
  const MemoryRange r = t.range(5, 25);
  EXPECT_TRUE(r.known);
  EXPECT_EQ(r.min_bytes, 0);
  EXPECT_EQ(r.max_bytes, 300);
  const MemoryRange quiet = t.range(21, 29);
  EXPECT_EQ(quiet.min_bytes, 0);
  EXPECT_EQ(quiet.max_bytes, 0);
}

TEST(MemoryTimeline, AbsoluteLevelsAnchorTheDeltasAroundThem) {
  const std::vector<ActivityRecord> records = {
      memory(ActivityKind::MemoryFree, 30, 30),
      memory(ActivityKind::MemoryAlloc, 10, 100),
      memory(ActivityKind::MemoryAlloc, 20, 50, 1000),  // 1000 in use after it
  };
  const MemoryTimeline t = MemoryTimeline::build(records, 0);
  EXPECT_TRUE(t.absolute());
  EXPECT_EQ(t.initial_bytes(), 850);
  EXPECT_EQ(t.level_at(10), 950);
  EXPECT_EQ(t.level_at(20), 1000);
  EXPECT_EQ(t.level_at(30), 970);
  EXPECT_EQ(t.peak_bytes(), 1000);
}

TEST(MemoryTimeline, EventsAtTheSameInstantKeepTheirOrder) {
  const std::vector<ActivityRecord> records = {
      memory(ActivityKind::MemoryAlloc, 10, 100, 100),
      memory(ActivityKind::MemoryAlloc, 10, 100, 200),
      memory(ActivityKind::MemoryFree, 10, 150, 50),
  };
  const MemoryTimeline t = MemoryTimeline::build(records, 0);
  EXPECT_EQ(t.level_at(10), 50);
  const MemoryRange r = t.range(0, 10);
  EXPECT_EQ(r.min_bytes, 0);
  EXPECT_EQ(r.max_bytes, 200);
}

TEST(MemoryTimeline, NoRecordsMeansUnknown) {
  const MemoryTimeline t = MemoryTimeline::build({kernel(0, 10)}, 0);
  EXPECT_TRUE(t.empty());
  EXPECT_FALSE(t.range(0, 100).known);
}

}  // namespace
}  // namespace pipefill::analysis
