// The slice protocol of include/pipefill/device.cuh (claim_item_with), exercised on the CPU:
// host threads stand in for persistent blocks, std::atomic_ref for atomicAdd. The GPU tests check
// the same properties on a device; these run everywhere.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "pipefill/device.cuh"

namespace {

using pipefill::device::claim_item_with;
using pipefill::device::kStopItem;

uint64_t atomic_add_one(uint64_t* word) { return std::atomic_ref<uint64_t>(*word).fetch_add(1); }

struct Words {
  alignas(64) uint64_t gate = 0;
  alignas(64) uint64_t cursor = 0;
  alignas(64) uint64_t budget = 0;
};

pfSliceDesc_t make_slice(Words& w, uint64_t bubble, uint64_t max_items, uint64_t total) {
  pfSliceDesc_t s{};
  s.bubble_id = bubble;
  s.max_items = max_items;
  s.total_items = total;
  s.max_blocks = 4;
  s.gate = &w.gate;
  s.cursor = &w.cursor;
  s.budget_counter = &w.budget;
  return s;
}

TEST(ItemProtocol, ClaimsInCursorOrderUntilTheBudgetIsSpent) {
  Words w;
  const auto s = make_slice(w, 1, 3, 10);
  EXPECT_EQ(claim_item_with(s, atomic_add_one), 0u);
  EXPECT_EQ(claim_item_with(s, atomic_add_one), 1u);
  EXPECT_EQ(claim_item_with(s, atomic_add_one), 2u);
  EXPECT_EQ(claim_item_with(s, atomic_add_one), kStopItem);
  EXPECT_EQ(w.cursor, 3u);  // the failing ticket did not move the cursor
  EXPECT_EQ(w.budget, 4u);
}

TEST(ItemProtocol, StopsAtTotalItems) {
  Words w;
  w.cursor = 9;
  const auto s = make_slice(w, 1, 100, 10);
  EXPECT_EQ(claim_item_with(s, atomic_add_one), 9u);
  EXPECT_EQ(claim_item_with(s, atomic_add_one), kStopItem);
  EXPECT_EQ(w.cursor, 11u);  // the failing claim moved it past the end once
}

TEST(ItemProtocol, ClosedGateTouchesNothing) {
  Words w;
  w.gate = 5;
  for (uint64_t bubble : {1u, 4u, 5u}) {
    EXPECT_EQ(claim_item_with(make_slice(w, bubble, 10, 10), atomic_add_one), kStopItem) << bubble;
  }
  EXPECT_EQ(w.cursor, 0u);
  EXPECT_EQ(w.budget, 0u);
  EXPECT_EQ(claim_item_with(make_slice(w, 6, 10, 10), atomic_add_one), 0u);  // next bubble is open
}

TEST(ItemProtocol, EmptySliceTouchesNoWord) {
  pfSliceDesc_t s{};  // null words: must not be dereferenced
  s.max_items = 0;
  EXPECT_EQ(claim_item_with(s, atomic_add_one), kStopItem);
}

// Several "blocks" (threads) per slice, several bubbles whose gates close while they work, some
// slices budget-capped: every item runs exactly once and the job finishes.
TEST(ItemProtocol, ExactlyOnceAcrossBubblesWithConcurrentBlocks) {
  constexpr uint64_t kTotal = 3000;
  constexpr int kBlocks = 6;
  Words w;
  std::vector<std::atomic<uint32_t>> runs(kTotal);
  uint64_t bubble = 0;
  for (; bubble < 1000 && std::atomic_ref<uint64_t>(w.cursor).load() < kTotal; ++bubble) {
    w.budget = 0;
    const uint64_t id = bubble + 1;
    const auto s = make_slice(w, id, bubble % 3 == 1 ? 200 : kTotal, kTotal);
    std::vector<std::thread> blocks;
    for (int b = 0; b < kBlocks; ++b) {
      blocks.emplace_back([&] {
        for (;;) {
          const uint64_t item = claim_item_with(s, atomic_add_one);
          if (item == kStopItem) break;
          runs[item].fetch_add(1);
          // Sleeping items leave the CPU to the "main stream" thread that closes the gate.
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      });
    }
    // The "main stream" closes the gate while the blocks work.
    std::this_thread::sleep_for(std::chrono::microseconds(200 + 100 * (bubble % 4)));
    std::atomic_ref<uint64_t>(w.gate).store(id);
    for (auto& t : blocks) t.join();
  }
  ASSERT_GE(std::atomic_ref<uint64_t>(w.cursor).load(), kTotal) << "did not finish in " << bubble << " bubbles";
  EXPECT_GE(bubble, 3u) << "gates never closed mid-job: the test did not exercise resumption";
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(runs[i].load(), 1u) << "item " << i;
}

}  // namespace
