// Host-side sub-allocator over the fill arena (one device allocation made at runtime
// creation). Only bookkeeping: handing out a region never touches the device, so it is safe
// anywhere, but jobs still only allocate from setup (outside bubbles) by contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace pipefill {

class ArenaAllocator {
 public:
  static constexpr size_t kDefaultAlignment = 256;

  ArenaAllocator() = default;
  ArenaAllocator(uintptr_t base, size_t bytes) { reset(base, bytes); }

  void reset(uintptr_t base, size_t bytes);

  // First fit of `bytes` aligned to `alignment` (a power of two; 0 = default). Returns false
  // when no free block can hold it. A zero-byte request succeeds with a non-owning address.
  bool allocate(size_t bytes, size_t alignment, uintptr_t* address);
  // Releases a block returned by allocate; false when `address` is not a live block.
  bool release(uintptr_t address);

  size_t capacity() const { return capacity_; }
  size_t used_bytes() const { return used_; }
  size_t free_bytes() const { return capacity_ - used_; }
  size_t largest_free_block() const;
  size_t live_blocks() const { return live_.size(); }
  uintptr_t base() const { return base_; }

 private:
  uintptr_t base_ = 0;
  size_t capacity_ = 0;
  size_t used_ = 0;
  std::map<uintptr_t, size_t> free_;  // start -> size, coalesced
  struct Live {
    uintptr_t block_start;  // start of the carved block (before alignment padding)
    size_t block_size;
  };
  std::map<uintptr_t, Live> live_;    // returned address -> carved block
};

}  // namespace pipefill
