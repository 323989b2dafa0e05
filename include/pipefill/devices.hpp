// PipeFill C++ layer, part 2: the main-job side of the simulated device (pfSim*) and of the
// real-time host device (pfHost*), throwing pipefill::Error like pipefill.hpp (which includes this
// file; either may be included first). C++17.
//
// The fill-launch helpers (pfSimLaunchTicketKernel[Ex], pfSimLaunchOpaque[Ex],
// pfHostLaunchTicketKernel, pfHostLaunchOpaque) are called from a job's launch callback, a C
// function that must return a pfResult_t and never throw: call them directly there (or wrap the
// callback's body in pipefill::to_result).
#ifndef PIPEFILL_DEVICES_HPP_
#define PIPEFILL_DEVICES_HPP_

#include <utility>

#include "pipefill/pipefill.hpp"

namespace pipefill {

// A simulated event (pfSimEvent_t) of a world: a communication edge between streams, also across
// devices. Destroyed with the object (waits already enqueued keep their record).
class SimEvent {
 public:
  explicit SimEvent(const SimWorld& world) { check(pfSimEventCreate(world.get(), &event_)); }
  ~SimEvent() {
    if (event_ != nullptr) detail::record_destructor_error(pfSimEventDestroy(event_));
  }
  SimEvent(SimEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  SimEvent& operator=(SimEvent&& other) noexcept {
    if (this != &other) {
      if (event_ != nullptr) detail::record_destructor_error(pfSimEventDestroy(event_));
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  SimEvent(const SimEvent&) = delete;
  SimEvent& operator=(const SimEvent&) = delete;

  pfSimEvent_t get() const noexcept { return event_; }
  void record(void* stream) { check(pfSimEventRecord(event_, stream)); }
  // Completion time of the latest record (negative while not completed).
  double time() const {
    double t = 0.0;
    check(pfSimEventTime(event_, &t));
    return t;
  }

 private:
  pfSimEvent_t event_ = nullptr;
};

namespace sim_device {

// A main-job kernel of min(sm_count, the device's SMs) blocks of duration_us each.
inline void launch_kernel(void* stream, double duration_us, int sm_count) {
  check(pfSimLaunchKernel(stream, duration_us, sm_count));
}
// A main-job kernel of `blocks` blocks of block_us each, in waves when blocks > SMs.
inline void launch_kernel_blocks(void* stream, int blocks, double block_us) {
  check(pfSimLaunchKernelBlocks(stream, blocks, block_us));
}
// Occupies the stream for duration_us without SMs (a host delay, a copy).
inline void stream_delay(void* stream, double duration_us) {
  check(pfSimStreamDelay(stream, duration_us));
}
// The stream waits for the event's latest record plus latency_us, keeping a communication kernel
// of sm_count SMs resident meanwhile (pfSimStreamWaitEvent).
inline void wait_event(void* stream, const SimEvent& event, double latency_us = 0.0,
                       int sm_count = 0) {
  check(pfSimStreamWaitEvent(stream, event.get(), latency_us, sm_count));
}
// The same with a fixed latency and a transfer slowed by fill load (pfSimStreamWaitEventTransfer).
inline void wait_event_transfer(void* stream, const SimEvent& event, double latency_us,
                                double transfer_us, int sm_count) {
  check(pfSimStreamWaitEventTransfer(stream, event.get(), latency_us, transfer_us, sm_count));
}
// A stream of SimWorld::create_stream (enqueued work still runs; the handle is invalid after).
inline void destroy_stream(void* stream) { check(pfSimStreamDestroy(stream)); }

}  // namespace sim_device

namespace host_device {

// A main-job operation: occupies the host-backend stream for duration_us of real time.
inline void stream_delay(void* stream, double duration_us) {
  check(pfHostStreamDelay(stream, duration_us));
}
// Runs fn(user) on the stream's thread when it reaches the stream head (like cudaLaunchHostFunc).
inline void launch_host_func(void* stream, pfHostFn fn, void* user) {
  check(pfHostLaunchHostFunc(stream, fn, user));
}
// Blocks until the operations enqueued on the stream before the call have executed.
inline void stream_synchronize(void* stream) { check(pfHostStreamSynchronize(stream)); }
// The host device's clock (µs since the device was made) of the device owning `stream`.
inline double now(void* stream) {
  double t = 0.0;
  check(pfHostNow(stream, &t));
  return t;
}

}  // namespace host_device
}  // namespace pipefill

#endif  // PIPEFILL_DEVICES_HPP_
