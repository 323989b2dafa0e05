#include <gtest/gtest.h>

#include "core/arena.hpp"

namespace pipefill {
namespace {

constexpr uintptr_t kBase = 0x100000;

TEST(Arena, FirstFitAlignedAndAccounted) {
  ArenaAllocator a(kBase, 4096);
  uintptr_t x = 0, y = 0;
  ASSERT_TRUE(a.allocate(100, 256, &x));
  EXPECT_EQ(x, kBase);
  ASSERT_TRUE(a.allocate(100, 256, &y));
  EXPECT_EQ(y, kBase + 256);  // 100 bytes + padding to the next 256 boundary
  EXPECT_EQ(a.used_bytes(), 100u + 256u);
  EXPECT_EQ(a.free_bytes(), 4096u - 356u);
  EXPECT_EQ(a.live_blocks(), 2u);
}

TEST(Arena, RefusesWhatDoesNotFitAndKeepsOthers) {
  ArenaAllocator a(kBase, 1000);
  uintptr_t x = 0, y = 0;
  ASSERT_TRUE(a.allocate(600, 8, &x));
  EXPECT_FALSE(a.allocate(600, 8, &y));
  EXPECT_EQ(a.used_bytes(), 600u);
  EXPECT_EQ(a.largest_free_block(), 400u);
}

TEST(Arena, ReleaseCoalescesNeighbours) {
  ArenaAllocator a(kBase, 3000);
  uintptr_t b[3];
  for (auto& p : b) ASSERT_TRUE(a.allocate(1000, 8, &p));
  EXPECT_EQ(a.free_bytes(), 0u);
  ASSERT_TRUE(a.release(b[0]));
  ASSERT_TRUE(a.release(b[2]));
  EXPECT_EQ(a.largest_free_block(), 1000u);
  ASSERT_TRUE(a.release(b[1]));
  EXPECT_EQ(a.largest_free_block(), 3000u);
  EXPECT_EQ(a.used_bytes(), 0u);
  uintptr_t all = 0;
  EXPECT_TRUE(a.allocate(3000, 8, &all));
  EXPECT_EQ(all, kBase);
}

TEST(Arena, DoubleOrUnknownReleaseIsRefused) {
  ArenaAllocator a(kBase, 1000);
  uintptr_t x = 0;
  ASSERT_TRUE(a.allocate(10, 8, &x));
  EXPECT_TRUE(a.release(x));
  EXPECT_FALSE(a.release(x));
  EXPECT_FALSE(a.release(kBase + 3));
  EXPECT_EQ(a.used_bytes(), 0u);
}

TEST(Arena, BadAlignmentIsRefused) {
  ArenaAllocator a(kBase, 1000);
  uintptr_t x = 0;
  EXPECT_FALSE(a.allocate(10, 24, &x));
}

}  // namespace
}  // namespace pipefill
