// The inline launch mode's seam between the user-thread bubble tracker and the executor side
// (docs/architecture.md, "Launch modes"). With one hardware queue for every stream (CUDA with
// CUDA_DEVICE_MAX_CONNECTIONS=1 in grid-cap mode) a fill slice enqueued after the main stream's
// wait and gate close starts only once the gate is closed: the slices of a bubble must be
// enqueued by pfBubbleBegin itself, before it returns. Their read-backs (cursor copy + end
// record, the slice's *tail*) are enqueued by pfBubbleEnd after the gate write: in one in-order
// queue a read-back ahead of the main stream's wait would hold the wait until the slice's kernel
// had run out its budget.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/config.hpp"
#include "core/message_ring.hpp"
#include "device/device.hpp"

namespace pipefill::core {

// The read-back of one slice still to be enqueued after the gate write.
struct SliceTail {
  int stream = 0;                  // index into FillResources::fill_streams
  const uint64_t* cursor = nullptr;
  size_t slot = 0;                 // slice slot: host word and end event
  uint64_t sequence = 0;           // the slice's SliceRecord::sequence
  void* observer_end_call = nullptr;  // the slice observer's end call (SliceObserverCall), if any
};

// The tails of the open bubble (at most one slice per fill stream), kept by the tracker between
// begin and end. Fixed size: pfBubbleBegin/End allocate nothing for it.
struct SliceTails {
  uint64_t bubble_id = 0;
  size_t count = 0;
  std::array<SliceTail, kMaxFillStreams> items{};
};

class InlineFill {
 public:
  virtual ~InlineFill() = default;
  // pfBubbleBegin, user thread, after the begin event was recorded and before the Begin message
  // is pushed: makes the bubble's record, enqueues its slices from the class's prepared plan
  // (or plans them on the spot when there is none) and leaves their tails in *tails. Takes the
  // state lock; never fails the call (problems become the runtime's async error). Returns false
  // when it left the bubble to the executor instead (the state lock was held by the executor's
  // harvest and pfBubbleBegin must not wait for it): the Begin message then says `deferred`, and
  // the executor makes the record and fills the bubble as in the executor launch mode.
  virtual bool begin_bubble(const BubbleMessage& begin, SliceTails* tails) = 0;
  // pfBubbleEnd (or an abandoned bubble), user thread, after the gate write and before the End
  // message: enqueues the tails. No lock unless one fails (the slice is then quarantined).
  virtual void end_bubble(SliceTails* tails) = 0;
};

}  // namespace pipefill::core
