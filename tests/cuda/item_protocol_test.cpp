// device.cuh's claim helpers stay source-compatible with fill kernels written against earlier
// versions (claim_item_with(slice, add), kStopItem) and make exactly the claims of the shared
// protocol (pipefill/item_protocol.hpp, tested with real threads in tests/host/). Built only
// with the CUDA toolkit (device.cuh includes cuda_runtime.h); runs on the CPU.
#include <gtest/gtest.h>

#include <atomic>

#include "pipefill/device.cuh"

namespace {

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

TEST(DeviceCuhCompat, ClaimItemWithMakesTheSharedProtocolsClaims) {
  static_assert(pipefill::device::kStopItem == pipefill::protocol::kStopItem);
  // The same sequence of situations through both entry points, on separate words.
  Words a, b;
  a.gate = b.gate = 2;
  const uint64_t bubbles[] = {1, 2, 3, 3, 3, 3, 4, 4, 4};
  for (const uint64_t bubble : bubbles) {
    const auto sa = make_slice(a, bubble, 10, 5);
    const auto sb = make_slice(b, bubble, 10, 5);
    const uint64_t via_device = pipefill::device::claim_item_with(sa, atomic_add_one);
    const uint64_t via_protocol =
        pipefill::protocol::claim_item(sb, pipefill::protocol::HostAtomics{});
    EXPECT_EQ(via_device, via_protocol) << "bubble " << bubble;
  }
  EXPECT_EQ(a.cursor, b.cursor);
  EXPECT_EQ(a.budget, b.budget);
  // Bubbles 1 and 2 find the gate closed; the 7 claims of bubbles 3 and 4 pass it: items 0-4,
  // then two claims that fail past the end.
  EXPECT_EQ(a.budget, 7u);
  EXPECT_EQ(a.cursor, 7u);
  // A lambda `add` (the form fill kernels use) compiles and claims too.
  Words c;
  const auto sc = make_slice(c, 1, 10, 10);
  EXPECT_EQ(pipefill::device::claim_item_with(sc, [](uint64_t* w) { return atomic_add_one(w); }),
            0u);
}

}  // namespace
