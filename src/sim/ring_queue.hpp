// A small growable ring buffer: the FIFO of a simulated stream's operations, which does not
// allocate in steady state (capacity doubles when full and is kept).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace pipefill::sim {

template <typename T>
class RingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return slots_[head_]; }
  const T& front() const { return slots_[head_]; }
  // The i-th element from the front (0 = front).
  T& at(size_t i) { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  void push_back(T value) {
    if (size_ == slots_.size()) grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = std::move(value);
    ++size_;
  }
  void pop_front() {
    slots_[head_] = T{};
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }

 private:
  void grow() {
    std::vector<T> bigger(std::max<size_t>(8, slots_.size() * 2));
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(slots_[(head_ + i) & (slots_.size() - 1)]);
    slots_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<T> slots_;  // capacity is always a power of two (or zero)
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace pipefill::sim
