#include "core/arena.hpp"

#include <algorithm>

namespace pipefill {

void ArenaAllocator::reset(uintptr_t base, size_t bytes) {
  base_ = base;
  capacity_ = bytes;
  used_ = 0;
  free_.clear();
  live_.clear();
  if (bytes > 0) free_[base] = bytes;
}

bool ArenaAllocator::allocate(size_t bytes, size_t alignment, uintptr_t* address) {
  if (alignment == 0) alignment = kDefaultAlignment;
  if ((alignment & (alignment - 1)) != 0) return false;
  if (bytes == 0) {
    *address = base_;
    return true;
  }
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uintptr_t start = it->first;
    const size_t size = it->second;
    const uintptr_t aligned = (start + alignment - 1) & ~(static_cast<uintptr_t>(alignment) - 1);
    const size_t padding = aligned - start;
    if (padding > size || size - padding < bytes) continue;
    const size_t taken = padding + bytes;
    free_.erase(it);
    if (taken < size) free_[start + taken] = size - taken;
    live_[aligned] = Live{start, taken};
    used_ += taken;
    *address = aligned;
    return true;
  }
  return false;
}

bool ArenaAllocator::release(uintptr_t address) {
  const auto it = live_.find(address);
  if (it == live_.end()) return false;
  uintptr_t start = it->second.block_start;
  size_t size = it->second.block_size;
  used_ -= size;
  live_.erase(it);
  // Coalesce with the following and the preceding free block.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return true;
    }
  }
  free_[start] = size;
  return true;
}

size_t ArenaAllocator::largest_free_block() const {
  size_t largest = 0;
  for (const auto& [start, size] : free_) largest = std::max(largest, size);
  return largest;
}

}  // namespace pipefill
