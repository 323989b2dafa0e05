/*
 * The claim protocol of ticket fill kernels, in one CUDA-free header shared by every place that
 * runs it: the GPU item loop (pipefill/device.cuh), the simulated device (src/sim), the
 * real-time host device (src/host) and the tests. The CPU build therefore tests the very code
 * a GPU block runs, with real threads standing in for blocks.
 *
 * A ticket fill kernel is a set of persistent blocks. Before every item a block makes one claim
 * (on the GPU, thread 0 makes it for the whole block), following the slice protocol of
 * pfSliceDesc_t (pipefill.h):
 *
 *   stop when   slice.max_items == 0                              (an empty slice: touch nothing)
 *          or   *gate >= bubble_id                                (the bubble has ended)
 *          or   fetch_add(budget_counter, 1) >= max_items         (the slice's budget is spent)
 *          or   the item fetch_add(cursor, 1) returned >= total_items (the job has no items left)
 *
 * Exactly once: the gate and the budget are checked before the cursor moves, the cursor only
 * moves by atomic increments, and a claimed item is always run. Overrun past the bubble end is
 * one item per block: a block checks the gate again before its next item. A failing claim may
 * move the cursor past total_items (readers clamp it to the item count); the budget counter
 * counts every claim that passed the gate check.
 *
 * The memory operations come from an atomics policy, an object with two member functions:
 *
 *   uint64_t load(const volatile uint64_t* word)   reads a word another agent writes (the gate)
 *   uint64_t fetch_add_one(uint64_t* word)         atomically adds 1, returns the old value
 *
 * HostAtomics (below) is the CPU policy (sequentially consistent atomics on 8-byte aligned words);
 * the GPU policy lives in device.cuh (volatile load, atomicAdd).
 *
 * Language: C++17 (host compilers) or CUDA C++17. The CPU policy uses the GCC/Clang __atomic
 * builtins (what std::atomic_ref compiles to there), so it needs no C++20; another compiler falls
 * back to C++20's std::atomic_ref.
 */
#ifndef PIPEFILL_ITEM_PROTOCOL_HPP_
#define PIPEFILL_ITEM_PROTOCOL_HPP_

#if !defined(__cplusplus) || (__cplusplus < 201703L && !defined(__CUDACC__))
#error "pipefill/item_protocol.hpp needs C++17 or later (-std=c++17)"
#endif

#include <stdint.h>

#include "pipefill/pipefill.h"

#if !defined(__CUDA_ARCH__) && !defined(__GNUC__)
#include <atomic> /* std::atomic_ref (C++20) where the __atomic builtins are missing */
#endif

#if defined(__CUDACC__)
#define PF_PROTOCOL_FN __host__ __device__ inline
#else
#define PF_PROTOCOL_FN inline
#endif

namespace pipefill {
namespace protocol {

/* The value a claim returns when the block must stop. */
constexpr uint64_t kStopItem = ~uint64_t{0};

/* Whether the bubble the slice belongs to has ended (the gate holds the last closed id). */
#if defined(__CUDACC__)
#pragma nv_exec_check_disable /* the policy may be device-only (GPU) or host-only (CPU) */
#endif
template <typename Atomics>
PF_PROTOCOL_FN bool gate_closed(const pfSliceDesc_t& slice, Atomics&& atomics) {
  return atomics.load(slice.gate) >= slice.bubble_id;
}

/* One claim: the next item for the calling block, or kStopItem. */
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename Atomics>
PF_PROTOCOL_FN uint64_t claim_item(const pfSliceDesc_t& slice, Atomics&& atomics) {
  if (slice.max_items == 0) return kStopItem; /* module warm-up: the words may be NULL */
  if (atomics.load(slice.gate) >= slice.bubble_id) return kStopItem;
  if (atomics.fetch_add_one(slice.budget_counter) >= slice.max_items) return kStopItem;
  const uint64_t item = atomics.fetch_add_one(slice.cursor);
  if (item >= slice.total_items) return kStopItem;
  return item;
}

/* Streaming bound (pfJobSetAvailable): items >= `available` must not be claimed yet. The bound
 * is kept on the host and enforced through the slice budget, not by the claim itself: a claim
 * stopped by the budget leaves the cursor where it was, whereas a claim stopped at an item bound
 * has already moved the cursor past that item (above), which would lose it. So the host plans a
 * slice with at most claimable_items(...) items, where `granted` is an upper bound of the cursor
 * once every slice in flight ended (items completed + budgets of the slices in flight): the
 * cursor then never passes the bound, every item below it is claimed exactly once and in order,
 * whether the bound was raised between slices, a gate closed mid-slice or the job ran dry (0
 * claimable: no slice; a dry job is not failed). The kernels run claim_item unchanged. */
PF_PROTOCOL_FN uint64_t claimable_items(uint64_t item_count, uint64_t available,
                                        uint64_t granted) {
  const uint64_t end = available < item_count ? available : item_count;
  return granted >= end ? 0 : end - granted;
}

#if !defined(__CUDA_ARCH__)
/* The CPU policy: sequentially consistent atomic operations on 8-byte aligned words. The gate is
 * written by another thread (a stream's word write) and read by every block. */
struct HostAtomics {
  uint64_t load(const volatile uint64_t* word) const {
#if defined(__GNUC__) /* GCC and Clang: the builtins std::atomic_ref<uint64_t> is made of */
    return __atomic_load_n(const_cast<const uint64_t*>(word), __ATOMIC_SEQ_CST);
#else
    return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load();
#endif
  }
  uint64_t fetch_add_one(uint64_t* word) const {
#if defined(__GNUC__)
    return __atomic_fetch_add(word, uint64_t{1}, __ATOMIC_SEQ_CST);
#else
    return std::atomic_ref<uint64_t>(*word).fetch_add(1);
#endif
  }
};

/* The block loop on the CPU: claims and runs items until a claim fails; returns the number of
 * items this block ran. `body(item)` does the item's work. */
template <typename Body>
inline uint64_t run_block(const pfSliceDesc_t& slice, Body&& body) {
  uint64_t done = 0;
  for (;;) {
    const uint64_t item = claim_item(slice, HostAtomics{});
    if (item == kStopItem) return done;
    body(item);
    ++done;
  }
}
#endif /* !__CUDA_ARCH__ */

} /* namespace protocol */
} /* namespace pipefill */

#endif /* PIPEFILL_ITEM_PROTOCOL_HPP_ */
