// The host transport: every stage of the pipeline on its own real-time host device
// (pfBackendHost, docs/host-device.md), all in this process, one host thread per stage.
//
// Per stage: one runtime on its own host device and one main stream (pfStreamCreateHighPriority,
// a thread). Compute (load, forward, backward, optimizer) is pfHostStreamDelay of the model's
// kernel time; a send is a host function that posts the message (its time) on a board shared by
// the stages; a receive is posted by Recv* and waited for by WaitComm: a host function on the
// main stream that blocks until the message was posted and the p2p time has passed since, so
// the bubble PipeFill fills is the real wait of the stage's main stream. ReduceGradients waits
// for every stage's arrival, then the all-reduce time. Fill jobs are the example jobs on the host
// backend: their items run on the device's SM threads (sleeping out the item's cost).
//
// It also measures where each bubble's time goes (host_timeline.hpp): a host function behind
// each pfBubbleBegin / pfBubbleEnd, the job's launch callback wrapped (the executor's launch
// time), the runtime's slice observer (the fill stream's start and stop) and the fill job's item
// observer (every item's completion).
#pragma once

#include <memory>

#include "host_timeline.hpp"
#include "transport.hpp"

namespace engine {

class HostTransportBase : public Transport {
 public:
  // The timeline of the run (valid after open() until the transport is destroyed).
  virtual const HostTimeline* timeline() const = 0;
  // Bubbles of stage `stage` begun so far (the runtime's last bubble id).
  virtual uint64_t bubbles_begun(int stage) const = 0;
};

std::unique_ptr<HostTransportBase> make_host_transport_concrete();

}  // namespace engine
