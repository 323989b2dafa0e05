// The claim protocol of ticket fill kernels (include/pipefill/item_protocol.hpp), the code the
// GPU item loop of device.cuh, the simulator and the host device all run, exercised on the CPU
// with real threads standing in for blocks (runs under TSan: label "host").
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "pipefill/item_protocol.hpp"

namespace {

using pipefill::protocol::claim_item;
using pipefill::protocol::gate_closed;
using pipefill::protocol::HostAtomics;
using pipefill::protocol::kStopItem;
using pipefill::protocol::run_block;

uint64_t load(const uint64_t& word) { return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(); }
void store(uint64_t& word, uint64_t value) { std::atomic_ref<uint64_t>(word).store(value); }

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
  EXPECT_EQ(claim_item(s, HostAtomics{}), 0u);
  EXPECT_EQ(claim_item(s, HostAtomics{}), 1u);
  EXPECT_EQ(claim_item(s, HostAtomics{}), 2u);
  EXPECT_EQ(claim_item(s, HostAtomics{}), kStopItem);
  EXPECT_EQ(w.cursor, 3u);  // the failing ticket did not move the cursor
  EXPECT_EQ(w.budget, 4u);
}

TEST(ItemProtocol, StopsAtTotalItems) {
  Words w;
  w.cursor = 9;
  const auto s = make_slice(w, 1, 100, 10);
  EXPECT_EQ(claim_item(s, HostAtomics{}), 9u);
  EXPECT_EQ(claim_item(s, HostAtomics{}), kStopItem);
  EXPECT_EQ(w.cursor, 11u);  // the failing claim moved it past the end once (readers clamp)
}

TEST(ItemProtocol, ClosedGateTouchesNothing) {
  Words w;
  w.gate = 5;
  for (uint64_t bubble : {1u, 4u, 5u}) {
    const auto s = make_slice(w, bubble, 10, 10);
    EXPECT_TRUE(gate_closed(s, HostAtomics{})) << bubble;
    EXPECT_EQ(claim_item(s, HostAtomics{}), kStopItem) << bubble;
  }
  EXPECT_EQ(w.cursor, 0u);
  EXPECT_EQ(w.budget, 0u);
  const auto next = make_slice(w, 6, 10, 10);  // the next bubble is open
  EXPECT_FALSE(gate_closed(next, HostAtomics{}));
  EXPECT_EQ(claim_item(next, HostAtomics{}), 0u);
}

TEST(ItemProtocol, EmptySliceTouchesNoWord) {
  pfSliceDesc_t s{};  // null words: must not be dereferenced
  s.max_items = 0;
  EXPECT_EQ(claim_item(s, HostAtomics{}), kStopItem);
}

// Eight blocks race for a budget of 100 items: exactly 100 are claimed, each once.
TEST(ItemProtocol, ConcurrentBlocksClaimExactlyTheBudget) {
  constexpr uint64_t kTotal = 100000;
  Words w;
  const auto s = make_slice(w, 1, 100, kTotal);
  std::vector<std::atomic<uint32_t>> runs(kTotal);
  std::vector<std::thread> blocks;
  for (int b = 0; b < 8; ++b) {
    blocks.emplace_back([&] { run_block(s, [&](uint64_t item) { runs[item].fetch_add(1); }); });
  }
  for (auto& t : blocks) t.join();
  uint64_t claimed = 0;
  for (uint64_t i = 0; i < kTotal; ++i) {
    ASSERT_LE(runs[i].load(), 1u) << "item " << i;
    claimed += runs[i].load();
  }
  EXPECT_EQ(claimed, 100u);
  EXPECT_EQ(load(w.cursor), 100u);  // a budget failure never moves the cursor
  EXPECT_EQ(load(w.budget), 108u);  // each block's last claim failed on the budget
}

// Blocks drain a small job concurrently: every item runs exactly once, none beyond the end.
TEST(ItemProtocol, ConcurrentBlocksRunEveryItemOnceUpToTheEnd) {
  constexpr uint64_t kTotal = 5000;
  Words w;
  const auto s = make_slice(w, 1, ~uint64_t{0}, kTotal);
  std::vector<std::atomic<uint32_t>> runs(kTotal);
  std::vector<std::thread> blocks;
  std::atomic<uint64_t> done{0};
  for (int b = 0; b < 6; ++b) {
    blocks.emplace_back([&] { done += run_block(s, [&](uint64_t item) { runs[item].fetch_add(1); }); });
  }
  for (auto& t : blocks) t.join();
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(runs[i].load(), 1u) << "item " << i;
  EXPECT_EQ(done.load(), kTotal);
  EXPECT_EQ(load(w.cursor), kTotal + 6);  // each block's failing claim moved it once
}

// Several blocks per slice, one bubble after another; a "main stream" thread closes each gate
// once 100 items of the bubble were claimed (items past the 100th wait for the close, like
// items still running when a bubble ends, so every close lands mid-job whatever the machine's
// scheduling). Every item runs exactly once, the job finishes, and after each close at most one
// claim per block still succeeds (the overrun bound).
TEST(ItemProtocol, ExactlyOnceAcrossBubblesWithConcurrentBlocks) {
  constexpr uint64_t kTotal = 3000;
  constexpr uint64_t kPerBubble = 100;
  constexpr int kBlocks = 6;
  Words w;
  std::vector<std::atomic<uint32_t>> runs(kTotal);
  uint64_t bubble = 0;
  uint64_t mid_job_closes = 0;
  for (; bubble < 1000 && load(w.cursor) < kTotal; ++bubble) {
    store(w.budget, 0);
    const uint64_t id = bubble + 1;
    const auto s = make_slice(w, id, bubble % 3 == 1 ? 2 * kPerBubble : kTotal, kTotal);
    std::atomic<uint64_t> claims{0};
    std::vector<std::thread> blocks;
    for (int b = 0; b < kBlocks; ++b) {
      blocks.emplace_back([&] {
        run_block(s, [&](uint64_t item) {
          const uint64_t n = claims.fetch_add(1);
          runs[item].fetch_add(1);
          if (n >= kPerBubble) {
            while (load(w.gate) < id) std::this_thread::yield();  // running when the gate closes
          }
        });
      });
    }
    // The "main stream" closes the gate once 100 items were claimed (or the job ran out).
    while (claims.load() < kPerBubble && load(w.cursor) < kTotal) std::this_thread::yield();
    store(w.gate, id);
    const uint64_t claims_at_close = claims.load();
    for (auto& t : blocks) t.join();
    // Claims that passed the gate check before the close and were counted after it: at most
    // one in progress per block.
    EXPECT_LE(claims.load() - claims_at_close, static_cast<uint64_t>(kBlocks)) << "bubble " << id;
    if (load(w.cursor) < kTotal) ++mid_job_closes;
  }
  ASSERT_GE(load(w.cursor), kTotal) << "did not finish in " << bubble << " bubbles";
  // Each bubble claims between 100 and 100 + 6 items: at least 28 bubbles before the end.
  EXPECT_GE(mid_job_closes, kTotal / (kPerBubble + kBlocks) - 1);
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(runs[i].load(), 1u) << "item " << i;
}

}  // namespace
